"""The source interface: what the Ingestor reads records from.

A source is resumable from a cursor: ``source.stream(cursor)`` is an async context manager that
yields a receive channel of :class:`Batch` values, each holding records strictly after the previous
batch's last paging token, the first strictly after ``cursor``. Implementations write it as an async
generator decorated with ``@trio.as_safe_channel`` so that no ``yield`` crosses a nursery or cancel
scope. The channel closes when the source has nothing more to say (a finite source); a source that
cannot go on raises :class:`SourceFatalError` (retrying cannot fix it) out of ``receive``.

``cursor`` is the last committed paging token, or the job's start cursor when nothing is committed
yet: ``"now"`` (only new records), ``"0"`` (everything the source has), or a paging token.
"""

from __future__ import annotations

import contextvars
import itertools
import json
from collections.abc import AsyncGenerator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, Protocol, runtime_checkable

import attrs
import trio

from actors.cursor_order import is_after


class Record(NamedTuple):
    """One source record: its paging token and its JSON exactly as the source sent it.

    An immutable value like the runtime's attrs classes, but tuple-backed: a node builds one per
    record it ingests, and a page's worth is built in C (:meth:`many`) and flattened into a
    commit's arguments in C (``itertools.chain.from_iterable(records)``)."""

    paging_token: str
    body: str

    @classmethod
    def many(cls, paging_tokens: Iterable[str], bodies: Iterable[str]) -> tuple[Record, ...]:
        """Records pairing ``paging_tokens`` with ``bodies``, in order, built without a Python
        call per record."""
        return tuple(map(tuple.__new__, itertools.repeat(cls), zip(paging_tokens, bodies, strict=True)))


@attrs.frozen
class Watermark:
    """How far a job's data is complete once a batch is committed: every record the source holds
    for ledgers up to ``ledger`` (from the job's start, within its filters) is in this batch or
    committed before it. It moves on quiet ledgers too (a batch with no record, only a read-through
    cursor). ``held``: a known gap lies after ``ledger`` (a history gap skipped): the committed
    watermark stops at ``ledger`` for good, and ``held`` says why."""

    ledger: int
    held: str = ""
    # The source's latest closed ledger when it said so: not committed, shown beside the
    # watermark (a watermark that stops while this goes on is an alert).
    source_latest: int | None = attrs.field(default=None, eq=False)

    def __str__(self) -> str:
        return f"{self.ledger}|{self.held}" if self.held else str(self.ledger)


@attrs.frozen
class Batch:
    """Consecutive records, in source order, and where the source has read through.

    ``cursor`` is the last record's paging token, or ``through`` when given: a position after
    the last record up to which the source has looked and found nothing more (Stellar RPC's
    "scanned through ledger N" cursor). A batch with ``through`` may hold no record at all: it
    then only moves the committed cursor forward, so that a job whose filter matches rarely does
    not resume from far behind (or from outside the source's retention) after a failover.
    """

    records: tuple[Record, ...]
    through: str | None = None
    # Set by the Ingestor once this batch (its last part, when it is committed in parts) is
    # committed: a source that must not run ahead of its commits (push delivery: the next POST
    # waits until the previous answer is durably recorded) waits on it after handing the batch on.
    committed: trio.Event | None = attrs.field(default=None, eq=False, repr=False)
    # Where the job's data is complete once this batch is committed (None: the source cannot
    # say); committed with the cursor, on the last part of a batch committed in parts.
    watermark: Watermark | None = None

    @property
    def cursor(self) -> str:
        return self.through if self.through is not None else self.records[-1].paging_token

    def split(self, size: int) -> list[Batch]:
        """This batch as batches of at most ``size`` records, the read-through cursor on the last
        (one commit script never runs long enough to hold up Redis for everyone else)."""
        records = self.records
        if len(records) <= size:
            return [self]
        parts = [Batch(records[i : i + size]) for i in range(0, len(records), size)]
        if self.through is not None or self.committed is not None or self.watermark is not None:
            parts[-1] = attrs.evolve(self, records=parts[-1].records)
        return parts

    def take(self, size: int) -> tuple[Batch, Batch | None]:
        """The first ``size`` records as a batch, and the rest (None when nothing is left), the
        read-through cursor on the rest."""
        if size < 1:
            raise ValueError(f"a part holds at least one record, asked for {size}")
        records = self.records
        if len(records) <= size:
            return self, None
        return Batch(records[:size]), attrs.evolve(self, records=records[size:])

    def __attrs_post_init__(self) -> None:
        if not self.records and self.through is None:
            raise ValueError("a Batch holds at least one record or a through cursor")
        if self.records and self.through is not None and not is_after(
            self.through, self.records[-1].paging_token
        ):
            raise ValueError(f"through cursor {self.through!r} is not after the batch's last record")


class Fence(Protocol):
    """Something job code can write to under a term's fence (e.g. a PostgreSQL fence)."""

    def fenced(self, node: str, token: int) -> AbstractAsyncContextManager[Any]: ...


@attrs.frozen
class TermContext:
    """The leadership term a source runs in: job code uses ``token`` to fence its own writes."""

    node: str
    token: int

    def fenced(self, target: Fence) -> AbstractAsyncContextManager[Any]:
        """``async with term.fenced(pg) as tx:``: a transaction of ``target`` that applies only
        while this term's token still holds the job's fence there (``ingestion/postgres/fence.py``
        ``PostgresFence``)."""
        return target.fenced(self.node, self.token)


# Set by the Ingestor for the duration of each term; a source's tasks inherit it.
current_term: contextvars.ContextVar[TermContext] = contextvars.ContextVar("current_term")


class SourceFatalError(Exception):
    """The source cannot go on and retrying will not help; the message says what to fix."""


class SourceHeldOff(Exception):
    """The source must not be followed now (on another network, or its chain was reset): the
    term ends as ``source-held-off`` and the node's campaigns are held off while the source's
    ``hold_off()`` (:class:`HeldOffSource`) says why. The message says what to do."""


@runtime_checkable
class HeldOffSource(Protocol):
    async def hold_off(self) -> tuple[str, str] | None:
        """Before each campaign: None (campaign) or ``(reason, one line)``: this node holds the
        job off (``campaign-held-off reason=REASON error=LINE``) and asks again a TTL later. A
        check that cannot tell (Redis or the source not answering) answers None."""
        ...

    async def look_between_campaigns(self) -> None:
        """Runs beside the Elector for the node's life (the supervisor starts it): the checks
        ``hold_off`` asks for but does not wait on, so that a campaign need not wait on a slow
        source once it has been found fine."""
        ...


class TermFenced(Exception):
    """A fenced write of the source's own was refused: the term's token is no longer current.
    The term ends as ``fenced`` (the message is the refusal's reason), as after a refused commit."""


class Source(Protocol):
    def stream(self, cursor: str) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[Batch]]:
        """Batches of records strictly after ``cursor``, in order."""
        ...

    async def resolve_start(self, cursor: str) -> str:
        """A concrete cursor for a job's start cursor: ``"now"`` becomes the paging token of the
        source's newest record (``"0"`` when it has none); anything else is returned unchanged.

        The Ingestor commits the answer as the job's cursor before the first record, so that a job
        told to start at "now" starts at one moment, not again at every failover.
        """
        ...


@attrs.frozen
class SyntheticSource:
    """A deterministic local source: record ``i`` (1-based) has paging token ``i << 32 | 1 << 12 | 1``
    (shaped like a Horizon TOID: ledger ``i``, transaction 1, operation 1).

    ``total`` records exist in all (None: unbounded); ``available`` is a callable giving how many
    exist right now (for a source that grows over time), defaulting to all of them. Used by the
    election-core tests and for running a node without Horizon.
    """

    total: int | None = 1000
    batch_size: int = 50
    interval: float = 0.0  # seconds to wait between batches: a slow, live-looking source

    @staticmethod
    def token_of(index: int) -> str:
        return str(index << 32 | 1 << 12 | 1)

    @staticmethod
    def index_of(token: str) -> int:
        return int(token) >> 32

    def record(self, index: int) -> Record:
        token = self.token_of(index)
        body = json.dumps({"id": token, "paging_token": token, "seq": index}, separators=(",", ":"))
        return Record(paging_token=token, body=body)

    async def resolve_start(self, cursor: str) -> str:
        if cursor != "now":
            return cursor
        if self.total is None:
            raise SourceFatalError("an unbounded SyntheticSource has no newest record; start from '0'")
        return self.token_of(self.total) if self.total else "0"

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        if cursor == "now":
            raise SourceFatalError("SyntheticSource has no notion of 'now'; start from '0'")
        nxt = 1 if cursor == "0" else self.index_of(cursor) + 1
        if cursor != "0" and not is_after(self.token_of(nxt), cursor):
            raise SourceFatalError(f"cursor {cursor!r} is not a SyntheticSource token")
        while self.total is None or nxt <= self.total:
            end = nxt + self.batch_size
            if self.total is not None:
                end = min(end, self.total + 1)
            yield Batch(tuple(self.record(i) for i in range(nxt, end)))
            nxt = end
            if self.interval:
                await trio.sleep(self.interval)
