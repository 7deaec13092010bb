"""What the streaming half reads from the API's store (:mod:`ingestion.api.store`), through the
query layer's reader (:class:`~ingestion.api.reader.StoreReader`: its connections, its bounds, its
errors): the view's events after an id for the live feed, history pages under getEvents' filters
(the query layer's own SQL, :func:`~ingestion.api.query.events_sql`, so the same arms and the same
order), and each event rendered as ``getEvents`` serves it.

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
from ingestion.postgres.sql import quoted
from ingestion.rpc.protocol import MAX_EVENT, Cursor, EventFilter, matches

FEED_BATCH = 1000  # rows the live feed reads at once
NO_ID = "0000000000000000000-0000000000"  # before every event
PAST_ALL = "9999999999999999999-9999999999"  # after every event


@attrs.define
class StoredEvent:
    """A projected event: its id and its record as ``xdrFormat: base64`` serves it."""

    id: str
    text: str
    _fields: dict[str, Any] | None = None

    def matches(self, filters: Sequence[EventFilter]) -> bool:
        """stellar-rpc's ``Matches`` over the record's type, contract and topic."""
        if not filters:
            return True
        if self._fields is None:
            self._fields = orjson.loads(self.text)
        r = self._fields
        return matches(filters, str(r.get("type", "")), str(r.get("contractId", "")), r.get("topic") or [])

    def render(self, xdr_format: str) -> bytes:
        """The event's JSON as ``getEvents`` sends it in ``xdr_format``."""
        return json_format(self.text) if xdr_format == "json" else self.text.encode()


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
        self._newest = f"SELECT id, record FROM {q}.api_events WHERE view = %s ORDER BY id DESC LIMIT 1"
        self._after = (
            f"SELECT id, record FROM {q}.api_events WHERE view = %s AND id > %s ORDER BY id LIMIT %s"
        )

    async def newest(self) -> str:
        rows = await self.reader.rows(_plan(self._newest, (self.reader.view,)))
        return rows[0][0] if rows else NO_ID

    async def after(self, after: str, limit: int = FEED_BATCH) -> list[StoredEvent]:
        """The view's events after id ``after``, in id order (the live feed)."""
        rows = await self.reader.rows(_plan(self._after, (self.reader.view, after, limit)))
        return [StoredEvent(i, r) for i, r in rows]

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
