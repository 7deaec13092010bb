"""The streaming protocol's frames, pure (no I/O): what a client may send over ``/ws`` (or ask of
``GET /events``) and what the server answers, as JSON-RPC 2.0 text. docs/API.md's streaming section is
the protocol's description for clients.

Requests (one JSON object per text frame):

- ``{"jsonrpc": "2.0", "id": 1, "method": "subscribeEvents", "params": {"filters": [...],
  "xdrFormat": "base64"|"json", "startLedger": N | "cursor": ID}}`` (``pagination.cursor``, as
  ``getEvents`` takes it, is the same as ``cursor``) answers ``{"jsonrpc": "2.0", "id": 1,
  "result": {"subscription": SID}}``; then notifications ``{"jsonrpc": "2.0", "method": "events",
  "params": {"subscription": SID, "events": [...], "cursor": ID}}``.
- ``{"jsonrpc": "2.0", "id": 2, "method": "unsubscribeEvents", "params": {"subscription": SID}}``
  answers ``{"result": true}`` (false: no such subscription on this connection).

Errors are JSON-RPC error frames (``id`` null when the request's could not be read): -32700 parse
error, -32600 invalid request, -32601 method not found, -32602 invalid params (getEvents' own
messages for filters, cursors and ``xdrFormat``), -32005 over this node's subscriber limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from ingestion.rpc.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Cursor,
    EventFilter,
    GetEventsRequest,
    RpcError,
)

SUBSCRIBE = "subscribeEvents"
UNSUBSCRIBE = "unsubscribeEvents"
LIMIT_EXCEEDED = -32005  # the node serves as many subscriptions as it may (try another, or later)
MAX_FRAME = 64 * 1024  # bytes a request frame may hold


@attrs.frozen
class Subscribe:
    """A valid ``subscribeEvents``: its filters and format, and the id events are sent after."""

    id: Any
    filters: tuple[EventFilter, ...]
    xdr_format: str
    after: str
    start_ledger: int  # 0 when a cursor was given


@attrs.frozen
class Unsubscribe:
    id: Any
    subscription: str


class FrameError(Exception):
    """A request that gets an error frame: ``id`` (None when unknown) and the JSON-RPC error."""

    def __init__(self, id: Any, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.id = id
        self.code = code
        self.message = message


def parse_request(text: str | bytes) -> Subscribe | Unsubscribe:
    """One request frame.

    Raises:
        FrameError: what to answer instead.
    """
    if len(text) > MAX_FRAME:
        raise FrameError(None, INVALID_REQUEST, f"request frame over {MAX_FRAME} bytes")
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise FrameError(None, PARSE_ERROR, f"parse error: {exc}") from None
    if not isinstance(doc, dict):
        raise FrameError(None, INVALID_REQUEST, "invalid request: one JSON-RPC 2.0 request object per frame")
    rid = doc.get("id")
    if not isinstance(rid, str | int | None) or isinstance(rid, bool):
        rid = None
    if doc.get("jsonrpc") != "2.0" or not isinstance(doc.get("method"), str):
        raise FrameError(rid, INVALID_REQUEST, 'invalid request: needs "jsonrpc": "2.0" and a "method"')
    method, params = doc["method"], doc.get("params")
    if method == SUBSCRIBE:
        return subscribe_params(rid, params)
    if method == UNSUBSCRIBE:
        sid = params.get("subscription") if isinstance(params, Mapping) else None
        if not isinstance(sid, str):
            raise FrameError(rid, INVALID_PARAMS, 'unsubscribeEvents needs {"subscription": ID}')
        return Unsubscribe(rid, sid)
    raise FrameError(
        rid, METHOD_NOT_FOUND,
        f"method not found: {method[:64]} (this socket serves {SUBSCRIBE} and {UNSUBSCRIBE}; "
        "POST / the rest)",
    )  # fmt: skip


def subscribe_params(rid: Any, params: Any) -> Subscribe:
    """``subscribeEvents``' params checked as ``getEvents`` checks its own (the same messages).

    Raises:
        FrameError: INVALID_PARAMS.
    """
    if isinstance(params, list) and len(params) == 1:
        params = params[0]
    if not isinstance(params, Mapping):
        raise FrameError(rid, INVALID_PARAMS, "params must be an object")
    params = dict(params)
    cursor = params.pop("cursor", None)
    if cursor is not None:
        pagination = params.get("pagination")
        params["pagination"] = {**(pagination if isinstance(pagination, Mapping) else {}), "cursor": cursor}
    if params.get("endLedger"):
        raise FrameError(rid, INVALID_PARAMS, "endLedger: a subscription has no end (use getEvents)")
    try:
        request = GetEventsRequest.from_params(params)
    except RpcError as exc:
        raise FrameError(rid, exc.code, exc.message) from None
    if request.cursor is not None:
        after = str(request.cursor)
    else:
        after = str(Cursor.through(request.start_ledger - 1))
    return Subscribe(rid, request.filters, request.xdr_format or "base64", after, request.start_ledger)


def result(rid: Any, value: Any) -> str:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": value}).decode()


def error(rid: Any, code: int, message: str) -> str:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}).decode()


def notification(subscription: str, events: list[bytes], cursor: str) -> str:
    """An ``events`` notification, the events already rendered as JSON."""
    head = orjson.dumps({"subscription": subscription, "cursor": cursor})
    body = (
        b'{"jsonrpc":"2.0","method":"events","params":'
        + head[:-1]
        + b',"events":['
        + b",".join(events)
        + b"]}}"
    )
    return body.decode()


def too_many(limit: int) -> str:
    return (f"this node serves {limit} subscriptions, its limit (api.max_subscribers): "
            "subscribe on another node or later")  # fmt: skip
