"""What the streaming half reads, through the query layer's reader
(:class:`~ingestion.api.reader.StoreReader`: its connections, its bounds, its errors): history
pages from the API's store (:mod:`ingestion.api.store`) under getEvents' filters (the query layer's
own SQL, :func:`~ingestion.api.query.events_sql`, so the same arms and the same order); the live
job's rows as the sink committed them, by ``seq``, for the live feed (they are there a projector
step before the store has them: tens of milliseconds); whether the store holds an event yet; each
event rendered as ``getEvents`` serves it.

A history read has no upper bound: it reads every projected row after its start (``getEvents``
stops at the ledger the view is complete through; a subscription must not, or an event of a
partly projected ledger, published by the live feed before the subscription registered, would be
in neither half: the seam argument in ``ingestion/api/subscription.py`` needs "exhausted" to mean
"no matching row after this one in the store").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import orjson

from ingestion.api.query import Plan, events_sql, json_format
from ingestion.api.reader import StoreReader
from ingestion.api.store import served_record
from ingestion.postgres.sql import quoted
from ingestion.rpc.protocol import MAX_EVENT, Cursor, EventFilter, matches

FEED_BATCH = 1000  # rows the live feed reads at once
NO_ID = "0000000000000000000-0000000000"  # before every event
PAST_ALL = "9999999999999999999-9999999999"  # after every event


@attrs.define
class StoredEvent:
    """A projected event: its id and its record as ``xdrFormat: base64`` serves it. The live
    feed hands the same objects to every subscriber: what is parsed or rendered once is kept here
    for the others."""

    id: str
    text: str
    _fields: dict[str, Any] | None = None
    _json: bytes | None = None

    def matches(self, filters: Sequence[EventFilter]) -> bool:
        """stellar-rpc's ``Matches`` over the record's type, contract and topic."""
        if not filters:
            return True
        if self._fields is None:
            self._fields = orjson.loads(self.text)
        r = self._fields
        return matches(filters, str(r.get("type", "")), str(r.get("contractId", "")), r.get("topic") or [])

    def render(self, xdr_format: str) -> bytes:
        """The event's JSON as ``getEvents`` sends it in ``xdr_format``; ``json`` (its ScVals
        decoded, some 50 us an event) rendered once however many subscribers send it.

        Raises:
            RpcError: INTERNAL_ERROR, a stored ScVal that does not decode (asked again, it raises again).
        """
        if xdr_format != "json":
            return self.text.encode()
        if self._json is None:
            self._json = json_format(self.text)
        return self._json


@attrs.frozen
class HistoryPage:
    """A history read: the matching events; ``exhausted``: nothing more matched in the store."""

    events: list[StoredEvent]
    exhausted: bool


def next_id(after: str) -> str:
    """The smallest id strictly after ``after`` (``id >= next_id(after)`` is ``id > after``)."""
    cursor = Cursor.parse(after)
    if cursor.event < MAX_EVENT:
        return str(attrs.evolve(cursor, event=cursor.event + 1))
    toid = int(after.partition("-")[0]) + 1
    return f"{toid:019d}-{0:010d}"


class StreamReads:
    """The streaming half's reads of one view through ``reader``. Each may raise the reader's
    :class:`~ingestion.rpc.protocol.RpcError` (store unavailable, too slow)."""

    def __init__(self, reader: StoreReader) -> None:
        self.reader = reader
        q = quoted(reader.schema)
        self._held = f"SELECT id, record FROM {q}.api_events WHERE view = %s AND id = %s"
        # (seq and paging token in one column: the reader's rows are pairs)
        self._last = (
            f"SELECT seq::text || ' ' || paging_token, '' FROM {q}.events WHERE job = %s "
            "ORDER BY seq DESC LIMIT 1"
        )
        self._after = (
            f"SELECT seq::text || ' ' || paging_token, record::text FROM {q}.events "
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s"
        )

    async def last_committed(self) -> tuple[int, str]:
        """The live job's last committed row: (seq, event id); (0, :data:`NO_ID`) for none."""
        rows = await self.reader.rows(_plan(self._last, (self.reader.view,)))
        if not rows:
            return 0, NO_ID
        seq, _, eid = rows[0][0].partition(" ")
        return int(seq), eid

    async def committed_after(self, seq: int, limit: int = FEED_BATCH) -> tuple[int, list[StoredEvent]]:
        """The live job's rows after ``seq`` as committed, in order (the live feed): the last
        ``seq`` read and the events, each as the store will hold it."""
        rows = await self.reader.rows(_plan(self._after, (self.reader.view, seq, limit)))
        events = []
        for head, record in rows:
            seq_text, _, eid = head.partition(" ")
            seq = int(seq_text)
            events.append(StoredEvent(eid, served_record(record)))
        return seq, events

    async def holds(self, event_id: str) -> bool:
        """Whether the store holds ``event_id`` (of the live job: then every earlier one too,
        the projector takes the job's rows in order)."""
        return event_id == NO_ID or bool(
            await self.reader.rows(_plan(self._held, (self.reader.view, event_id)))
        )

    async def history(self, after: str, filters: Sequence[EventFilter], limit: int) -> HistoryPage:
        """Up to ``limit`` events after id ``after`` that match ``filters``, by the query layer's
        plan with no upper bound (see the module docstring)."""
        reader = self.reader
        sql, params = events_sql(reader.schema, reader.view, next_id(after), PAST_ALL, filters, limit)
        rows = await reader.rows(_plan(sql, params))
        events = [StoredEvent(i, r) for i, r in rows]
        return HistoryPage(events, exhausted=len(events) < limit)


def _plan(sql: str, params: tuple[Any, ...]) -> Plan:
    """A statement in the reader's one shape (``rows`` runs a plan's SQL)."""
    return Plan(Cursor(0), 0, 0, sql, params, "base64")
