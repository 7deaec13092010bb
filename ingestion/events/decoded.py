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

It also returns the addresses the event names (every address in its topics, the transfer's ends,
the emitting contract), so a watch list filters on them without parsing the text again.

Cost: this runs per event on the node's one thread, so the text is parsed once, for just three
fields (msgspec, in C), and each ScVal is decoded through a cache: a token's events repeat their
topics (the symbol, the accounts, the asset) and only the amount is new.
"""

from __future__ import annotations

import msgspec
import orjson

from ingestion.events.scval import DecodeCache, ScValError
from ingestion.events.transfers import transfer_view


class _Fields(msgspec.Struct, kw_only=True):
    """The fields of an ``EventInfo`` that decoding reads; msgspec skips the rest unparsed."""

    contractId: str = ""  # the wire's name
    topic: list[str] = []
    value: str


_read_fields = msgspec.json.Decoder(_Fields).decode
_topics = DecodeCache()
_values = DecodeCache()  # apart: amounts rarely repeat, and must not push the topics out


def decode_event_text(text: str) -> tuple[str, tuple[str, ...]]:
    """The event's text with its decoded fields added (see the module docstring), and the address
    strkeys it names: those anywhere in its topics, then the transfer's ``from`` and ``to``, then
    its contract, each once (muxed ``M`` addresses as they are).

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
    contract = fields.contractId
    named = (contract,) if contract else ()
    topics = []
    for index, item in enumerate(fields.topic):
        try:
            topics.append(_topics(item))
        except ScValError as exc:
            return _marked(text, f"topic {index}: {exc}"), named
    try:
        value = _values(fields.value)
    except ScValError as exc:
        return _marked(text, f"value: {exc}"), named
    transfer = transfer_view(contract, [t.json for t in topics], value.json)
    names: list[str] = []
    for topic in topics:
        names += topic.addresses
    suffix = ',"topicJson":[' + ",".join([t.text for t in topics]) + '],"valueJson":' + value.text
    if transfer is not None:
        suffix += ',"transfer":' + orjson.dumps(transfer).decode()
        if transfer["from"]:
            names.append(transfer["from"])
        if transfer["to"]:
            names.append(transfer["to"])
    if contract:
        names.append(contract)
    return text[:-1] + suffix + "}", tuple(dict.fromkeys(names))


def _marked(text: str, message: str) -> str:
    return text[:-1] + ',"decodeError":' + orjson.dumps(message).decode() + "}"
