"""The events API's store: the projection tables, their indexes and the SQL that reads and keeps
them. Pure: SQL text and row shaping, no I/O (:mod:`ingestion.api.projector` writes,
:mod:`ingestion.api.reader` reads). The contract, documented in docs/API.md:

- ``api_events (view, id, ledger, type, contract_id, topic_count, topic1..topic4, record)``,
  primary key ``(view, id)``: one row per event of a *view* (the ``[api] job`` whose events are
  served: its own rows and its backfill ranges' rows, ``<job>~<first>-<last>``). ``id`` is the
  event id (``"%019d-%010d"``: fixed width, so its text order under ``COLLATE "C"`` is the id's
  order), ``type`` ``contract`` or ``system``, ``contract_id`` "" for none, ``topicN`` the
  N-th topic segment's key (:func:`segment_key`: the base64 itself, or ``md5:<hex>`` for a
  segment longer than :data:`KEY_LIMIT`, which keeps every index entry small), NULL past the
  event's last segment; ``record`` the event's ``EventInfo`` JSON as stellar-rpc sends it with
  ``xdrFormat: base64`` (the fields a decoding job adds, ``topicJson`` and after, cut off). An
  event a backfill range and the live job both committed is held once: the key is the view and
  the id, and the projector inserts ``ON CONFLICT DO NOTHING``.
- Indexes: the primary key (a page of every event from a ledger on: the newest page, a type or
  wildcard filter), ``(view, contract_id, id)`` for a contract's events and ``(view, topicN, id)``
  for N = 1..4 for a segment's events, each partial (no ``''`` contract, no NULL segment). Each
  serves a sparse filter as an ordered range scan that stops at the page's limit: no scan over
  the ledgers the filter does not match.
- ``api_progress (view, source, seq, through)``: per view and source job, the last ``seq``
  projected and the source's position the projection is complete through (its committed cursor
  when the projector caught up with it, read in the same snapshot as the rows; else the last
  projected row's paging token). Written in the same transaction as the rows, so a reader (a
  streaming replica included) never claims a ledger whose rows it does not hold.

Only the projector writes; the API reads with its own connections and never writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import orjson

from ingestion.postgres.sql import quoted
from ingestion.rpc.protocol import Cursor, InvalidCursor

KEY_LIMIT = 256  # a topic segment longer than this is indexed by its digest
SEGMENTS = 4  # topic positions indexed (Soroban events carry at most four topics)
DERIVED_MARKERS = (',"topicJson":', ',"decodeError":')  # what a decoding job appends

TABLES = {
    "api_events": (
        'view text NOT NULL, id text COLLATE "C" NOT NULL, ledger bigint NOT NULL, type text NOT NULL, '
        "contract_id text NOT NULL, topic_count smallint NOT NULL, topic1 text, topic2 text, "
        "topic3 text, topic4 text, record text NOT NULL, PRIMARY KEY (view, id)"
    ),
    "api_progress": (
        "view text NOT NULL, source text NOT NULL, seq bigint NOT NULL, through text, "
        "PRIMARY KEY (view, source)"
    ),
}

INDEXES = {
    "api_events_contract": "(view, contract_id, id) WHERE contract_id <> ''",
    "api_events_system": "(view, id) WHERE type = 'system'",
    **{f"api_events_topic{n}": f"(view, topic{n}, id) WHERE topic{n} IS NOT NULL" for n in range(1, 5)},
}


def create_statements(schema: str) -> list[str]:
    """The DDL that makes the store ready (idempotent: ``IF NOT EXISTS`` throughout)."""
    q = quoted(schema)
    out = [f"CREATE TABLE IF NOT EXISTS {q}.{name} ({cols})" for name, cols in TABLES.items()]
    out += [f"CREATE INDEX IF NOT EXISTS {name} ON {q}.api_events {spec}" for name, spec in INDEXES.items()]
    return out


def segment_key(segment: str) -> str:
    """The indexed key of one base64 topic segment."""
    if len(segment) <= KEY_LIMIT:
        return segment
    return "md5:" + hashlib.md5(segment.encode(), usedforsecurity=False).hexdigest()


def served_record(record: str) -> str:
    """An event's committed text as ``xdrFormat: base64`` serves it: a decoding job's additions
    (``,"topicJson":...`` or ``,"decodeError":...`` before the closing brace) cut off."""
    for marker in DERIVED_MARKERS:
        at = record.find(marker)
        if at >= 0:
            return record[:at] + "}"
    return record


class ProjectedRow(NamedTuple):
    """One ``api_events`` row (without the view)."""

    id: str
    ledger: int
    type: str
    contract_id: str
    topic_count: int
    topics: tuple[str | None, str | None, str | None, str | None]
    record: str


class NotAnEvent(ValueError):
    """A committed record that is not an ``EventInfo`` (not JSON, or no valid ``id``)."""


def project_record(paging_token: str, record: str) -> ProjectedRow:
    """The row of one committed event (``paging_token`` its id).

    Raises:
        NotAnEvent: the record is not an event as RPC serves it.
    """
    served = served_record(record)
    try:
        event = orjson.loads(served)
        cursor = Cursor.parse(str(event.get("id", paging_token)))
    except (orjson.JSONDecodeError, AttributeError, InvalidCursor) as exc:
        raise NotAnEvent(f"record {paging_token}: {exc}") from exc
    topic = event.get("topic") or []
    keys: list[str | None] = [segment_key(str(s)) for s in topic[:SEGMENTS]]
    keys += [None] * (SEGMENTS - len(keys))
    return ProjectedRow(
        str(cursor),
        cursor.ledger,
        str(event.get("type", "contract")),
        str(event.get("contractId") or ""),
        len(topic),
        (keys[0], keys[1], keys[2], keys[3]),
        served,
    )


def insert_rows(schema: str) -> str:
    """Insert many rows from parallel arrays (``view``, then one array per column), each event
    once: ``ON CONFLICT DO NOTHING``."""
    return (
        f"INSERT INTO {quoted(schema)}.api_events (view, id, ledger, type, contract_id, topic_count, "
        "topic1, topic2, topic3, topic4, record) "
        "SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::smallint[], "
        "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[]) ON CONFLICT DO NOTHING"
    )


def insert_params(view: str, rows: Sequence[ProjectedRow]) -> tuple[object, ...]:
    """The parameters of :func:`insert_rows` for ``rows``."""
    return (
        view,
        [r.id for r in rows],
        [r.ledger for r in rows],
        [r.type for r in rows],
        [r.contract_id for r in rows],
        [r.topic_count for r in rows],
        *([r.topics[n] for r in rows] for n in range(SEGMENTS)),
        [r.record for r in rows],
    )


def sources_of(schema: str) -> str:
    """The source jobs of a view (argument: the view twice): the job and its backfill ranges, as
    the sink knows them (each has a cursor once it committed anything)."""
    return f"SELECT job FROM {quoted(schema)}.cursors WHERE job = %s OR job LIKE %s || '~%%' ORDER BY job"


def source_batch(schema: str) -> str:
    """A source's committed cursor and its rows after a ``seq``, in one statement so in one
    snapshot (arguments: after seq, limit, job): rows ``(cursor, seq, paging_token, record)``;
    one row with NULL ``seq`` when there are none."""
    q = quoted(schema)
    return (
        f"SELECT c.cursor, e.seq, e.paging_token, e.record::text FROM {q}.cursors c "
        f"LEFT JOIN LATERAL (SELECT seq, paging_token, record FROM {q}.events "
        "WHERE job = c.job AND seq > %s ORDER BY seq LIMIT %s) e ON true WHERE c.job = %s ORDER BY e.seq"
    )


def save_progress(schema: str) -> str:
    """Record a source's progress (arguments: view, source, seq, through)."""
    return (
        f"INSERT INTO {quoted(schema)}.api_progress (view, source, seq, through) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (view, source) DO UPDATE SET seq = excluded.seq, through = excluded.through"
    )


def read_progress(schema: str) -> str:
    """A view's progress rows (argument: the view): ``(source, seq, through)``."""
    return f"SELECT source, seq, through FROM {quoted(schema)}.api_progress WHERE view = %s"


def complete_through(through: str | None) -> int | None:
    """The last ledger whose events a source position covers whole: the ledger of a
    scanned-through cursor, the one before that of an event id (its ledger may have more events
    to come); None for anything else (nothing committed yet, a non-event token)."""
    if not through:
        return None
    try:
        cursor = Cursor.parse(through)
    except InvalidCursor:
        return None
    return cursor.ledger if cursor == Cursor.through(cursor.ledger) else cursor.ledger - 1


def view_latest(view: str, progress: Sequence[tuple[str, int, str | None]]) -> int | None:
    """The latest ledger a view is complete through: its live job's (a backfill range ends in
    the past), or the furthest range's while the live job has none."""
    live = [complete_through(t) for s, _, t in progress if s == view]
    if live and live[0] is not None:
        return live[0]
    ranges = [c for s, _, t in progress if s != view and (c := complete_through(t)) is not None]
    return max(ranges) if ranges else None


def within_watermark(latest: int | None, complete_through: str | int | None) -> int | None:
    """The latest ledger a view may claim: what its projection covers, never past its live job's
    completeness watermark (issue 49) when the job has one: a ledger the job's cursor passed
    (over a history gap, or with records still to come) is not one the API holds whole."""
    if latest is None or complete_through is None:
        return latest
    return min(latest, int(complete_through))


def view_oldest(view: str, progress: Sequence[tuple[str, int, str | None]], first_event: int) -> int:
    """The oldest ledger a view holds: its oldest event's, or the first ledger of a backfill range
    (``<view>~<first>-<last>``) that is complete through its last ledger, if older (the range's
    ledgers before its first event are held too: they have none)."""
    oldest = first_event
    for source, _, through in progress:
        first, dash, last = source.removeprefix(view + "~").partition("-")
        if source.startswith(view + "~") and dash and first.isdigit() and last.isdigit():
            done = complete_through(through)
            if done is not None and done >= int(last):
                oldest = min(oldest, int(first))
    return oldest


def close_time_of(record: str) -> int:
    """An event's ledger close time as Unix seconds (from its ``ledgerClosedAt``)."""
    text = orjson.loads(record).get("ledgerClosedAt", "")
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()) if text else 0
