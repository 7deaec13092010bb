"""What the streaming half reads from the store, blocking (run in worker threads by
``ingestion/api/feed.py`` and ``ingestion/api/streaming.py``): a job's new rows by ``seq`` for the
live feed, history pages after an event id under getEvents' filters, and each event rendered as
``getEvents`` serves it (``xdrFormat`` ``base64`` or ``json``).

The rows are the sink's (``ingestion/postgres/sql.py``): ``events(job, seq, paging_token, record)``,
``paging_token`` the event id, ``"%019d-%010d"``, ascending with ``seq`` in a job (the sink's
continuity check). Every statement is one autocommit read: only committed rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import attrs
import orjson
import psycopg

from ingestion.events.scval import ScValError, from_base64
from ingestion.postgres import sql
from ingestion.postgres.connection import connect
from ingestion.rpc.protocol import EventFilter, matches

FEED_BATCH = 1000  # rows the live feed reads at once
SCAN_FACTOR = 20  # a history read looks at up to this many rows per event asked for


@attrs.frozen
class StoredEvent:
    """A committed event: its id (``seq`` in its job) and its record, with the fields filters
    look at."""

    seq: int
    id: str
    record: dict[str, Any]

    @classmethod
    def from_row(cls, seq: int, paging_token: str, text: str) -> StoredEvent:
        record = orjson.loads(text)
        return cls(int(seq), str(paging_token), record if isinstance(record, dict) else {})

    def matches(self, filters: Sequence[EventFilter]) -> bool:
        r = self.record
        topics = r.get("topic") or []
        return matches(filters, str(r.get("type", "")), str(r.get("contractId", "")), topics)

    def render(self, xdr_format: str) -> dict[str, Any]:
        """The event as ``getEvents`` answers it: ``json`` gives ``topicJson``/``valueJson``
        (SEP-51, a decoding job's when it added them, else decoded here) in place of the base64
        ``topic``/``value``; ``base64`` (or "") the record without what a decoding job added."""
        r = {k: v for k, v in self.record.items() if k not in _ADDED}
        if xdr_format != "json":
            return r
        topic, value = r.pop("topic", None), r.pop("value", None)
        try:
            r["topicJson"] = self.record.get("topicJson") or [from_base64(t) for t in topic or []]
            if value is not None:
                r["valueJson"] = (
                    self.record["valueJson"] if "valueJson" in self.record else from_base64(value)
                )
        except ScValError as exc:
            r["topic"], r["value"] = topic, value
            r["decodeError"] = str(exc)
        return r


_ADDED = ("topicJson", "valueJson", "transfer", "decodeError")  # what a decoding job appends


@attrs.frozen
class HistoryPage:
    """A history read: the matching events; ``through``: the id of the last row looked at (all
    rows up to it are judged); ``exhausted``: the store had no row after ``through``."""

    events: list[StoredEvent]
    through: str | None
    exhausted: bool


class Reads:
    """Blocking reads of one job in ``schema`` at ``url``, on a few connections kept for reuse
    (each read takes one; a broken one is dropped). Thread-safe."""

    def __init__(self, url: str, schema: str, job: str, timeout: float = 5.0, keep: int = 4) -> None:
        self.url = url
        self.schema = schema
        self.job = job
        self.timeout = timeout
        self.keep = keep
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._q = sql.quoted(schema)

    def _run(self, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = connect(self.url, self.timeout, "ingestion-api-stream")
        try:
            rows = conn.execute(query, args).fetchall()  # type: ignore[arg-type]
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if len(self._idle) < self.keep and not conn.broken:
                self._idle.append(conn)
                conn = None
        if conn is not None:
            conn.close()
        return rows

    def last_seq(self) -> int:
        rows = self._run(f"SELECT coalesce(max(seq), 0) FROM {self._q}.events WHERE job = %s", (self.job,))
        return int(rows[0][0])

    def after_seq(self, seq: int, limit: int = FEED_BATCH) -> list[StoredEvent]:
        """The job's rows after ``seq``, in order (the live feed)."""
        rows = self._run(
            f"SELECT seq, paging_token, record::text FROM {self._q}.events "
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
            (self.job, seq, limit),
        )
        return [StoredEvent.from_row(*r) for r in rows]

    def history(self, after: str, filters: Sequence[EventFilter], limit: int) -> HistoryPage:
        """Up to ``limit`` events strictly after event id ``after`` that match ``filters``,
        looking at ``SCAN_FACTOR * limit`` rows at most (a sparse filter answers in several reads,
        each moving ``through``)."""
        scan = SCAN_FACTOR * limit
        rows = self._run(
            f"SELECT seq, paging_token, record::text FROM {self._q}.events WHERE job = %s "
            'AND paging_token COLLATE "C" > %s ORDER BY seq LIMIT %s',
            (self.job, after, scan),
        )
        found: list[StoredEvent] = []
        through = None
        for row in rows:
            event = StoredEvent.from_row(*row)
            if event.matches(filters):
                found.append(event)
            through = event.id
            if len(found) == limit:
                return HistoryPage(found, through, False)
        return HistoryPage(found, through, len(rows) < scan)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
