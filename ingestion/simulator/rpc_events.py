"""The simulated chain's contract events, as a Stellar RPC serves them, and ``getEvents``' scan. Pure.

Every ledger's events are a function of the chain's seed and that ledger's Horizon records only,
so the RPC side and the Horizon side describe one chain:

- each ``invoke_host_function`` operation emits a SAC ``transfer`` event from its first
  ``asset_balance_changes`` entry: contract event of the receiving contract, topic
  ``[Symbol("transfer"), Address(from), Address(to), String("native" | "CODE:ISSUER")]``, value
  ``I128(amount in stroops)``;
- a per-operation ``random.Random(f"rpc-events:{seed}:{op_toid}")`` (never the chain builder's
  generator: Horizon's records stay as they are) adds, for about half of the operations, a second
  event of another shape, so that filters with ``*`` and ``**`` have something to tell apart:
  ``[Symbol("approve"), Address(from), Address(spender), String(asset)]`` value ``I128``,
  ``[Symbol("counter"), U32(n)]`` value ``U64``, or ``[Symbol("ping")]`` value ``Bool``;
- every ledger whose sequence is a multiple of :data:`SYSTEM_EVERY` and which has a transaction
  ends with one ``system`` event in stellar-core's AfterAllTxs position
  (``Cursor(ledger, TX_MASK, 0, 0)``): no contract (``contractId`` ""), topic
  ``[Symbol("ledger_closed"), U32(sequence)]``, value ``U64(close time)``, and the hash of the
  ledger's last transaction (the real server stores such events under a transaction's hash too).

Cursors follow stellar-rpc's ``db/event.go``: ``Tx`` is the transaction's 1-based application
order, ``Op`` the 0-based operation index inside it (Horizon's TOIDs count operations from 1, so
``op = horizon_op_index - 1``), ``Event`` the 0-based index of the event inside the operation.

Built events are kept per ledger, compact (one :class:`RpcEvent` tuple per event, its JSON object
pre-rendered), in an LRU of their own bounded by an event count: paging a long history costs one
build per ledger, and the chain's record cache (Horizon's) is not crowded by them.
"""

from __future__ import annotations

import bisect
import functools
import gc
import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from ingestion.rpc.protocol import (
    DEFAULT_LIMIT,
    INVALID_REQUEST,
    LEDGER_SCAN_LIMIT,
    MAX_EVENT,
    RANGE_MESSAGE,
    TX_MASK,
    Cursor,
    EventFilter,
    GetEventsRequest,
    RpcError,
    event_head,
    matches,
)
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import timestamp
from ingestion.simulator.render import go_json

SYSTEM_EVERY = 20  # a system event in every ledger whose sequence is a multiple of this
STROOPS_PER_UNIT = 10_000_000

#: An ScVal as the simulator describes it before encoding: (kind, value), kind one of
#: symbol, address, string, i128, u32, u64, bool.
ScSpec = tuple[str, Any]


class RpcEvent(NamedTuple):
    """One event, compact: what the scan compares and the bytes it sends.

    ``key`` is the event id as one integer (``toid << 32 | event``: it orders as the id does);
    ``body`` the event's JSON object with base64 topic and value; ``head`` how many bytes of
    ``body`` come before ``"topic"`` (the part shared with ``xdrFormat: json``); ``specs`` the
    topic segments then the value, to render that format on demand.
    """

    key: int
    type: str
    contract_id: str
    topics: tuple[str, ...]
    body: bytes
    head: int
    specs: tuple[ScSpec, ...]

    @property
    def id(self) -> str:
        return f"{self.key >> 32:019d}-{self.key & MAX_EVENT:010d}"


def cursor_key(cursor: Cursor) -> int:
    """A cursor as one integer, ordered as cursors are (see :attr:`RpcEvent.key`)."""
    toid = (cursor.ledger << 32) | ((cursor.tx & TX_MASK) << 12) | (cursor.op & 0xFFF)
    return (toid << 32) | (cursor.event & MAX_EVENT)


# -- ScVals ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _b64_cached(kind: str, value: Any) -> str:
    return _encode(kind, value)


def _encode(kind: str, value: Any) -> str:
    return str(scval_of((kind, value)).to_xdr())


def scval_of(spec: ScSpec) -> Any:
    """An ScVal spec as stellar-sdk's ``SCVal``."""
    kind, value = spec
    return _encoders()[kind](value)


@functools.cache
def _encoders() -> dict[str, Any]:
    from stellar_sdk import scval  # lazy: stellar_sdk (~700 ms): the Horizon side never needs it

    return {
        "symbol": scval.to_symbol,
        "address": scval.to_address,
        "string": scval.to_string,
        "i128": scval.to_int128,
        "u32": scval.to_uint32,
        "u64": scval.to_uint64,
        "bool": scval.to_bool,
    }


def scval_b64(spec: ScSpec) -> str:
    """The base64 XDR of an ScVal spec (symbols, addresses and strings repeat: cached)."""
    kind, value = spec
    if kind in ("i128", "u64"):
        return _encode(kind, value)
    return _b64_cached(kind, value)


def scval_json(spec: ScSpec) -> Any:
    """The ScVal as stellar-xdr's JSON (what ``xdrFormat: json`` sends): 64- and 128-bit integers as
    strings, ``{"symbol": "transfer"}``, ``{"address": "G..."}``, ``{"u32": 5}``, ``{"bool": true}``."""
    kind, value = spec
    if kind in ("i128", "u64"):
        return {kind: str(value)}
    return {kind: value}


def stroops_of(amount: str) -> int:
    """Horizon's ``"12.3456789"`` as an integer number of stroops."""
    whole, _, fraction = amount.partition(".")
    return int(whole) * STROOPS_PER_UNIT + int((fraction + "0000000")[:7])


def _asset_text(change: dict[str, Any]) -> str:
    if change["asset_type"] == "native":
        return "native"
    return f"{change['asset_code']}:{change['asset_issuer']}"


# -- building one ledger's events --------------------------------------------------------------------


def ledger_events(chain: Chain, seq: int) -> tuple[RpcEvent, ...]:
    """Build ledger ``seq``'s events, ascending by id (the ledger must be held by the chain)."""
    content = chain.content(seq)
    closed_at = timestamp(chain.closed_at(seq))
    seed = chain.spec.seed
    out: list[RpcEvent] = []
    records = content.records
    last_tx_hash = ""
    for key in content.kinds["operations"]:
        record = records[key]
        last_tx_hash = record["transaction_hash"]
        if record["type"] != "invoke_host_function":
            continue
        op_toid = int(record["id"])
        tx, op = (op_toid >> 12) & TX_MASK, (op_toid & 0xFFF) - 1
        change = record["asset_balance_changes"][0]
        contract, source = change["to"], change["from"]
        asset = ("string", _asset_text(change))
        shapes: list[tuple[tuple[ScSpec, ...], ScSpec]] = [
            (
                (("symbol", "transfer"), ("address", source), ("address", contract), asset),
                ("i128", stroops_of(change["amount"])),
            )
        ]
        rng = random.Random(f"rpc-events:{seed}:{op_toid}")
        roll = rng.random()
        if roll < 0.25:
            spender = chain.accounts[6 + rng.randrange(len(chain.accounts) - 6)]
            shapes.append(
                (
                    (("symbol", "approve"), ("address", source), ("address", spender), asset),
                    ("i128", rng.randrange(1, 10**12)),
                )
            )
        elif roll < 0.4:
            shapes.append(
                ((("symbol", "counter"), ("u32", rng.randrange(1 << 16))), ("u64", rng.randrange(1 << 40)))
            )
        elif roll < 0.5:
            shapes.append(((("symbol", "ping"),), ("bool", rng.random() < 0.5)))
        for index, (topic, value) in enumerate(shapes):
            cursor = Cursor(seq, tx, op, index)
            out.append(
                _event(cursor, "contract", contract, topic, value, closed_at, record["transaction_hash"])
            )
    if seq % SYSTEM_EVERY == 0 and last_tx_hash:
        topic = (("symbol", "ledger_closed"), ("u32", seq))
        value = ("u64", chain.closed_at(seq))
        out.append(_event(Cursor(seq, TX_MASK, 0, 0), "system", "", topic, value, closed_at, last_tx_hash))
    return tuple(out)


def _event(
    cursor: Cursor,
    kind: str,
    contract_id: str,
    topic: tuple[ScSpec, ...],
    value: ScSpec,
    closed_at: str,
    tx_hash: str,
) -> RpcEvent:
    head = go_json(event_head(kind, cursor, closed_at, contract_id, tx_hash, True), indent=False)[:-1]
    topics = tuple(scval_b64(s) for s in topic)
    tail = go_json({"topic": list(topics), "value": scval_b64(value)}, indent=False)[1:]
    body = head + b"," + tail
    return RpcEvent(cursor_key(cursor), kind, contract_id, topics, body, len(head) + 1, (*topic, value))


def json_format(event: RpcEvent) -> bytes:
    """The event as ``xdrFormat: json`` sends it: ``topicJson`` and ``valueJson`` in place of
    ``topic`` and ``value``."""
    *topic, value = event.specs
    tail = go_json(
        {"topicJson": [scval_json(s) for s in topic], "valueJson": scval_json(value)}, indent=False
    )
    return event.body[: event.head] + tail[1:]


# -- the per-ledger cache and the scan -----------------------------------------------------------


class EventLog:
    """The chain's events by ledger, built on demand and kept in a bounded LRU.

    Args:
        chain: the chain whose ``invoke_host_function`` operations the events come from.
        cache_events: about how many built events to keep (an empty ledger counts as one).
    """

    def __init__(self, chain: Chain, cache_events: int = 200_000):
        self.chain = chain
        self._cache: OrderedDict[int, tuple[RpcEvent, ...]] = OrderedDict()
        self._cache_events = cache_events
        self._size = 0

    def events(self, seq: int) -> tuple[RpcEvent, ...]:
        """Ledger ``seq``'s events; none for a ledger the chain does not hold (before its
        oldest, after its latest: what a reset or lagging RPC may ask about)."""
        cached = self._cache.get(seq)
        if cached is not None:
            self._cache.move_to_end(seq)
            return cached
        if not self.chain.first <= seq <= self.chain.latest:
            return ()
        # Events hold no reference cycles: keep the cyclic GC from re-scanning the caches meanwhile.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            built = ledger_events(self.chain, seq)
        finally:
            if gc_was_enabled:
                gc.enable()
        self._cache[seq] = built
        self._size += max(1, len(built))
        while self._size > self._cache_events and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._size -= max(1, len(old))
        return built


class EventsPage(NamedTuple):
    """A ``getEvents`` answer before rendering: the events and the answer's cursor."""

    events: list[RpcEvent]
    cursor: str


def scan(log: EventLog, request: GetEventsRequest, oldest: int, latest: int) -> EventsPage:
    """``getEvents`` as stellar-rpc's ``get_events.go`` runs it, over ledgers ``oldest..latest``.

    The scan starts at the cursor's successor (or ``Cursor(startLedger)``), ends before
    ``min(latest + 1, start + LEDGER_SCAN_LIMIT, endLedger)``, keeps the events that match the
    filters up to the limit; the answer's cursor is the last event's id on a full page, else the
    scanned-through cursor of the last ledger scanned.

    Raises:
        RpcError: INVALID_REQUEST, the start ledger outside ``oldest..latest``.
    """
    start = request.cursor.successor() if request.cursor is not None else Cursor(request.start_ledger)
    limit = request.limit or DEFAULT_LIMIT
    end_ledger = min(latest + 1, start.ledger + LEDGER_SCAN_LIMIT)
    if request.end_ledger:
        end_ledger = min(request.end_ledger, end_ledger)
    if start.ledger < oldest or start.ledger > latest:
        raise RpcError(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=oldest, latest=latest))
    filters = request.filters
    start_key = cursor_key(start)
    found: list[RpcEvent] = []
    for seq in range(start.ledger, end_ledger):
        events: Sequence[RpcEvent] = log.events(seq)
        if seq == start.ledger and events:
            first = bisect.bisect_left([e.key for e in events], start_key)
            events = events[first:]
        for event in events:
            if filters and not matches(filters, event.type, event.contract_id, event.topics):
                continue
            found.append(event)
            if len(found) == limit:
                return EventsPage(found, found[-1].id)
    return EventsPage(found, str(Cursor.through(end_ledger - 1)))


def all_events(
    log: EventLog, oldest: int, latest: int, filters: Sequence[EventFilter] = ()
) -> list[RpcEvent]:
    """Every event of ledgers ``oldest..latest`` that matches ``filters``, ascending."""
    return [
        event
        for seq in range(oldest, latest + 1)
        for event in log.events(seq)
        if not filters or matches(filters, event.type, event.contract_id, event.topics)
    ]
