"""The stage between a job's source and its commits: each record decoded (contract events' ScVals,
the transfer view) and, for a job with a watch list, kept only when it names a watched address.

A thin shell over the pure rules (:mod:`ingestion.events.decoded` for events,
:mod:`ingestion.events.payments` for Horizon records, :mod:`ingestion.events.watch`): it wraps the
job's source and hands each batch on changed, so that the sources, the Ingestor and the sinks know
nothing of it.

The cursor moves past what the watch list leaves out: a batch whose records are all left out
becomes a read-through batch (no record, the batch's cursor), and one whose last records are left
out keeps the batch's cursor as its read-through cursor. A quiet watch list therefore never makes a
new leader re-read history, and adding an address later does not look back (``ingestion backfill``
does, when asked).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

import attrs
import trio

from actors.source import Batch, Record, Source

Rule = Callable[[str], tuple[str, tuple[str, ...]]]
"""A record's text -> (its text as committed, the addresses it names)."""


class WatchList(Protocol):
    def matches(self, addresses: tuple[str, ...]) -> bool: ...


class WatchSource(Protocol):
    async def current(self) -> WatchList:
        """The list as it stands now (cheap when it has not changed)."""
        ...


@attrs.frozen
class StageCounts:
    """What the stage has seen since the node started: records in, kept, left out by the watch
    list; for the metrics."""

    seen: int = 0
    kept: int = 0


@attrs.define(eq=False)
class EventsStage:
    """``inner`` with every record passed through ``rule``: its text replaced when ``decode``, and
    left out when ``watch`` is given and the record names no watched address.

    Everything else of the source (``probe``, ``health``, ``stats``, ...) is the inner source's."""

    inner: Source
    rule: Rule
    decode: bool = True
    watch: WatchSource | None = None
    seen: int = 0
    kept: int = 0

    def __getattr__(self, name: str) -> Any:
        # only called for what this class does not define: the inner source's other parts
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def resolve_start(self, cursor: str) -> str:
        return await self.inner.resolve_start(cursor)

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        async with self.inner.stream(cursor) as batches:
            async for batch in batches:
                watched = None if self.watch is None else await self.watch.current()
                yield self.apply(batch, watched)

    def apply(self, batch: Batch, watched: WatchList | None) -> Batch:
        """``batch`` decoded and filtered (pure: the list is given)."""
        records = batch.records
        if not records:
            return batch
        rule, decode = self.rule, self.decode
        kept: list[Record] = []
        if watched is None:
            kept = [Record(r.paging_token, rule(r.body)[0]) for r in records]
        else:
            matches = watched.matches
            for record in records:
                text, addresses = rule(record.body)
                if matches(addresses):
                    kept.append(Record(record.paging_token, text) if decode else record)
        self.seen += len(records)
        self.kept += len(kept)
        through = batch.through
        if not kept or kept[-1].paging_token != records[-1].paging_token:
            through = batch.cursor
        if len(kept) == len(records) and through is None and not decode:
            return batch
        return Batch(tuple(kept), through=through, committed=batch.committed)


def stage_for(source: Source, rule: Rule | None, decode: bool, watch: WatchSource | None) -> Source:
    """``source`` behind an :class:`EventsStage`, or as it is when there is nothing to do."""
    if rule is None or (not decode and watch is None):
        return source
    return EventsStage(source, rule, decode=decode, watch=watch)
