"""The CursorWriter: the only actor that writes on the data path.

Every commit reaches it as a :class:`CommitCursor` message carrying the fencing token. It refuses
locally a token it already knows to be stale, then commits through the job's sink
(``actors/sink.py``: the Redis commit script by default, a fenced PostgreSQL transaction with a
Postgres sink), and answers on the message's reply channel. A sink that keeps its own cursor is
first told of each new term (:class:`OpenTerm`: its fence raised, its cursor read; or the term
refused for good, :class:`SinkRefused`, when another election domain owns the job there). When the sink
rejects a token it logs ``fencing-token-rejected`` (with ``sink``) and tells the Elector, which
steps the node down.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from actors.lease_store import CommitRejected, Committed, LeaseStore, RedisUnavailable
from actors.messages import (
    CommitCursor,
    CommitOutcome,
    CommitRefused,
    CommitUnknown,
    CursorCommitted,
    ElectorInput,
    FencingTokenRejected,
    OpenTerm,
    SinkOpened,
    SinkRefused,
    WriterInput,
    WriterOutcome,
)
from actors.observe import NodeObserver
from actors.sink import RedisStreamSink, Sink, SinkUnavailable, TermRefused
from actors.token_memory import TokenMemory

# Rejections that mean "this writer is no longer the leader", as opposed to a bad batch.
FENCING_REASONS = frozenset({"stale-token", "lease-lost"})


@attrs.define
class CursorWriter:
    store: LeaseStore
    node: str
    inbox: trio.MemoryReceiveChannel[WriterInput]
    elector: trio.MemorySendChannel[ElectorInput]
    log: Any
    observer: NodeObserver
    highest_token_seen: int = 0
    # The node's memory of the job (shared with the Elector): the first commit is recorded there,
    # so that a Redis that later forgets the job is known to have lost something.
    memory: TokenMemory | None = None
    # Where the records go (default: the events stream through ``store``).
    sink: Sink | None = None

    def __attrs_post_init__(self) -> None:
        if self.sink is None:
            self.sink = RedisStreamSink(self.store)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.inbox, self.elector:
            task_status.started()
            async for msg in self.inbox:
                outcome: WriterOutcome
                if isinstance(msg, OpenTerm):
                    outcome = await self._open(msg)
                else:
                    outcome = await self._commit(msg)
                try:
                    msg.reply.send_nowait(outcome)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                    pass  # the term that asked is already over; its successor re-reads Redis

    async def _open(self, msg: OpenTerm) -> WriterOutcome:
        """A new term's first step in a sink that keeps its cursor: raise its fence, read it."""
        assert self.sink is not None
        if msg.token < self.highest_token_seen:
            return await self._fenced(msg, "stale-token", self.highest_token_seen, local=True)
        try:
            result = await self.sink.open_term(self.node, msg.token)
        except (SinkUnavailable, RedisUnavailable) as exc:
            self.log.warning("term-open-unknown", token=msg.token, sink=self.sink.name, error=str(exc))
            return CommitUnknown(msg.token, str(exc))
        if isinstance(result, TermRefused):
            return SinkRefused(msg.token, result.problem)  # the job stops here: the Elector says so
        if isinstance(result, CommitRejected):
            self.highest_token_seen = max(self.highest_token_seen, result.current_token)
            return await self._fenced(msg, result.reason, result.current_token, local=False)
        self.highest_token_seen = max(self.highest_token_seen, msg.token)
        self.log.info("sink-term-opened", token=msg.token, sink=self.sink.name, cursor=result.cursor)
        return SinkOpened(msg.token, result.cursor)

    async def _commit(self, msg: CommitCursor) -> CommitOutcome:
        assert self.sink is not None
        if msg.token < self.highest_token_seen:
            return await self._fenced(msg, "stale-token", self.highest_token_seen, local=True)
        started = trio.current_time()
        try:
            result = await self.sink.commit(
                self.node, msg.token, msg.previous_cursor, msg.records, anchor=msg.anchor,
                watermark=msg.watermark,
            )
        except (RedisUnavailable, SinkUnavailable) as exc:
            self.log.warning(
                "commit-outcome-unknown", token=msg.token, cursor=msg.cursor, error=str(exc)
            )
            return CommitUnknown(msg.token, str(exc))
        except ValueError as exc:
            # A malformed or out-of-order batch, found before anything was sent, or refused by
            # the sink for its data (definite, rolled back): it must end the term, never the node.
            self.log.error("commit-rejected", token=msg.token, reason="bad-batch", error=str(exc))
            return CommitRefused(msg.token, "bad-batch", self.highest_token_seen)
        if isinstance(result, Committed):
            self.highest_token_seen = max(self.highest_token_seen, msg.token)
            # Only a cursor kept in Redis can be lost with Redis's state (StateLost); a sink
            # that keeps its own cursor survives a Redis that forgot the job.
            if self.memory is not None and not self.memory.committed and isinstance(
                self.sink, RedisStreamSink
            ):
                await self._remember_commit(self.memory, msg.token)
            if msg.watermark is not None:
                self._watermark(msg, result)
            if not msg.records:
                if msg.previous_cursor is None:
                    self.log.info("cursor-anchored", token=msg.token, cursor=msg.anchor)
                else:
                    self.observer.committed(0, msg.cursor, trio.current_time() - started)
                return CursorCommitted(msg.token, result.cursor, 0)
            self.observer.committed(
                len(msg.records), msg.cursor, trio.current_time() - started,
                newest_record=msg.records[-1].body,
            )
            return CursorCommitted(msg.token, result.cursor, result.count)
        self.highest_token_seen = max(self.highest_token_seen, result.current_token)
        if result.reason in FENCING_REASONS:
            return await self._fenced(msg, result.reason, result.current_token, local=False)
        self.log.error(
            "commit-rejected",
            token=msg.token,
            reason=result.reason,
            cursor=msg.cursor,
            previous_cursor=msg.previous_cursor,
            stored_cursor=result.stored_cursor,
        )
        return CommitRefused(msg.token, result.reason, result.current_token)

    def _watermark(self, msg: CommitCursor, result: Committed) -> None:
        """Tell the observer where the job is complete through; say so when a gap now holds it."""
        if result.complete_through is not None:
            self.observer.complete_through(
                result.complete_through, result.held, msg.watermark.source_latest if msg.watermark else None
            )
        if result.newly_held:
            self.log.warning(
                "complete-through-held", token=msg.token, complete_through=result.complete_through,
                cursor=msg.cursor, reason=result.held,
            )  # fmt: skip

    async def _remember_commit(self, memory: TokenMemory, token: int) -> None:
        if memory.path is None:
            memory.saw_commit()
            return
        try:
            await memory.bounded(memory.saw_commit)
        except (OSError, ValueError) as exc:
            # Logged, and not tried again at every commit (a hung disk would slow each one by
            # the bound): known in memory for this process's life, so the Elector still counts
            # the job committed; the memory is an extra floor, not the guarantee.
            self.log.warning("token-memory-failed", token=token, error=str(exc))
            memory.committed = True

    async def _fenced(
        self, msg: CommitCursor | OpenTerm, reason: str, current: int, *, local: bool
    ) -> CommitRefused:
        assert self.sink is not None
        cursor = msg.cursor if isinstance(msg, CommitCursor) else ""
        fields: dict[str, str | int] = {
            "token": msg.token,
            "current_token": current,
            "cursor": cursor,
            "rejection": reason,
            "checked_by": "writer" if local else self.sink.name,
        }
        if not isinstance(self.sink, RedisStreamSink):
            fields["sink"] = self.sink.name
        self.log.warning("fencing-token-rejected", **fields)
        self.observer.fencing_rejected(**fields)
        if self.store is not None:  # (a sink's own fence is tested without any Redis)
            await self.store.note_rejection({"node": self.node, **fields})  # for the console (bounded)
        lease_may_hold = not isinstance(self.sink, RedisStreamSink)
        await self.elector.send(FencingTokenRejected(msg.token, current, cursor, lease_may_hold))
        return CommitRefused(msg.token, reason, current)
