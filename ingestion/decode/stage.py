"""The stage between a job's source and its commits: each record decoded (contract events' ScVals,
the transfer view) and, for a job with a watch list, kept only when it names a watched address.

A thin shell over the pure rules (:mod:`ingestion.decode.decoded` for events,
:mod:`ingestion.decode.payments` for Horizon records, :mod:`ingestion.watchlist.lists`): it wraps the
job's source and hands each batch on changed, so that the sources, the Ingestor and the sinks know
nothing of it.

The cursor moves past what the watch list leaves out: a batch whose records are all left out
becomes a read-through batch (no record, the batch's cursor), and one whose last records are left
out keeps the batch's cursor as its read-through cursor. A quiet watch list therefore never makes a
new leader re-read history, and adding an address later does not look back (``ingestion backfill``
does, when asked).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import operator
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

import attrs
import structlog
import trio

from actors.source import Batch, Record, Source
from ingestion.watchlist.lists import WatchUnavailable

log = structlog.get_logger()
UNAVAILABLE_RETRY = 1.0  # seconds between attempts to load a watch list that cannot be read

Rule = Callable[[str], tuple[str, tuple[str, ...]]]
"""A record's text -> (its text as committed, the addresses it names)."""

DECODE_ERROR = '"decodeError":'  # the member a record that could not be decoded is committed with
# Told how many records of each batch handed on to be committed carry a decode error (the node
# process sets one that counts them per job for the metrics: ingestion_decode_errors_total).
decode_error_listener: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "decode_error_listener", default=None
)


# What the stage needs of ingestion.watchlist.lists's WatchList and WatchSource (no more: the tests
# feed it lists of their own)
class WatchList(Protocol):
    def matches(self, addresses: tuple[str, ...]) -> bool: ...


class WatchSource(Protocol):
    async def current(self) -> WatchList:
        """The list as it stands now (cheap when it has not changed).

        Raises:
            WatchUnavailable: there is no list to give (Redis cannot be read and none was loaded).
        """
        ...

    def describe(self) -> str: ...


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
                watched = None if self.watch is None else await self._current(self.watch)
                yield self.apply(batch, watched)

    async def _current(self, watch: WatchSource) -> WatchList:
        """The list for the next batch. Without one the batch waits (it must not be committed
        unfiltered, nor its records skipped): the load is tried again every
        :data:`UNAVAILABLE_RETRY` seconds, for as long as the term lasts."""
        failing = False
        while True:
            try:
                watched = await watch.current()
            except WatchUnavailable as exc:
                if not failing:
                    log.warning("watch-list-unavailable", source=watch.describe(), error=str(exc))
                failing = True
                await trio.sleep(UNAVAILABLE_RETRY)
                continue
            if failing:
                log.info("watch-list-available", source=watch.describe())
            return watched

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
        if decode and kept:
            errors = sum(map(operator.contains, (r.body for r in kept), itertools.repeat(DECODE_ERROR)))
            listener = decode_error_listener.get()
            if errors and listener is not None:
                listener(errors)
        through = batch.through
        if not kept or kept[-1].paging_token != records[-1].paging_token:
            through = batch.cursor
        if len(kept) == len(records) and through is None and not decode:
            return batch
        return Batch(tuple(kept), through=through, committed=batch.committed, watermark=batch.watermark)


def rule_for(kind: str, resource: str = "", names: bool = True) -> tuple[Rule | None, bool]:
    """The rule for a job's records, and whether it changes them: events (RPC, lake) are decoded;
    Horizon ``/payments`` records get the transfer view; any other Horizon
    record is kept as sent and only its addresses are read (for a watch list). With ``names``
    false (no watch list) a rule may leave the addresses out where finding them costs."""
    if kind in ("rpc", "lake"):
        # lazy: node start-up (~25 ms): rpc and lake jobs only
        from ingestion.decode.decoded import decode_event_text

        return decode_event_text, True
    if kind == "horizon":
        # lazy: node start-up (~1 ms): Horizon payments only
        from ingestion.decode.payments import payment_record_text

        # payments only (/payments, /accounts/G.../payments, ...): an /operations job, the default,
        # keeps its records as sent (the view would cost its catch-up a third for a few records)
        changes = resource.partition("?")[0].rstrip("/").endswith("/payments")
        rule = payment_record_text if names else functools.partial(payment_record_text, names=False)
        return rule, changes
    return None, False


def stage_for(source: Source, rule: Rule | None, decode: bool, watch: WatchSource | None) -> Source:
    """``source`` behind an :class:`EventsStage`, or as it is when there is nothing to do."""
    if rule is None or (not decode and watch is None):
        return source
    return EventsStage(source, rule, decode=decode, watch=watch)
