"""Every event of the real ledgers in ``../shared/data/lake`` through :func:`decode_event_text`:
its SEP-51 JSON equal to stellar-sdk's, and its transfer view equal to one derived here, apart,
from stellar-sdk's decoded objects by the rules as CAP-67 / SEP-41 / the SAC state them."""

from __future__ import annotations

import collections
from typing import Any

import orjson
import pytest
from stellar_sdk import MuxedAccount, scval, xdr

from ingestion.decode.decoded import decode_event_text
from ingestion.lake.events import ledger_events
from tests.support.lakes import REAL_LEDGERS, every_real_ledger, real_ledger

T = xdr.SCValType

# (kind, the shapes of the topics after the first: a address, s string) -> where from, to and
# asset come from (a topic's index, None, or the asset itself)
SHAPES: dict[tuple[str, tuple[str, ...]], tuple[int | None, int | None, int | str | None]] = {
    ("transfer", ("a", "a")): (1, 2, None),
    ("transfer", ("a", "a", "s")): (1, 2, 3),
    ("mint", ("a", "a")): (None, 2, None),  # SEP-41 [admin, to]
    ("mint", ("a", "s")): (None, 1, 2),  # CAP-67 [to, asset]
    ("mint", ("a", "a", "s")): (None, 2, 3),  # SAC before 23 [admin, to, asset]
    ("burn", ("a",)): (1, None, None),
    ("burn", ("a", "s")): (1, None, 2),
    ("clawback", ("a", "a")): (2, None, None),  # SEP-41 [admin, from]
    ("clawback", ("a", "s")): (1, None, 2),  # CAP-67 [from, asset]
    ("clawback", ("a", "a", "s")): (2, None, 3),  # SAC before 23 [admin, from, asset]
    ("fee", ("a",)): (1, None, "native"),
}


def _shape(value: xdr.SCVal) -> str:
    return {T.SCV_ADDRESS: "a", T.SCV_STRING: "s"}.get(value.type, "?")


def _amount(value: xdr.SCVal) -> tuple[str, str | None] | None:
    if value.type == T.SCV_I128:
        return str(scval.from_int128(value)), None
    if value.type != T.SCV_MAP or value.map is None:
        return None
    fields = {e.key.sym.sc_symbol: e.val for e in value.map.sc_map if e.key.type == T.SCV_SYMBOL}
    amount = fields.get(b"amount")
    if amount is None or amount.type != T.SCV_I128:
        return None
    muxed = fields.get(b"to_muxed_id")
    muxed_id = None
    if muxed is not None and muxed.type == T.SCV_U64:
        muxed_id = str(muxed.u64.uint64)
    elif muxed is not None and muxed.type == T.SCV_BYTES:
        muxed_id = muxed.bytes.sc_bytes.hex()
    elif muxed is not None and muxed.type == T.SCV_STRING:
        muxed_id = muxed.to_json_dict()["string"]
    return str(scval.from_int128(amount)), muxed_id


def expected_transfer(topics: list[xdr.SCVal], value: xdr.SCVal) -> dict[str, Any] | None:
    if not topics or topics[0].type != T.SCV_SYMBOL:
        return None
    kind = topics[0].sym.sc_symbol.decode("latin-1")
    where = SHAPES.get((kind, tuple(_shape(t) for t in topics[1:])))
    amount = _amount(value)
    if where is None or amount is None:
        return None

    def at(index: int | str | None) -> str | None:
        if index is None or isinstance(index, str):
            return index
        topic = topics[index]
        return topic.address.to_json_dict() if topic.type == T.SCV_ADDRESS else topic.to_json_dict()["string"]

    sender, receiver, asset = (at(i) for i in where)
    return {
        "kind": kind,
        "from": sender,
        "to": receiver,
        "amount": amount[0],
        "asset": asset,
        "to_muxed_id": amount[1],
    }


def _addresses(value: Any) -> list[str]:
    """Every address strkey in a stellar-sdk SEP-51 JSON value."""
    if isinstance(value, dict):
        if set(value) == {"address"}:
            return [value["address"]]
        return [a for v in value.values() for a in _addresses(v)]
    if isinstance(value, list):
        return [a for v in value for a in _addresses(v)]
    return []


def _u64_muxed_id(value: Any) -> int | None:
    """A CAP-67 amount map's ``to_muxed_id`` when it is a u64: the id of the receiver's M address."""
    for entry in value.get("map") or [] if isinstance(value, dict) else []:
        if entry["key"] == {"symbol": "to_muxed_id"} and "u64" in entry["val"]:
            return int(entry["val"]["u64"])
    return None


def check(body: str, kinds: collections.Counter[str]) -> None:
    out, addresses = decode_event_text(body)
    assert out[: len(body) - 1] == body[:-1]
    doc, original = orjson.loads(out), orjson.loads(body)
    assert "decodeError" not in doc, doc["decodeError"]
    assert {k: doc[k] for k in original} == original
    topics = [xdr.SCVal.from_xdr(t) for t in original.get("topic", [])]
    value = xdr.SCVal.from_xdr(original["value"])
    topic_json = [t.to_json_dict() for t in topics]
    assert doc["topicJson"] == topic_json
    assert doc["valueJson"] == value.to_json_dict()
    expected = expected_transfer(topics, value)
    assert doc.get("transfer") == expected, body
    assert "transfer" in doc or expected is None
    kinds[expected["kind"] if expected else "none"] += 1
    named = [a for t in topic_json for a in _addresses(t)]
    if original["contractId"]:
        named.append(original["contractId"])
    muxed = _u64_muxed_id(doc["valueJson"])
    if expected and muxed is not None and (expected["to"] or "").startswith("G"):
        named.append(MuxedAccount(expected["to"], muxed).account_muxed)  # (stellar-sdk's encoding)
    assert addresses == tuple(dict.fromkeys(named))
    if expected:
        assert {expected["from"], expected["to"]} - {None} <= set(addresses)


@pytest.mark.parametrize("name", REAL_LEDGERS)
def test_every_event_of_a_real_pubnet_ledger_decodes_as_stellar_sdk_and_the_rules_say(name: str) -> None:
    kinds: collections.Counter[str] = collections.Counter()
    for event in ledger_events(real_ledger(name)).events:
        check(event.body, kinds)
    # the lake backfills classic payments and fees as CAP-67 events: every ledger has both
    assert kinds["transfer"] > 100 and kinds["fee"] > 100, kinds


def test_the_real_ledgers_hold_every_kind_of_movement() -> None:
    kinds: collections.Counter[str] = collections.Counter()
    for name in REAL_LEDGERS:
        for event in ledger_events(real_ledger(name)).events:
            check(event.body, kinds)
    assert sum(kinds.values()) > 2500
    assert {k for k, n in kinds.items() if n} == {"transfer", "fee", "mint", "burn", "clawback", "none"}, (
        kinds
    )


def test_every_event_of_every_real_file_decodes_as_stellar_sdk() -> None:
    """The pubnet ledgers, the real lake object (no contract events: TransactionMeta V3) and the
    standalone v23 load test (2,000 contract events of its own contracts)."""
    kinds: collections.Counter[str] = collections.Counter()
    for meta in every_real_ledger():
        for event in ledger_events(meta).events:
            check(event.body, kinds)
    assert sum(kinds.values()) >= 2674 + 2000, kinds
