"""``getEvents`` over the store: a request becomes a query plan, the plan's rows become the answer.
Pure (no I/O): the reader (:mod:`ingestion.api.reader`) runs the plan's SQL.

The rules are stellar-rpc's (:mod:`ingestion.rpc.protocol`, the simulator's
:func:`~ingestion.simulator.rpc_events.scan`) but for the scan cap: the window is what the view
holds (``oldest..latest``), a request scans from its start (``startLedger``, or after its cursor)
to ``min(endLedger, latest + 1)`` however many ledgers that is, and the answer's cursor is the
last event's id on a full page, else the scanned-through cursor of ``end - 1``.

The plan is one ordered range scan per *arm*, each stopping at the page's limit, merged in id
order (``UNION`` drops an event two arms both found). An arm is chosen per filter so that an
index answers it (see :mod:`ingestion.api.store`):

- a filter with contract ids: one arm per contract id on ``(view, contract_id, id)``;
- else a filter with topics: one arm per topic, on ``(view, topicN, id)`` for its last exact
  segment (later segments are addresses and amounts, more selective than the verb at 1); a topic
  of wildcards only is an arm on the primary key;
- a filter of ``type = system`` only: the partial index of system events;
- anything else (no filter; a type or wildcard filter): the primary key, from the start id on.

Every arm carries its filter's whole condition, so the union is exactly the matching events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs
import orjson

from ingestion.api.store import SEGMENTS, segment_key
from ingestion.decode.scval import ScValError, from_base64
from ingestion.postgres.sql import quoted
from ingestion.rpc.protocol import (
    EVENT_TYPES,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    RANGE_MESSAGE,
    WILDCARD_ANY,
    WILDCARD_ONE,
    Cursor,
    EventFilter,
    GetEventsRequest,
    RpcError,
)


@attrs.frozen
class Window:
    """What a view holds: ledgers ``oldest..latest`` and their close times (Unix seconds)."""

    oldest: int
    latest: int
    oldest_close: int = 0
    latest_close: int = 0


@attrs.frozen
class Plan:
    """A ``getEvents`` request planned: scan ids ``start`` (inclusive) to ``Cursor(end_ledger)``
    (exclusive), at most ``limit`` events; ``sql`` None when the range is empty."""

    start: Cursor
    end_ledger: int
    limit: int
    sql: str | None
    params: tuple[Any, ...]
    xdr_format: str


def plan(request: GetEventsRequest, window: Window, schema: str, view: str, default_limit: int = 100) -> Plan:
    """The query plan of a validated request.

    Raises:
        RpcError: INVALID_REQUEST, the start outside the window (stellar-rpc's message).
    """
    start = request.cursor.successor() if request.cursor is not None else Cursor(request.start_ledger)
    if start.ledger < window.oldest or start.ledger > window.latest:
        raise RpcError(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=window.oldest, latest=window.latest))
    end_ledger = window.latest + 1
    if request.end_ledger:
        end_ledger = min(request.end_ledger, end_ledger)
    limit = request.limit or default_limit
    fmt = request.xdr_format or "base64"
    if end_ledger <= start.ledger:
        return Plan(start, end_ledger, limit, None, (), fmt)
    sql, params = events_sql(schema, view, str(start), str(Cursor(end_ledger)), request.filters, limit)
    return Plan(start, end_ledger, limit, sql, params, fmt)


def events_sql(
    schema: str, view: str, low: str, high: str, filters: Sequence[EventFilter], limit: int
) -> tuple[str, tuple[Any, ...]]:
    """``SELECT id, record`` of the events of ``view`` with ids in ``[low, high)`` that match
    ``filters``, in id order, at most ``limit``."""
    arms: dict[tuple[str, tuple[Any, ...]], None] = {}
    for cond in _arm_conditions(filters):
        arms[cond] = None
    if ("", ()) in arms:  # one arm takes every event in range: the others add nothing
        arms = {("", ()): None}
    q = quoted(schema)
    selects: list[str] = []
    params: list[Any] = []
    for text, cond_params in arms:
        where = f" AND {text}" if text else ""
        selects.append(
            f"SELECT id, record FROM {q}.api_events WHERE view = %s AND id >= %s AND id < %s{where} "
            "ORDER BY id LIMIT %s"
        )
        params += [view, low, high, *cond_params, limit]
    if len(selects) == 1:
        return selects[0], tuple(params)
    union = " UNION ".join(f"({s})" for s in selects)
    return f"SELECT id, record FROM ({union}) AS arms ORDER BY id LIMIT %s", (*params, limit)


def _arm_conditions(filters: Sequence[EventFilter]) -> list[tuple[str, tuple[Any, ...]]]:
    if not filters:
        return [("", ())]
    out: list[tuple[str, tuple[Any, ...]]] = []
    for f in filters:
        kind, kind_params = _type_condition(f.types)
        topics, topic_params = _topics_condition(f.topics)
        if f.contract_ids:
            for cid in dict.fromkeys(f.contract_ids):
                out.append(_joined((kind, kind_params), ("contract_id = %s", (cid,)), (topics, topic_params)))
        elif f.topics:
            for topic in dict.fromkeys(f.topics):
                out.append(_joined((kind, kind_params), _topic_condition(topic)))
        else:
            out.append((kind, kind_params))
    return out


def _joined(*parts: tuple[str, tuple[Any, ...]]) -> tuple[str, tuple[Any, ...]]:
    conds = [c for c, _ in parts if c]
    return " AND ".join(conds), tuple(p for _, ps in parts for p in ps)


def _type_condition(types: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    wanted = set(types)
    if not wanted or wanted >= set(EVENT_TYPES):
        return "", ()
    (kind,) = wanted
    return "type = %s", (kind,)


def _topics_condition(topics: Sequence[Sequence[str]]) -> tuple[str, tuple[Any, ...]]:
    if not topics:
        return "", ()
    parts = [_topic_condition(t) for t in dict.fromkeys(tuple(t) for t in topics)]
    if len(parts) == 1:
        return parts[0]
    return "(" + " OR ".join(f"({c})" for c, _ in parts) + ")", tuple(p for _, ps in parts for p in ps)


def _topic_condition(topic: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
    """One topic filter as SQL: the segment count, then each exact segment's key (the last exact
    one first: the index the planner should take)."""
    body = list(topic[:-1]) if topic and topic[-1] == WILDCARD_ANY else list(topic)
    conds = [f"topic_count >= {len(body)}" if len(body) < len(topic) else f"topic_count = {len(body)}"]
    params: list[Any] = []
    exact = [(n, s) for n, s in enumerate(body[:SEGMENTS], 1) if s != WILDCARD_ONE]
    for n, segment in reversed(exact):
        conds.append(f"topic{n} = %s")
        params.append(segment_key(segment))
    return " AND ".join(conds), tuple(params)


# -- the answer ---------------------------------------------------------------------------------


class Page(NamedTuple):
    """A plan's events as the answer sends them: how many, the last one's id, their JSON texts
    joined by commas."""

    size: int
    last_id: str | None
    events: bytes


EMPTY = Page(0, None, b"")


def rendered_sql(sql: str) -> str:
    """The page of ``sql`` (``SELECT id, record``, in id order) as one row rendered by PostgreSQL:
    the count, the last id and the records joined by commas (the page's ``events`` of
    ``xdrFormat: base64`` as they are sent: Python splices them, never parses them)."""
    return (
        "SELECT count(*), max(page.id), coalesce(string_agg(page.record, ',' ORDER BY page.id), '') "
        f"FROM ({sql}) AS page"
    )


def page_of(rows: Sequence[tuple[str, str]], xdr_format: str) -> Page:
    """The page of ``(id, record)`` rows in ``xdr_format`` (``json``: rendered here)."""
    render = json_format if xdr_format == "json" else _as_is
    return Page(len(rows), rows[-1][0] if rows else None, b",".join([render(record) for _, record in rows]))


def page_cursor(plan: Plan, count: int, last_id: str | None) -> str:
    """The answer's cursor: the last event's id on a full page, else scanned through ``end - 1``."""
    if last_id is not None and count >= plan.limit:
        return last_id
    return str(Cursor.through(plan.end_ledger - 1))


def events_result(plan: Plan, page: Page | Sequence[tuple[str, str]], window: Window) -> bytes:
    """The JSON ``result`` of ``getEvents`` (``page``: rendered, or ``(id, record)`` rows in id
    order, rendered here in the plan's format)."""
    if not isinstance(page, Page):
        page = page_of(page, plan.xdr_format)
    tail = orjson.dumps(
        {
            "cursor": page_cursor(plan, page.size, page.last_id),
            "latestLedger": window.latest,
            "oldestLedger": window.oldest,
            "latestLedgerCloseTime": str(window.latest_close),
            "oldestLedgerCloseTime": str(window.oldest_close),
        }
    )
    return b'{"events":[' + page.events + b"]," + tail[1:]


def _as_is(record: str) -> bytes:
    return record.encode()


def json_format(record: str) -> bytes:
    """An event as ``xdrFormat: json`` sends it: ``topicJson`` and ``valueJson`` (SEP-51) in
    place of ``topic`` and ``value``, after the same head.

    Raises:
        RpcError: INTERNAL_ERROR, a stored ScVal that does not decode.
    """
    cut = record.find(',"topic":')
    if cut < 0:
        cut = record.find(',"value":')
    if cut < 0:
        return record.encode()
    event = orjson.loads(record)
    tail: dict[str, Any] = {}
    try:
        if event.get("topic"):
            tail["topicJson"] = [from_base64(t) for t in event["topic"]]
        if event.get("value"):
            tail["valueJson"] = from_base64(event["value"])
    except ScValError as exc:
        raise RpcError(INTERNAL_ERROR, f"event {event.get('id')}: {exc}") from exc
    return record[:cut].encode() + b"," + orjson.dumps(tail)[1:]
