"""The transfer view, rule by rule, on events built with stellar-sdk and read through the node's
entry point (:func:`decode_event_text`), and what it does with events that are not movements or do
not decode."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from stellar_sdk import Keypair, MuxedAccount, scval, xdr

from actors.source import Batch, Record, SyntheticSource
from ingestion.decode.decoded import decode_event_text
from ingestion.decode.stage import EventsStage
from ingestion.decode.transfers import transfer_view
from ingestion.watchlist.lists import WatchList

ALICE = Keypair.from_raw_ed25519_seed(b"\1" * 32).public_key
BOB = Keypair.from_raw_ed25519_seed(b"\2" * 32).public_key
ADMIN = Keypair.from_raw_ed25519_seed(b"\3" * 32).public_key
TOKEN = "CCW67TSZV3SSS2HXMBQ5JFGCKJNXKZM7UQUWUZPUTHXSTZLEO7SJMI75"
POOL = "CA3D5KRYM6CB7OWQ6TWYRR3Z4T7GNZLKERYNZGGA5SOAOPIFY6YQGAXE"
MUXED_BOB = "MA7QYNF7SOWQ3GLR2BGMZEHXAVIRZA4KVWLTJJFC7MGXUA74P7UJVAAAAAAAAAAAAAJLK"
USDC = "USDC:GA5ZSEJYB37JRC5AVCIA5MOP4RHTM335X2KGX3IHOJAPP5RE34K4KZVN"


def sym(name: str) -> xdr.SCVal:
    return scval.to_symbol(name)


def addr(strkey: str) -> xdr.SCVal:
    return scval.to_address(strkey)


def event(topics: list[xdr.SCVal], value: xdr.SCVal, contract: str = TOKEN) -> str:
    doc: dict[str, Any] = {
        "type": "contract",
        "ledger": 60000000,
        "ledgerClosedAt": "2025-09-01T00:00:00Z",
        "contractId": contract,
        "id": "0257698037760004096-0000000000",
        "operationIndex": 0,
        "transactionIndex": 1,
        "txHash": "cd" * 32,
        "inSuccessfulContractCall": True,
    }
    if topics:
        doc["topic"] = [t.to_xdr() for t in topics]
    doc["value"] = value.to_xdr()
    return orjson.dumps(doc).decode()


def decoded(text: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    out, addresses = decode_event_text(text)
    assert out.startswith(text[:-1]) and out.endswith("}")
    doc = orjson.loads(out)
    original = orjson.loads(text)
    assert {k: doc[k] for k in original} == original
    return doc, addresses


def view(
    kind: str,
    sender: str | None,
    receiver: str | None,
    amount: str,
    asset: str | None,
    muxed: str | None = None,
):
    return {
        "kind": kind,
        "from": sender,
        "to": receiver,
        "amount": amount,
        "asset": asset,
        "to_muxed_id": muxed,
    }


AMOUNT = scval.to_int128(1_234_500)

RULES = [
    (
        "transfer without asset",
        [sym("transfer"), addr(ALICE), addr(BOB)],
        view("transfer", ALICE, BOB, "1234500", None),
    ),
    (
        "SAC transfer",
        [sym("transfer"), addr(ALICE), addr(BOB), scval.to_string(USDC)],
        view("transfer", ALICE, BOB, "1234500", USDC),
    ),
    (
        "transfer to a contract and a muxed account",
        [sym("transfer"), addr(POOL), addr(MUXED_BOB), scval.to_string("native")],
        view("transfer", POOL, MUXED_BOB, "1234500", "native"),
    ),
    (
        "SEP-41 mint [admin, to]",
        [sym("mint"), addr(ADMIN), addr(BOB)],
        view("mint", None, BOB, "1234500", None),
    ),
    (
        "SAC mint before protocol 23 [admin, to, asset]",
        [sym("mint"), addr(ADMIN), addr(BOB), scval.to_string(USDC)],
        view("mint", None, BOB, "1234500", USDC),
    ),
    (
        "CAP-67 mint [to, asset]",
        [sym("mint"), addr(BOB), scval.to_string(USDC)],
        view("mint", None, BOB, "1234500", USDC),
    ),
    ("SEP-41 burn [from]", [sym("burn"), addr(ALICE)], view("burn", ALICE, None, "1234500", None)),
    (
        "SAC burn [from, asset]",
        [sym("burn"), addr(ALICE), scval.to_string(USDC)],
        view("burn", ALICE, None, "1234500", USDC),
    ),
    (
        "SEP-41 clawback [admin, from]",
        [sym("clawback"), addr(ADMIN), addr(ALICE)],
        view("clawback", ALICE, None, "1234500", None),
    ),
    (
        "SAC clawback before protocol 23 [admin, from, asset]",
        [sym("clawback"), addr(ADMIN), addr(ALICE), scval.to_string(USDC)],
        view("clawback", ALICE, None, "1234500", USDC),
    ),
    (
        "CAP-67 clawback [from, asset]",
        [sym("clawback"), addr(ALICE), scval.to_string(USDC)],
        view("clawback", ALICE, None, "1234500", USDC),
    ),
    ("CAP-67 fee [from]", [sym("fee"), addr(ALICE)], view("fee", ALICE, None, "1234500", "native")),
]


@pytest.mark.parametrize(("topics", "expected"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_gives_its_view(topics: list[xdr.SCVal], expected: dict[str, Any]) -> None:
    doc, addresses = decoded(event(topics, AMOUNT))
    assert doc["transfer"] == expected
    assert doc["topicJson"] == [t.to_json_dict() for t in topics]
    assert doc["valueJson"] == {"i128": "1234500"}
    topic_addresses = [t.address.to_json_dict() for t in topics if t.type == xdr.SCValType.SCV_ADDRESS]
    assert addresses == (*dict.fromkeys(topic_addresses), TOKEN)
    for end in (expected["from"], expected["to"]):
        assert end is None or end in addresses


def test_a_fee_refund_is_a_negative_amount() -> None:
    doc, _ = decoded(event([sym("fee"), addr(ALICE)], scval.to_int128(-52_000)))
    assert doc["transfer"] == view("fee", ALICE, None, "-52000", "native")


@pytest.mark.parametrize(
    ("muxed", "expected"),
    [
        (scval.to_uint64(2**64 - 1), str(2**64 - 1)),
        (scval.to_bytes(b"\x01\xfe memo"), "01fe206d656d6f"),
        (scval.to_string('memo "7"'), 'memo "7"'),
        (scval.to_bool(True), None),  # not one of CAP-67's types: no muxed id, still a transfer
    ],
)
def test_the_cap67_amount_map_carries_to_muxed_id(muxed: xdr.SCVal, expected: str | None) -> None:
    value = scval.to_map({sym("amount"): scval.to_int128(77), sym("to_muxed_id"): muxed})
    topics = [sym("transfer"), addr(ALICE), addr(BOB), scval.to_string("native")]
    doc, _ = decoded(event(topics, value))
    assert doc["transfer"] == view("transfer", ALICE, BOB, "77", "native", expected)
    assert doc["valueJson"] == value.to_json_dict()


def test_an_amount_map_without_muxed_id_is_a_plain_amount() -> None:
    doc, _ = decoded(
        event([sym("mint"), addr(BOB), scval.to_string(USDC)], scval.to_map({sym("amount"): AMOUNT}))
    )
    assert doc["transfer"] == view("mint", None, BOB, "1234500", USDC)


NOT_MOVEMENTS = [
    ("another symbol", [sym("approve"), addr(ALICE), addr(BOB), scval.to_uint32(9)], AMOUNT),
    ("a string, not a symbol, first", [scval.to_string("transfer"), addr(ALICE), addr(BOB)], AMOUNT),
    ("too few topics", [sym("transfer"), addr(ALICE)], AMOUNT),
    (
        "too many topics",
        [sym("transfer"), addr(ALICE), addr(BOB), scval.to_string("native"), sym("x")],
        AMOUNT,
    ),
    ("a non-address end", [sym("transfer"), addr(ALICE), scval.to_string(BOB)], AMOUNT),
    ("an asset that is not a string", [sym("transfer"), addr(ALICE), addr(BOB), sym("native")], AMOUNT),
    ("a u128 amount", [sym("transfer"), addr(ALICE), addr(BOB)], scval.to_uint128(5)),
    ("a map without amount", [sym("transfer"), addr(ALICE), addr(BOB)], scval.to_map({sym("value"): AMOUNT})),
    (
        "an amount of the wrong type",
        [sym("burn"), addr(ALICE)],
        scval.to_map({sym("amount"): scval.to_int64(5)}),
    ),
    ("a fee with an asset", [sym("fee"), addr(ALICE), scval.to_string("native")], AMOUNT),
    ("a burn of four topics", [sym("burn"), addr(ADMIN), addr(ALICE), scval.to_string(USDC)], AMOUNT),
    ("a mint of two topics", [sym("mint"), addr(BOB)], AMOUNT),
    ("a mint whose last topic is a symbol", [sym("mint"), addr(BOB), sym("USDC")], AMOUNT),
    ("no topics", [], AMOUNT),
    ("a void value", [sym("transfer"), addr(ALICE), addr(BOB)], scval.to_void()),
]


@pytest.mark.parametrize(
    ("topics", "value"), [r[1:] for r in NOT_MOVEMENTS], ids=[r[0] for r in NOT_MOVEMENTS]
)
def test_events_that_are_not_movements_get_no_view(topics: list[xdr.SCVal], value: xdr.SCVal) -> None:
    doc, addresses = decoded(event(topics, value))
    assert "transfer" not in doc
    assert doc["topicJson"] == [t.to_json_dict() for t in topics]
    assert doc["valueJson"] == value.to_json_dict()
    assert TOKEN in addresses
    assert transfer_view(TOKEN, doc["topicJson"], doc["valueJson"]) is None


def test_an_event_without_contract_names_none() -> None:
    doc, addresses = decoded(event([sym("fee"), addr(ALICE)], AMOUNT, contract=""))
    assert doc["transfer"]["from"] == ALICE and addresses == (ALICE,)


def test_the_pure_rule_agrees_with_the_entry_point() -> None:
    for _, topics, expected in RULES:
        json_topics = [t.to_json_dict() for t in topics]
        assert transfer_view(TOKEN, json_topics, AMOUNT.to_json_dict()) == expected


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("topic", 1, "topic 1: not base64"),
        ("topic", 2, "topic 2: truncated"),
        ("value", None, "value: unknown ScVal type"),
    ],
)
def test_a_scval_that_does_not_decode_marks_the_event_and_keeps_it(
    field: str, bad: int | None, message: str
) -> None:
    doc = orjson.loads(event([sym("transfer"), addr(ALICE), addr(BOB)], AMOUNT))
    if field == "topic":
        assert bad is not None
        doc["topic"][bad] = "AAAAEg==@" if bad == 1 else "AAAAEgAAAAA="
    else:
        doc["value"] = "AAAAMg=="
    text = orjson.dumps(doc).decode()
    out, addresses = decode_event_text(text)
    assert out.startswith(text[:-1])
    got = orjson.loads(out)
    assert message in got["decodeError"]
    assert not {"topicJson", "valueJson", "transfer"} & set(got)
    assert {k: got[k] for k in doc} == doc
    assert addresses == (TOKEN,)


def test_text_that_is_not_an_event_is_marked_or_returned_as_it_was() -> None:
    out, addresses = decode_event_text('{"type":"contract","topic":[1],"value":"AAAAAQ=="}')
    assert "not an event" in orjson.loads(out)["decodeError"] and addresses == ()
    assert decode_event_text("[1, 2]") == ("[1, 2]", ())


def test_a_watched_muxed_address_keeps_the_events_of_its_account_with_that_muxed_id() -> None:
    """CAP-67 events name the G account in their topics and the muxed id in the value (an address
    in a topic cannot be muxed for SAC balances), so a watched M address matched none of them."""
    bob_42 = MuxedAccount(BOB, 42).account_muxed
    topics = [sym("transfer"), addr(ALICE), addr(BOB), scval.to_string("native")]

    def paid(muxed: xdr.SCVal) -> Record:
        value = scval.to_map({sym("amount"): AMOUNT, sym("to_muxed_id"): muxed})
        return Record("0000258698337832960-0000000001", event(topics, value))

    to_42, to_7, memo = paid(scval.to_uint64(42)), paid(scval.to_uint64(7)), paid(scval.to_bytes(b"*"))
    plain = Record("0000258698337832960-0000000002", event(topics, AMOUNT))
    stage = EventsStage(SyntheticSource(), decode_event_text)
    batch = Batch((to_42, to_7, memo, plain))

    def kept(*watched: str) -> list[str]:
        out = stage.apply(batch, WatchList.of(watched))
        return [orjson.loads(r.body)["transfer"]["to_muxed_id"] for r in out.records]

    assert kept(bob_42) == ["42"]  # that muxed id only: not another, not a memo's bytes, not none
    assert kept(MuxedAccount(BOB, 7).account_muxed) == ["7"]
    assert kept(BOB) == ["42", "7", "2a", None]  # the account itself: every payment to it
    assert kept(MuxedAccount(ALICE, 42).account_muxed) == []  # the sender's account: not the receiver
    assert decode_event_text(to_42.body)[1] == (ALICE, BOB, TOKEN, bob_42)
