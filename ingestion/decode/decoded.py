"""One committed event made readable: its ScVals as SEP-51 JSON and its transfer view. Pure.

The node commits each contract event as the compact JSON text of Stellar RPC's ``EventInfo``
(``{"type":"contract","ledger":..,"contractId":"C..",..,"topic":["AAAADw.."],"value":"AAAACg.."}``;
``topic`` left out when empty, ``contractId`` "" for none). :func:`decode_event_text` returns that
text with the decoded fields added before its closing brace::

    <the text up to its last "}">,"topicJson":[..],"valueJson":..[,"transfer":{..}]}

so every original byte stays as it was (the base64 ``topic`` and ``value`` included: a reader may
keep decoding them itself), and ``topicJson``/``valueJson`` are what stellar-rpc serves with
``xdrFormat: json``. A ScVal that does not decode gives ``,"decodeError":"<what and where>"``
instead of all three: the event is kept, marked, never dropped, and nothing raises.

It also returns the addresses the event names (every address in its topics, which holds the
transfer's ends, then the emitting contract, and for a transfer whose ``to_muxed_id`` is a u64 the
``M`` address of its receiver with that id, so that a watched ``M`` address matches the events
CAP-67 writes for it: its ``G`` account in the topics, the id in the value), so a watch list
filters on them without parsing the text again.

Cost: this runs per event on the node's one thread during catch-up, so the text is parsed once,
for just three fields (msgspec, in C), and the rest is cached in two parts. The contract and topics
(a token, the symbol, the accounts, the asset: they repeat) give the ``topicJson`` text, the
movement, the transfer's text around its amount, and the addresses; the value (the amount, often
new) gives the ``valueJson`` text and the amount. An event is then two dict lookups and a few
string joins.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import orjson

from ingestion.decode.scval import CACHE_LIMIT, DecodeCache, ScValError, decode, i128_of
from ingestion.decode.transfers import Movement, amount_of, movement, muxed_address, muxed_u64


class _Fields(msgspec.Struct, kw_only=True):
    """The fields of an ``EventInfo`` that decoding reads; msgspec skips the rest unparsed."""

    contractId: str = ""  # the wire's name
    topic: tuple[str, ...] = ()
    value: str


class _Head(NamedTuple):
    """What an event's contract and topics give, the same for every event that has them."""

    topic_json: str  # ',"topicJson":[...],"valueJson":'
    movement: Movement | None
    transfer_start: str  # ',"transfer":{"kind":..,"from":..,"to":..,"amount":"'
    transfer_end: str  # '","asset":..,"to_muxed_id":'
    addresses: tuple[str, ...]


_Tail = tuple[str, str | None, str, int | None]
"""What an event's value gives: its ``valueJson`` text, its amount (decimal digits: no JSON
escaping needed) or None, its ``to_muxed_id`` as JSON text (``null`` or a string), and that id
when it is a u64 (an ``M`` address's). A plain tuple: built per event when the amount is new, and
a NamedTuple's constructor costs 0.3 us."""


_read_fields = msgspec.json.Decoder(_Fields).decode
_topics = DecodeCache()  # one topic's base64 -> its decoding: shared by the heads' keys
_heads: dict[tuple[str, tuple[str, ...]], _Head] = {}
_tails: dict[str, _Tail] = {}  # apart: amounts repeat less, and must not push the heads out


def decode_event_text(text: str) -> tuple[str, tuple[str, ...]]:
    """The event's text with its decoded fields added (see the module docstring), and the address
    strkeys it names: those anywhere in its topics (a transfer's ``from`` and ``to`` among them),
    then its contract, each once (muxed ``M`` addresses as they are), then for a movement whose
    ``to_muxed_id`` is a u64 the ``M`` address of its receiver and that id.

    Never raises: a ScVal that does not decode, or a text that is not an event object, gives the
    text with a ``decodeError`` member (and only the contract as its address); a text that does not
    end with ``}`` (no JSON object: the node commits none such) comes back as it was, naming none.
    """
    if not text.endswith("}"):
        return text, ()
    try:
        fields = _read_fields(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return _marked(text, f"not an event: {exc}"), ()
    key = (fields.contractId, fields.topic)
    try:
        head = _heads.get(key) or _head(key)
        tail = _tails.get(fields.value) or _tail(fields.value)
    except ScValError as exc:
        return _marked(text, str(exc)), (fields.contractId,) if fields.contractId else ()
    value_json, amount, to_muxed_id, muxed = tail
    if head.movement is None or amount is None:
        return "".join((text[:-1], head.topic_json, value_json, "}")), head.addresses
    parts = (text[:-1], head.topic_json, value_json, head.transfer_start, amount, head.transfer_end)
    addresses = head.addresses
    if muxed is not None and head.movement.receiver:  # (rare: the M address is made only then)
        received = muxed_address(head.movement.receiver, muxed)
        addresses = (*addresses, received) if received else addresses
    return "".join((*parts, to_muxed_id, "}}")), addresses


def _marked(text: str, message: str) -> str:
    return text[:-1] + ',"decodeError":' + orjson.dumps(message).decode() + "}"


def _head(key: tuple[str, tuple[str, ...]]) -> _Head:
    contract, items = key
    topics = []
    for index, item in enumerate(items):
        try:
            topics.append(_topics(item))
        except ScValError as exc:
            raise ScValError(f"topic {index}: {exc}") from None
    moved = movement([t.json for t in topics])
    start = end = ""
    if moved is not None:
        ends = {"kind": moved.kind, "from": moved.sender, "to": moved.receiver}
        start = ',"transfer":' + orjson.dumps(ends).decode()[:-1] + ',"amount":"'
        end = '","asset":' + orjson.dumps(moved.asset).decode() + ',"to_muxed_id":'
    named = [a for t in topics for a in t.addresses]
    if contract:
        named.append(contract)
    topic_json = ',"topicJson":[' + ",".join([t.text for t in topics]) + '],"valueJson":'
    head = _Head(topic_json, moved, start, end, tuple(dict.fromkeys(named)))
    if len(_heads) >= CACHE_LIMIT:
        _heads.clear()
    _heads[key] = head
    return head


def _tail(value: str) -> _Tail:
    amount = i128_of(value)
    tail: _Tail
    if amount is not None:
        tail = ('{"i128":"' + amount + '"}', amount, "null", None)
    else:
        try:
            decoded = decode(value)
        except ScValError as exc:
            raise ScValError(f"value: {exc}") from None
        found = amount_of(decoded.json)
        if found is None:
            tail = (decoded.text, None, "null", None)
        else:
            tail = (decoded.text, found[0], orjson.dumps(found[1]).decode(), muxed_u64(decoded.json))
    if len(_tails) >= CACHE_LIMIT:
        _tails.clear()
    _tails[value] = tail
    return tail
