"""Stellar RPC ``getEvents``: the API's own rules, pure (no I/O), shared by the node and the simulator.

Everything here follows stellar-rpc v28 (``cmd/stellar-rpc/internal/methods/get_events.go``) and the
protocol types it uses (``protocols/rpc``: ``Cursor``, ``GetEventsRequest.Valid``,
``EventFilter.Matches``), with the same error messages, so that the simulator answers as a real
server does and the node can check its own filters before it starts.

- An event id (a *cursor*) is ``"%019d-%010d"``: the TOID of (ledger, transaction, operation) and
  the event's index. Ids ascend in ledger, transaction, operation, event order.
- An answer's ``cursor`` is the last event's id when the page is full, else the largest cursor of
  the last ledger scanned (``endLedger - 1``: "scanned through"); a request with
  ``pagination.cursor`` resumes strictly after it. Neither is ever past the answer's
  ``latestLedger`` (:func:`past_latest`).
- Filters are OR-ed; inside one filter, type, contract ids and topics are AND-ed; a filter's topics
  are OR-ed; a topic is 1 to 4 segments, each an exact base64 ScVal or ``*`` (any one segment),
  optionally followed by a trailing ``**`` (any number of further segments, zero included).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

MAX_FILTERS = 5
MAX_CONTRACT_IDS = 5
MAX_TOPICS = 5
MIN_TOPIC_SEGMENTS = 1
MAX_TOPIC_SEGMENTS = 4
MAX_LIMIT = 10_000  # the server's default max (MaxEventsLimit)
DEFAULT_LIMIT = 100  # the server's default page (DefaultEventsLimit)
LEDGER_SCAN_LIMIT = 10_000  # ledgers one request scans at most
WILDCARD_ONE = "*"
WILDCARD_ANY = "**"
EVENT_TYPES = ("contract", "system")  # what a filter may ask for ("diagnostic" is never stored)

# JSON-RPC error codes the server uses.
INVALID_REQUEST = -32600  # also: startLedger (or a cursor) outside the ledger range
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
PARSE_ERROR = -32700
PROCESSING_LIMIT = -32001  # "request exceeded processing limit threshold" (a slow request)

TX_MASK = (1 << 20) - 1
OP_MASK = (1 << 12) - 1
MAX_EVENT = (1 << 32) - 1
MAX_LEDGER = (1 << 31) - 1

RANGE_MESSAGE = "startLedger must be within the ledger range: {oldest} - {latest}"
_RANGE = re.compile(r"startLedger must be within the ledger range: (\d+) - (\d+)")


@attrs.frozen
class Caps:
    """How many filters a request, and contract ids and topics a filter, may carry (the
    server's: :data:`DEFAULT_CAPS`; a server of our own may allow more)."""

    filters: int = MAX_FILTERS
    contract_ids: int = MAX_CONTRACT_IDS
    topics: int = MAX_TOPICS


DEFAULT_CAPS = Caps()


class RpcError(Exception):
    """A JSON-RPC error: ``code`` and the server's ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class InvalidCursor(ValueError):
    """Not an event id ``<toid>-<event index>``."""


@attrs.frozen(order=True)
class Cursor:
    """A position among events: ledger, transaction index (1-based), operation index, event index."""

    ledger: int
    tx: int = 0
    op: int = 0
    event: int = 0

    def __str__(self) -> str:
        toid = (self.ledger << 32) | ((self.tx & TX_MASK) << 12) | (self.op & OP_MASK)
        return f"{toid:019d}-{self.event:010d}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """An event id as the server parses it (``ParseCursor``).

        Raises:
            InvalidCursor: with the server's message.
        """
        head, dash, tail = text.partition("-")
        if not dash or not head.isdigit() or not tail.isdigit() or not head.isascii():
            raise InvalidCursor(f"invalid event id {text}")
        toid, event = int(head), int(tail)
        if toid >= 1 << 63 or event > MAX_EVENT:
            raise InvalidCursor(f"invalid event id {text}")
        return cls(toid >> 32, (toid >> 12) & TX_MASK, toid & OP_MASK, event)

    @classmethod
    def through(cls, ledger: int) -> Cursor:
        """The largest cursor of ``ledger``: "every event of this ledger has been scanned"."""
        return cls(ledger, TX_MASK, OP_MASK, MAX_EVENT)

    def successor(self) -> Cursor:
        """Where a request resuming after this cursor starts (the server's ``Event++``, which
        wraps a uint32 around: after a scanned-through cursor the scan starts within the same
        ledger, past every event in it)."""
        return attrs.evolve(self, event=(self.event + 1) & MAX_EVENT)


def event_head(
    kind: str, cursor: Cursor, closed_at: str, contract_id: str, tx_hash: str, successful: bool
) -> dict[str, Any]:
    """An event's fields before ``topic`` and ``value``, in the order RPC's ``EventInfo`` sends
    them (``contractId`` "" for none; ``inSuccessfulContractCall``: its transaction succeeded)."""
    return {
        "type": kind,
        "ledger": cursor.ledger,
        "ledgerClosedAt": closed_at,
        "contractId": contract_id,
        "id": str(cursor),
        "operationIndex": cursor.op,
        "transactionIndex": cursor.tx,
        "txHash": tx_hash,
        "inSuccessfulContractCall": successful,
    }


def past_latest(cursor: Cursor, latest: int) -> bool:
    """Whether ``cursor`` lies beyond ledger ``latest``, the newest closed ledger an answer reports
    (``latestLedger``): a server scans at most through it (``endLedger - 1 <= latestLedger``), so an
    answer's cursor or event past it names ledgers that have not closed, and is not to be believed."""
    return cursor > Cursor.through(latest)


def parse_start(text: str, source: str) -> int | Cursor:
    """A job's start cursor for a getEvents source (RPC or a lake): ``0`` (the oldest ledger kept,
    returned as 0), a ledger number (1 to ``MAX_LEDGER``) or an event id.

    The ledger bound is the event id's: an id is a TOID, whose ledger is a non-negative int32
    (stellar-rpc builds ids with ``toid.New(ledger int32, ...)``), so no event past ledger 2^31 - 1
    can be named, though ``startLedger`` is a uint32 on the wire.

    Raises:
        ValueError: none of those; the message names ``source`` ("an RPC", "a lake").
    """
    start = text.strip()
    if start == "0":
        return 0
    if start.isdigit():
        if not 0 < int(start) <= MAX_LEDGER:
            raise ValueError(f"start ledger {start} out of range")
        return int(start)
    try:
        return Cursor.parse(start)
    except InvalidCursor as exc:
        raise ValueError(
            f"not {source} start cursor: {start!r} (now, 0, a ledger number or an event id)"
        ) from exc


def is_event_id(text: str) -> bool:
    try:
        Cursor.parse(text)
    except InvalidCursor:
        return False
    return True


def ledger_range_of(message: str) -> tuple[int, int] | None:
    """``(oldest, latest)`` from the server's "startLedger must be within the ledger range" error
    (it is also the answer to a cursor outside the range), else None."""
    m = _RANGE.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


# -- ScVal topic segments -------------------------------------------------------------------------


def decode_scval(text: str) -> bytes:
    """The canonical XDR of a base64 ScVal.

    Raises:
        ValueError: not base64, or not one complete ScVal.
    """
    from stellar_sdk import xdr  # lazy: start-up time (stellar_sdk, ~700 ms)

    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {text!r}") from exc
    try:
        value = xdr.SCVal.from_xdr_bytes(raw)
    except Exception as exc:  # xdrlib3 raises several kinds; all mean "not an ScVal"
        raise ValueError(f"not an XDR ScVal: {text!r}") from exc
    canonical: bytes = value.to_xdr_bytes()
    if canonical != raw:
        raise ValueError(f"trailing or non-canonical bytes in ScVal {text!r}")
    return canonical


_TYPED = ("sym", "str", "address", "bool", "u32", "i32", "u64", "i64", "u128", "i128")


def segment_from_text(text: str) -> str:
    """A topic segment as an operator writes it: ``*``, ``**``, a base64 ScVal, or a typed value
    ``sym:transfer``, ``str:TEXT``, ``address:G...|C...``, ``bool:true``, ``u32:N``, ``i32:N``,
    ``u64:N``, ``i64:N``, ``u128:N``, ``i128:N``. Returns the wire form (a wildcard or base64).

    Raises:
        ValueError: says what is wrong with the segment.
    """
    text = text.strip()
    if text in (WILDCARD_ONE, WILDCARD_ANY):
        return text
    kind, colon, value = text.partition(":")
    if colon and kind in _TYPED:
        from stellar_sdk import scval  # lazy: start-up time (stellar_sdk, ~700 ms)

        try:
            if kind == "sym":
                sc = scval.to_symbol(value)
            elif kind == "str":
                sc = scval.to_string(value)
            elif kind == "address":
                sc = scval.to_address(value)
            elif kind == "bool":
                if value not in ("true", "false"):
                    raise ValueError("bool: must be true or false")
                sc = scval.to_bool(value == "true")
            else:
                sc = getattr(scval, f"to_{'int' if kind[0] == 'i' else 'uint'}{kind[1:]}")(int(value))
        except Exception as exc:
            raise ValueError(f"bad {kind}: segment {value!r}: {exc}") from exc
        return str(sc.to_xdr())
    decode_scval(text)  # raises ValueError for anything else
    return text


def topic_from_text(text: str) -> tuple[str, ...]:
    """``SEG[,SEG...]`` (a ``--topic`` flag) as wire segments."""
    return tuple(segment_from_text(s) for s in text.split(","))


# -- filters ----------------------------------------------------------------------------------------


@attrs.frozen
class EventFilter:
    """One ``getEvents`` filter. ``topics``: each a tuple of wire segments (wildcard or base64)."""

    types: tuple[str, ...] = ()
    contract_ids: tuple[str, ...] = ()
    topics: tuple[tuple[str, ...], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.types:
            out["type"] = ",".join(self.types)
        if self.contract_ids:
            out["contractIds"] = list(self.contract_ids)
        if self.topics:
            out["topics"] = [list(t) for t in self.topics]
        return out

    @classmethod
    def from_json(cls, raw: Any) -> EventFilter:
        """Decode a filter as the server's JSON decoding does (types and shapes only).

        Raises:
            RpcError: INVALID_PARAMS, a shape the server cannot decode.
        """
        if not isinstance(raw, Mapping):
            raise _params("filter must be an object")
        kind = _go_field(raw, "type", "")
        if not isinstance(kind, str):
            raise _params("filter type must be a string")
        ids = _go_field(raw, "contractIds", [])
        topics = _go_field(raw, "topics", [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise _params("contractIds must be a list of strings")
        if not isinstance(topics, list) or not all(isinstance(t, list) for t in topics):
            raise _params("topics must be a list of lists of segments")
        decoded: list[tuple[str, ...]] = []
        for topic in topics:
            segments = []
            for segment in topic:
                if not isinstance(segment, str):
                    raise _params("a topic segment must be a string")
                if segment not in (WILDCARD_ONE, WILDCARD_ANY):
                    try:
                        decode_scval(segment)
                    except ValueError as exc:
                        raise _params(f"xdr:decode: {exc}") from exc
                segments.append(segment)
            decoded.append(tuple(segments))
        types = tuple(k for k in kind.split(",")) if kind else ()
        return cls(types, tuple(ids), tuple(decoded))

    def problem(self, caps: Caps | None = None) -> str | None:
        """The server's ``EventFilter.Valid`` message, or None when valid (``caps``: the
        server's, unless given)."""
        caps = caps or DEFAULT_CAPS
        for t in self.types:
            if t not in EVENT_TYPES:
                return "filter type invalid: if set, type must be either 'system' or 'contract'"
        if len(self.contract_ids) > caps.contract_ids:
            return f"maximum {caps.contract_ids} contract IDs per filter"
        if len(self.topics) > caps.topics:
            return f"maximum {caps.topics} topics per filter"
        for i, cid in enumerate(self.contract_ids, 1):
            if not is_contract_id(cid):
                return f"contract ID {i} invalid"
        for i, topic in enumerate(self.topics, 1):
            bad = topic_problem(topic)
            if bad:
                return f"topic {i} invalid: {bad}"
        return None

    def matches(self, event_type: str, contract_id: str, topics: Sequence[str]) -> bool:
        """The server's ``EventFilter.Matches``: ``topics`` are the event's base64 segments."""
        if self.types and event_type not in self.types:
            return False
        if self.contract_ids and contract_id not in self.contract_ids:
            return False
        return not self.topics or any(topic_matches(t, topics) for t in self.topics)


def topic_problem(topic: Sequence[str]) -> str | None:
    """The server's ``TopicFilter.Valid`` message, or None."""
    if len(topic) < MIN_TOPIC_SEGMENTS:
        return f"topic must have at least {MIN_TOPIC_SEGMENTS} segment"
    body = topic[:-1] if topic[-1] == WILDCARD_ANY else topic
    for i, segment in enumerate(body, 1):
        if segment == WILDCARD_ANY:
            return f"segment {i} invalid: wildcard '**' is only allowed as the last segment"
    if len(body) > MAX_TOPIC_SEGMENTS:
        return f"topic cannot have more than {MAX_TOPIC_SEGMENTS} segments"
    return None


def topic_matches(topic: Sequence[str], event_topics: Sequence[str]) -> bool:
    """The server's ``TopicFilter.Matches``: without a trailing ``**`` the lengths must be equal;
    with one, the event needs at least the segments before it."""
    if topic and topic[-1] == WILDCARD_ANY:
        body = topic[:-1]
        if len(event_topics) < len(body):
            return False
    elif len(event_topics) != len(topic):
        return False
    else:
        body = topic
    return all(s == WILDCARD_ONE or s == e for s, e in zip(body, event_topics, strict=False))


def is_contract_id(text: str) -> bool:
    from stellar_sdk.strkey import StrKey  # lazy: start-up time (stellar_sdk, ~700 ms)

    try:
        return bool(StrKey.is_valid_contract(text))
    except Exception:
        return False


def filters_problem(filters: Sequence[EventFilter], caps: Caps | None = None) -> str | None:
    """The server's message for invalid filters (as in ``GetEventsRequest.Valid``), or None."""
    caps = caps or DEFAULT_CAPS
    if len(filters) > caps.filters:
        return f"maximum {caps.filters} filters per request"
    for i, f in enumerate(filters, 1):
        bad = f.problem(caps)
        if bad:
            return f"filter {i} invalid: {bad}"
    return None


def checked_filters(value: Sequence[EventFilter]) -> tuple[EventFilter, ...]:
    """``value`` as a tuple, checked as the server checks filters (an attrs converter).

    Raises:
        ValueError: the server's message for invalid filters.
    """
    filters = tuple(value)
    problem = filters_problem(filters)
    if problem:
        raise ValueError(problem)
    return filters


def matches(filters: Iterable[EventFilter], event_type: str, contract_id: str, topics: Sequence[str]) -> bool:
    """``GetEventsRequest.Matches``: no filter matches everything; else any filter."""
    filters = list(filters)
    return not filters or any(f.matches(event_type, contract_id, topics) for f in filters)


# -- the request ----------------------------------------------------------------------------------


@attrs.frozen
class GetEventsRequest:
    start_ledger: int = 0
    end_ledger: int = 0
    filters: tuple[EventFilter, ...] = ()
    cursor: Cursor | None = None
    limit: int = 0
    xdr_format: str = ""

    def to_params(self) -> dict[str, Any]:
        """The JSON ``params`` of this request, as a client sends them."""
        params: dict[str, Any] = {"filters": [f.to_json() for f in self.filters]}
        if self.start_ledger:
            params["startLedger"] = self.start_ledger
        if self.end_ledger:
            params["endLedger"] = self.end_ledger
        pagination: dict[str, Any] = {}
        if self.cursor is not None:
            pagination["cursor"] = str(self.cursor)
        if self.limit:
            pagination["limit"] = self.limit
        if pagination:
            params["pagination"] = pagination
        if self.xdr_format:
            params["xdrFormat"] = self.xdr_format
        return params

    @classmethod
    def from_params(
        cls, params: Any, max_limit: int = MAX_LIMIT, caps: Caps | None = None
    ) -> GetEventsRequest:
        """Decode and validate ``params`` as the server does (decode, then ``Valid``), with the
        server's caps on filters unless ``caps`` are given.

        Raises:
            RpcError: INVALID_PARAMS with the server's message.
        """
        if isinstance(params, list) and len(params) == 1:
            params = params[0]
        if not isinstance(params, Mapping):
            raise _params("params must be an object")
        start, end = _go_field(params, "startLedger", 0), _go_field(params, "endLedger", 0)
        for name, value in (("startLedger", start), ("endLedger", end)):
            if not _uint32(value):
                raise _params(f"json: cannot unmarshal {value!r} into Go struct field {name} of type uint32")
        raw_filters = _go_field(params, "filters", [])
        if not isinstance(raw_filters, list):
            raise _params("filters must be a list")
        filters = tuple(EventFilter.from_json(f) for f in raw_filters)
        pagination = _go_field(params, "pagination", {})
        if not isinstance(pagination, Mapping):
            raise _params("pagination must be an object")
        cursor = None
        if pagination.get("cursor") not in (None, ""):
            raw_cursor = pagination["cursor"]
            if not isinstance(raw_cursor, str):
                raise _params("pagination.cursor must be a string")
            try:
                cursor = Cursor.parse(raw_cursor)
            except InvalidCursor as exc:
                raise _params(str(exc)) from exc
        limit = _go_field(pagination, "limit", 0)
        if not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0):
            raise _params(f"json: cannot unmarshal {limit!r} into Go struct field limit of type uint")
        fmt = _go_field(params, "xdrFormat", "")
        request = cls(int(start), int(end), filters, cursor, limit, fmt if isinstance(fmt, str) else "?")
        problem = request.problem(max_limit, caps)
        if problem:
            raise _params(problem)
        return request

    def problem(self, max_limit: int = MAX_LIMIT, caps: Caps | None = None) -> str | None:
        """``GetEventsRequest.Valid``: the server's message, or None."""
        if self.xdr_format not in ("", "base64", "json"):
            return f"got '{self.xdr_format}': expected base64, json for optional 'xdrFormat'"
        if self.cursor is not None:
            if self.start_ledger or self.end_ledger:
                return "ledger ranges and cursor cannot both be set"
        elif self.start_ledger <= 0:
            return "startLedger must be positive"
        if self.limit > max_limit:
            return f"limit must not exceed {max_limit}"
        return filters_problem(self.filters, caps)


def _go_field(obj: Mapping[str, Any], name: str, zero: Any) -> Any:
    """``obj[name]`` as Go's ``encoding/json`` fills a struct field: a missing field or a JSON
    ``null`` leaves it at its zero value (clients such as stellar-sdk's ``SorobanServer`` send
    ``"endLedger": null``, ``"cursor": null``), so both read as ``zero`` here."""
    value = obj.get(name)
    return zero if value is None else value


def _uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF


def _params(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, message)
