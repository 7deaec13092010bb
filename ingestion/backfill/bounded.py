"""A range job's source: the job's own source (Stellar RPC or a data lake), stopped at the range's
last ledger, and the range's end recorded under the term's fence once its last batch is committed.

:class:`BoundedSource` passes batches on unchanged until one reaches past ``last``: that one is
cut to the records of ledgers up to ``last`` and given the scanned-through cursor of ``last``; once
the Ingestor has committed it (``Batch.committed``), the leader records ``done`` in the range's
backfill hash with ``fenced_hset`` (a refusal ends the term as fenced; a Redis that does not
answer is asked again: the write is idempotent), and the stream ends. A term that starts from a
cursor already at the end only records it.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import AsyncGenerator
from typing import Any

import attrs
import structlog
import trio

from actors.lease_store import LeaseStore, RedisUnavailable
from actors.source import Batch, Source, TermFenced, current_term
from ingestion.common.keyspace import backfill_key
from ingestion.rpc.protocol import Cursor, InvalidCursor

log = structlog.get_logger()

DONE_RETRY = (0.05, 1.0)  # backoff bounds (seconds) while Redis does not answer the end's write


def _position(cursor: str) -> Cursor | None:
    """A committed cursor as a position (None: a start cursor, "0" or a ledger number)."""
    if cursor in ("0", "now") or ("-" not in cursor and cursor.isdigit()):
        return None
    try:
        return Cursor.parse(cursor)
    except InvalidCursor:
        return None


@attrs.define(eq=False)
class BoundedSource:
    """``inner`` up to and including ledger ``last``; see the module docstring. Everything else
    of the source (``probe``, ``health``, ...) is the inner source's."""

    inner: Source
    last: int
    store: LeaseStore
    name: str  # the range job's name (its backfill hash)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def end(self) -> Cursor:
        return Cursor.through(self.last)

    async def resolve_start(self, cursor: str) -> str:
        return await self.inner.resolve_start(cursor)

    def cut(self, batch: Batch) -> tuple[Batch, bool]:
        """``batch`` as it goes on, and whether it is the range's last (pure)."""
        end = self.end
        through = _position(batch.cursor)
        if through is not None and through < end:
            return batch, False
        kept = tuple(r for r in batch.records if Cursor.parse(r.paging_token) <= end)
        mark = batch.watermark  # (read past the range's end: complete through its last ledger)
        mark = None if mark is None else attrs.evolve(mark, ledger=min(mark.ledger, self.last))
        return Batch(kept, through=str(end), committed=trio.Event(), watermark=mark), True

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        start = _position(cursor)
        if start is None or start < self.end:
            async with self.inner.stream(cursor) as batches:
                async for batch in batches:
                    part, final = self.cut(batch)
                    yield part
                    if final:
                        assert part.committed is not None
                        await part.committed.wait()
                        break
        await self._record_done()

    async def _record_done(self) -> None:
        term = current_term.get()
        fields = {
            "done": str(self.end), "node": term.node, "token": str(term.token),
            "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
        }  # fmt: skip
        delay = DONE_RETRY[0]
        while True:
            try:
                refused = await self.store.fenced_hset(term.node, term.token, backfill_key(self.name), fields)
            except RedisUnavailable as exc:
                log.warning("backfill-range-done-unconfirmed", range=self.name, error=str(exc))
                await trio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(DONE_RETRY[1], delay * 2)
                continue
            if refused is not None:
                raise TermFenced(refused.reason)
            log.info("backfill-range-done", range=self.name, cursor=str(self.end), last_ledger=self.last)
            return
