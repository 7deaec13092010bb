"""The Ingestor: runs the source during each granted term, inside the lease's cancel scope.

Each term runs in ``trio.CancelScope(deadline=ingest_deadline)``; every renewal moves
``scope.deadline`` forward. If renewals stop, the scope fires by itself before the lease can expire
in Redis: no message is needed for ingestion to stop. A graceful revoke (shutdown) stops reading the
source but lets the in-flight commit finish; any other revoke cancels at once.

A sink that keeps its own cursor (PostgreSQL) is opened first in each term; the Elector is told
the cursor the term resumes from there (:class:`~actors.messages.TermResumed`), and a sink that
refuses the job to this node for good ends the term as ``sink-refused``.

A source's own Redis or sink call that does not answer (``RedisUnavailable``,
``SinkUnavailable``) ends the term as ``commit-unknown``, a fenced write of its own that is
refused (:class:`~actors.source.TermFenced`) as ``fenced``, and any other exception (a request, a
decode, a delivery that raised) as ``term-failed``, logged with its traceback: a term's failure is
never the node's, nor its other jobs'.

Each batch is committed through the CursorWriter with the term's fencing token, one at a time, so the
cursor the next commit continues from is always the one Redis confirmed. A batch larger than the
:class:`~actors.commit_pace.CommitPace` allows goes in consecutive parts, each its own commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from actors.commit_pace import CommitPace
from actors.cursor_writer import FENCING_REASONS
from actors.lease_store import RedisUnavailable
from actors.messages import (
    CommitCursor,
    CommitRefused,
    CommitUnknown,
    CursorCommitted,
    ElectorInput,
    IngestorInput,
    LeaseExtended,
    LeaseGranted,
    LeaseRevoked,
    OpenTerm,
    SinkOpened,
    SinkRefused,
    TermEnded,
    TermResumed,
    WriterInput,
    WriterOutcome,
)
from actors.sink import SinkUnavailable
from actors.source import (
    Batch,
    Source,
    SourceFatalError,
    SourceHeldOff,
    TermContext,
    TermFenced,
    current_term,
)

# How a term that raised ends, by what it raised (the first kind found among its failures).
_ENDINGS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (TermFenced, "fenced"),
    (SourceFatalError, "source-fatal"),
    (SourceHeldOff, "source-held-off"),
    ((RedisUnavailable, SinkUnavailable), "commit-unknown"),
)


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions an exception (group) is made of, groups opened, in order."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


@attrs.define
class _Term:
    grant: LeaseGranted
    scope: trio.CancelScope
    stopping: bool = False
    revoked: bool = False
    reading: trio.CancelScope | None = None
    commit_in_flight: bool = False

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[trio.CancelScope]:
        """A scope for waiting on the source (never a commit): a graceful stop cancels it."""
        with trio.CancelScope() as scope:
            self.reading = scope
            if self.stopping:
                scope.cancel("graceful stop")
            try:
                yield scope
            finally:
                self.reading = None

    def stop_gracefully(self) -> None:
        self.stopping = self.revoked = True
        if self.reading is not None:
            self.reading.cancel("graceful stop")

    def stop_now(self, reason: str) -> None:
        self.revoked = True
        self.scope.cancel(reason)


@attrs.define
class Ingestor:
    source: Source
    node: str
    control: trio.MemoryReceiveChannel[IngestorInput]
    writer: trio.MemorySendChannel[WriterInput]
    elector: trio.MemorySendChannel[ElectorInput]
    log: Any
    term: _Term | None = None
    commit_drain: float = 1.0  # seconds: the longest wait for an in-flight commit at term end
    # The job's sink keeps its own cursor (PostgreSQL): each term first opens itself there
    # (fence raised, cursor read) and resumes from that cursor, else from ``start_cursor``.
    sink_keeps_cursor: bool = False
    start_cursor: str = "0"
    # How many records a commit carries at most (None: each batch as the source gives it).
    pace: CommitPace | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.control, self.writer, self.elector:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for msg in self.control:
                    term = self.term
                    if isinstance(msg, LeaseGranted):
                        if term is not None:
                            raise RuntimeError("LeaseGranted while a term is still running")
                        self.term = _Term(msg, trio.CancelScope(deadline=msg.ingest_deadline))
                        nursery.start_soon(self._run_term, self.term)
                    elif term is None or term.grant.token != msg.token:
                        continue  # about a term that is already over
                    elif isinstance(msg, LeaseExtended):
                        term.scope.deadline = msg.ingest_deadline
                    elif isinstance(msg, LeaseRevoked):
                        if msg.graceful:
                            term.stop_gracefully()
                        else:
                            term.stop_now(msg.reason)
                nursery.cancel_scope.cancel()

    async def _run_term(self, term: _Term) -> None:
        reason, detail = "revoked", ""
        reply_send, reply_recv = trio.open_memory_channel[WriterOutcome](1)
        with reply_send, reply_recv:
            try:
                with term.scope:
                    reason, detail = await self._ingest(term, reply_send, reply_recv)
            except* Exception as group:
                # (``except*``: a cancellation from outside, beside a failure, goes on as it is)
                reason, detail = self._failed(term, group)
            if term.commit_in_flight:
                # Stopped while the CursorWriter was committing: wait (bounded) for its answer, so
                # that the Elector hands the lease back only once no commit of ours is in flight.
                with trio.move_on_after(self.commit_drain, shield=True):
                    await reply_recv.receive()
                if self.pace is not None and not term.stopping:
                    self.pace.failed()  # cut off mid-commit (not a graceful stop): start small again
        if term.scope.cancelled_caught:
            reason = "revoked" if term.revoked else "deadline"
            if reason == "deadline":
                self.log.warning(
                    "ingestion-stopped-at-deadline",
                    token=term.grant.token,
                    ingest_deadline=round(term.scope.deadline, 3),
                )
        self.term = None
        await self.elector.send(TermEnded(term.grant.token, reason, detail))

    def _failed(self, term: _Term, group: BaseExceptionGroup[Exception]) -> tuple[str, str]:
        """Why a term ends that raised: a source's own Redis or sink I/O that did not answer (its
        effect unknown, as a commit's would be) ``commit-unknown``; a fenced write of its own that
        was refused ``fenced``; a failure retrying cannot fix ``source-fatal``; anything else (a
        request, a decode, a delivery that raised: a bug or input nobody foresaw) ``term-failed``,
        logged with its traceback. The term ends; the node and its other jobs do not."""
        raised = list(leaves(group))
        for kinds, reason in _ENDINGS:
            known = next((exc for exc in raised if isinstance(exc, kinds)), None)
            if known is not None:
                return reason, str(known)
        failure = raised[0]
        error = f"{type(failure).__name__}: {failure}"
        self.log.error("term-failed", token=term.grant.token, error=error, exc_info=failure)
        return "term-failed", error

    async def _ingest(
        self,
        term: _Term,
        reply_send: trio.MemorySendChannel[WriterOutcome],
        reply_recv: trio.MemoryReceiveChannel[WriterOutcome],
    ) -> tuple[str, str]:
        grant = term.grant
        committed = grant.committed_cursor
        cursor = grant.cursor
        # This term task's own context, from its first step: a source's own fenced writes (a
        # check before a "now" start is pinned included) run under the term's token.
        current_term.set(TermContext(self.node, grant.token))
        if self.sink_keeps_cursor:
            opened = await self._commit(term, OpenTerm(grant.token, reply_send), reply_recv)
            if isinstance(opened, SinkRefused):
                return "sink-refused", opened.problem
            if not isinstance(opened, SinkOpened):
                return self._refused(opened)
            committed = opened.cursor
            cursor = committed if committed is not None else self.start_cursor
            await self.elector.send(TermResumed(grant.token, cursor))  # (the grant had no cursor)
            if term.stopping:
                return "revoked", ""
        if committed is None and cursor == "now":
            # Pin "now" once, durably: a leader that died before its first record must not let
            # its successor start at a later "now" and skip what came in between.
            with term.interruptible() as preparing:
                cursor = await self.source.resolve_start(cursor)
            if preparing.cancelled_caught:
                return "revoked", ""
            msg = CommitCursor(grant.token, None, (), reply_send, cursor)
            outcome = await self._commit(term, msg, reply_recv)
            if not isinstance(outcome, CursorCommitted):
                return self._refused(outcome)
            committed = cursor
            if term.stopping:
                return "revoked", ""
        async with self.source.stream(cursor) as batches:
            while True:
                with term.interruptible() as reading:
                    try:
                        batch = await batches.receive()
                    except trio.EndOfChannel:
                        break  # leaves the stream: a source that failed raises from its exit
                if reading.cancelled_caught:
                    return "revoked", ""
                rest: Batch | None = batch
                while rest is not None:
                    part, rest = rest.take(self.pace.limit) if self.pace is not None else (rest, None)
                    msg = CommitCursor(
                        grant.token, committed, part.records, reply_send, part.through, part.watermark
                    )
                    started = trio.current_time()
                    outcome = await self._commit(term, msg, reply_recv)
                    if not isinstance(outcome, CursorCommitted):
                        if isinstance(outcome, CommitUnknown) and self.pace is not None:
                            self.pace.failed()
                        return self._refused(outcome)
                    if self.pace is not None:
                        self.pace.observed(len(part.records), trio.current_time() - started)
                    committed = outcome.cursor
                    if part.committed is not None and rest is None:
                        part.committed.set()  # the source may go on (Batch.committed)
                    if term.stopping:
                        return "revoked", ""
        self.log.info("source-exhausted", token=grant.token, cursor=committed)
        with term.interruptible():  # idle, but a graceful stop must still end the term at once
            await trio.sleep_forever()
        return "revoked", ""

    async def _commit(
        self,
        term: _Term,
        msg: WriterInput,
        reply_recv: trio.MemoryReceiveChannel[WriterOutcome],
    ) -> WriterOutcome:
        await self.writer.send(msg)  # delivered once this returns (unbuffered channel)
        term.commit_in_flight = True
        outcome = await reply_recv.receive()
        term.commit_in_flight = False
        return outcome

    @staticmethod
    def _refused(outcome: WriterOutcome) -> tuple[str, str]:
        """Why a term ends after a commit that did not succeed."""
        if isinstance(outcome, CommitUnknown):
            return "commit-unknown", outcome.error
        if isinstance(outcome, CommitRefused) and outcome.reason in FENCING_REASONS:
            return "fenced", outcome.reason
        assert isinstance(outcome, CommitRefused)
        return "commit-refused", outcome.reason
