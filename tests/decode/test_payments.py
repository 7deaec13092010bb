"""The transfer view of Horizon ``/payments`` records: on every recorded real page, and on
constructed records for each type, muxed parties, bad amounts and text that is not a record."""

from __future__ import annotations

import decimal
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingestion.decode.payments import payment_record_text, stroops
from ingestion.testing import recorded
from ingestion.watchlist.lists import WatchList

PAGES = (
    "aurora-rs_stellar-horizon-rs/pubnet_payments_asc_200__all_payments.json",
    "lightsail-network_java-stellar-sdk/pages/payments.json",
    "StellarCN_stellar-model/payments_response.json",
)
SINGLE = ("payment", "path_payment_strict_receive", "path_payment_strict_send", "create_account",
          "account_merge", "invoke_host_function")  # fmt: skip
PAYMENT_TYPES = {"payment", "path_payment_strict_receive", "path_payment_strict_send", "create_account",
                 "account_merge"}  # fmt: skip

G1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
G2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"
ISSUER = "GA5ZSEJYB37JRC5AVCIA5MOP4RHTM335X2KGX3IHOJAPP5RE34K4KZVN"
M2 = "MAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5CAAAAAAAAAAAAGIWK"
CONTRACT = "CAAACAQDAQCQMBYIBEFAWDANBYHRAEISCMKBKFQXDAMRUGY4DUPB6N4O"


def compact(record: dict[str, Any]) -> str:
    """A record as the node commits it: compact JSON, Horizon's field order."""
    return orjson.dumps(record).decode()


def page_records(name: str) -> list[dict[str, Any]]:
    path = recorded.require(recorded.HORIZON / name)
    return list(json.loads(Path(path).read_text())["_embedded"]["records"])


def view_of(text: str) -> dict[str, Any] | None:
    out, _ = payment_record_text(text)
    parsed = json.loads(out)
    return parsed.get("transfer")


def independent_stroops(amount: str) -> str:
    # decimal arithmetic, not the module's: the two methods must agree on every recorded amount
    return str(int(decimal.Decimal(amount).scaleb(7)))


def expected_view(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["type"]
    asset = "native"
    if record.get("asset_type", "native") != "native":
        asset = f"{record['asset_code']}:{record['asset_issuer']}"
    if kind == "create_account":
        amount = independent_stroops(record["starting_balance"])
        return {"kind": "transfer", "from": record["funder"], "to": record["account"], "amount": amount,
                "asset": "native", "to_muxed_id": None}  # fmt: skip
    if kind == "account_merge":
        return {"kind": "transfer", "from": record["account"], "to": record["into"], "amount": None,
                "asset": "native", "to_muxed_id": None}  # fmt: skip
    return {"kind": "transfer", "from": record["from"], "to": record["to"],
            "amount": independent_stroops(record["amount"]), "asset": asset, "to_muxed_id": None}  # fmt: skip


@recorded.needed
@pytest.mark.parametrize("page", PAGES)
def test_every_recorded_payment_record_gets_the_view_computed_independently(page: str) -> None:
    records = page_records(page)
    assert records
    for record in records:
        assert record["type"] in PAYMENT_TYPES
        text = compact(record)
        out, addresses = payment_record_text(text)
        parsed = json.loads(out)
        assert out.startswith(text[:-1] + ',"transfer":'), "the view is appended, the record kept as it was"
        assert {k: v for k, v in parsed.items() if k != "transfer"} == record
        assert parsed["transfer"] == expected_view(record), record["id"]
        assert record["source_account"] in addresses
        assert record.get("asset_issuer") not in addresses or record.get("asset_issuer") in (
            record.get("from"), record.get("to"), record.get("source_account"))  # fmt: skip


@recorded.needed
def test_recorded_records_give_specific_views() -> None:
    java = page_records("lightsail-network_java-stellar-sdk/pages/payments.json")
    aurora = page_records("aurora-rs_stellar-horizon-rs/pubnet_payments_asc_200__all_payments.json")
    # the first pubnet payment ever: the root account funds its first account with 20 XLM
    first = aurora[0]
    assert first["type"] == "create_account" and first["starting_balance"] == "20.0000000"
    assert view_of(compact(first)) == {
        "kind": "transfer",
        "from": first["funder"],
        "to": first["account"],
        "amount": "200000000",
        "asset": "native",
        "to_muxed_id": None,
    }
    credit = next(r for r in aurora if r.get("asset_type", "native") != "native")
    view = view_of(compact(credit))
    assert view is not None and view["asset"] == f"{credit['asset_code']}:{credit['asset_issuer']}"
    merge = next(r for r in aurora if r["type"] == "account_merge")
    text = compact(merge)
    assert view_of(text) == {"kind": "transfer", "from": merge["account"], "to": merge["into"],
                             "amount": None, "asset": "native", "to_muxed_id": None}  # fmt: skip
    assert payment_record_text(text)[1] == tuple(dict.fromkeys([merge["source_account"], merge["account"],
                                                                merge["into"]]))  # fmt: skip
    assert java


@recorded.needed
def test_recorded_single_operations_of_each_type() -> None:
    base = recorded.HORIZON / "lightsail-network_java-stellar-sdk" / "operations"
    records = {name: json.loads(recorded.require(base / f"{name}.json").read_text()) for name in SINGLE}
    assert view_of(compact(records["payment"])) == {
        "kind": "transfer",
        "from": G1,
        "to": G2,
        "amount": "390000000",
        "asset": f"USDC:{ISSUER}",
        "to_muxed_id": None,
    }
    _, named = payment_record_text(compact(records["payment"]))
    assert named == (G1, G2)  # source_account == from; the USDC issuer is not a party
    # a failed transaction's path payment moved nothing: no view, the record as it was
    failed = compact(records["path_payment_strict_receive"])
    assert records["path_payment_strict_receive"]["transaction_successful"] is False
    assert payment_record_text(failed)[0] == failed
    send = records["path_payment_strict_send"]
    assert view_of(compact(send)) == {
        "kind": "transfer",
        "from": send["from"],
        "to": send["to"],
        "amount": "5045",
        "asset": f"BTC:{send['asset_issuer']}",
        "to_muxed_id": None,
    }
    _, named = payment_record_text(compact(send))
    assert send["asset_issuer"] not in named and send["path"][0]["asset_issuer"] not in named
    assert view_of(compact(records["create_account"]))["amount"] == "40000000"  # type: ignore[index]
    host = records["invoke_host_function"]
    change = host["asset_balance_changes"][0]
    assert view_of(compact(host)) == {
        "kind": "transfer",
        "from": change["from"],
        "to": change["to"],
        "amount": "5000000000",
        "asset": f"Hello:{change['asset_issuer']}",
        "to_muxed_id": "123456789",
    }
    assert payment_record_text(compact(host))[1] == (host["source_account"], change["to"])


def payment(**fields: Any) -> dict[str, Any]:
    record = {"id": "225257527003537409", "paging_token": "225257527003537409",
              "transaction_successful": True, "source_account": G1, "type": "payment", "type_i": 1,
              "asset_type": "native", "from": G1, "to": G2, "amount": "10.0000000"}  # fmt: skip
    record.update(fields)
    return {k: v for k, v in record.items() if v is not None}


def test_payment_to_a_muxed_account_names_the_g_account_and_the_muxed_id_as_cap_67_does() -> None:
    text = compact(payment(to_muxed=M2, to_muxed_id="1"))
    out, named = payment_record_text(text)
    assert json.loads(out)["transfer"] == {"kind": "transfer", "from": G1, "to": G2, "amount": "100000000",
                                          "asset": "native", "to_muxed_id": "1"}  # fmt: skip
    assert named == (G1, G2, M2)  # the M address is still matched by a watch list


def test_payment_from_a_muxed_account_names_its_g_account_as_from() -> None:
    view = view_of(compact(payment(from_muxed=M2, from_muxed_id="1", source_account_muxed=M2)))
    assert view is not None and view["from"] == G1 and view["to_muxed_id"] is None


def test_a_party_given_only_as_a_muxed_address_is_named_by_it() -> None:
    record = payment(to_muxed=M2, to_muxed_id="1")
    del record["to"]
    view = view_of(compact(record))
    assert view is not None and view["to"] == M2


@pytest.mark.parametrize(
    ("amount", "expected"),
    [("10.0000000", "100000000"), ("0.0000001", "1"), ("922337203685.4775807", "9223372036854775807"),
     ("1", "10000000"), ("1.5", "15000000"), ("0", "0"),
     ("17014118346046923173168730371588.4105727", str(2**127 - 1))],
)  # fmt: skip
def test_amounts_convert_to_stroops_exactly(amount: str, expected: str) -> None:
    assert stroops(amount) == expected
    assert view_of(compact(payment(amount=amount)))["amount"] == expected  # type: ignore[index]


@pytest.mark.parametrize(
    "amount",
    ["1.00000001", "-1.0000000", "1e7", "", ".5", "1.", " 1", "1_0", "\u0661\u0660", "NaN",
     "17014118346046923173168730371588.4105728", "9" * 5000],
)  # fmt: skip
def test_a_bad_amount_gives_a_decode_error_not_a_view(amount: str) -> None:
    text = compact(payment(amount=amount))
    out, named = payment_record_text(text)
    parsed = json.loads(out)
    assert "transfer" not in parsed and "amount" in parsed["decodeError"]
    assert out.startswith(text[:-1] + ',"decodeError":')
    assert named == (G1, G2)


def test_a_number_amount_is_a_decode_error() -> None:
    parsed = json.loads(payment_record_text(compact(payment(amount=10)))[0])
    assert "decodeError" in parsed


def test_credit_asset_without_an_issuer_is_a_decode_error() -> None:
    record = payment(asset_type="credit_alphanum4", asset_code="USD")
    parsed = json.loads(payment_record_text(compact(record))[0])
    assert "asset" in parsed["decodeError"]


def test_a_payment_without_to_is_a_decode_error() -> None:
    record = payment()
    del record["to"]
    assert "'to' is missing" in json.loads(payment_record_text(compact(record))[0])["decodeError"]


def test_create_account_and_account_merge() -> None:
    create = {"type": "create_account", "source_account": G1, "funder": G1, "account": G2,
              "starting_balance": "1.0000000", "funder_muxed": M2, "funder_muxed_id": "1"}  # fmt: skip
    assert view_of(compact(create)) == {"kind": "transfer", "from": G1, "to": G2, "amount": "10000000",
                                        "asset": "native", "to_muxed_id": None}  # fmt: skip
    merge = {"type": "account_merge", "source_account": G1, "account": G1, "into": G2}
    assert view_of(compact(merge)) == {"kind": "transfer", "from": G1, "to": G2, "amount": None,
                                       "asset": "native", "to_muxed_id": None}  # fmt: skip


def host_function(*changes: dict[str, Any]) -> dict[str, Any]:
    return {"type": "invoke_host_function", "source_account": G1, "address": "", "salt": "",
            "asset_balance_changes": list(changes)}  # fmt: skip


def test_host_function_with_one_mint_gives_a_mint_view() -> None:
    mint = {"asset_type": "credit_alphanum4", "asset_code": "USDC", "asset_issuer": ISSUER, "type": "mint",
            "to": CONTRACT, "amount": "2.5000000"}  # fmt: skip
    out, named = payment_record_text(compact(host_function(mint)))
    assert json.loads(out)["transfer"] == {"kind": "mint", "from": None, "to": CONTRACT, "amount": "25000000",
                                           "asset": f"USDC:{ISSUER}", "to_muxed_id": None}  # fmt: skip
    assert named == (G1, CONTRACT)


def test_host_function_with_several_changes_or_none_gives_no_view_but_names_them_all() -> None:
    a = {"asset_type": "native", "type": "transfer", "from": G1, "to": CONTRACT, "amount": "1.0000000"}
    b = {"asset_type": "native", "type": "burn", "from": G2, "amount": "1.0000000"}
    text = compact(host_function(a, b))
    assert payment_record_text(text) == (text, (G1, CONTRACT, G2))
    empty = compact(host_function())
    assert payment_record_text(empty) == (empty, (G1,))
    nothing = compact({"type": "invoke_host_function", "source_account": G1})
    assert payment_record_text(nothing) == (nothing, (G1,))


def test_other_operation_types_are_unchanged() -> None:
    text = compact({"type": "manage_sell_offer", "source_account": G1, "selling_asset_issuer": ISSUER})
    assert payment_record_text(text) == (text, (G1,))


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"G"', "null", "{", '{"a": 1}}'])
def test_text_that_is_not_a_json_object_is_returned_unchanged_naming_nothing(text: str) -> None:
    assert payment_record_text(text) == (text, ())


def test_applying_twice_is_applying_once() -> None:
    once = payment_record_text(compact(payment()))[0]
    assert payment_record_text(once)[0] == once
    bad = payment_record_text(compact(payment(amount="x")))[0]
    assert payment_record_text(bad)[0] == bad


def test_only_strkey_shaped_strings_are_named() -> None:
    record = {"type": "manage_data", "source_account": G1, "name": G2.lower(), "value": "G" * 56,
              "short": G2[:-1], "memo": f"{G2} ", "into_issuer": G2, "contract": CONTRACT}  # fmt: skip
    assert payment_record_text(compact(record))[1] == (G1, "G" * 56, CONTRACT)


@recorded.needed
def test_a_watched_account_named_only_in_a_nested_field_keeps_the_record() -> None:
    """Real records (tests read them from ../shared/data/horizon): a claimable balance's claimant,
    a path payment's ends, a trustor and a sponsor each keep the record for a list watching only
    them; the assets' issuers (a path's included) never do."""
    base = recorded.HORIZON / "lightsail-network_java-stellar-sdk"

    def record(kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(recorded.require(base / kind / f"{name}.json").read_text()))

    claimable = record("operations", "create_claimable_balance")
    claimant = claimable["claimants"][0]["destination"]
    assert claimant not in {v for v in claimable.values() if isinstance(v, str)}  # only nested
    send = record("operations", "path_payment_strict_send")
    trust = record("operations", "allow_trust")
    sponsored = record("effects", "trustline_sponsorship_created")
    cases = [
        (claimable, claimant), (send, send["from"]), (send, send["to"]), (trust, trust["trustor"]),
        (sponsored, sponsored["sponsor"]),
    ]  # fmt: skip
    for fields, watched in cases:
        _, named = payment_record_text(compact(fields))
        assert WatchList.of([watched]).matches(named), (fields["type"], watched, named)
    _, named = payment_record_text(compact(send))
    issuers = {send["asset_issuer"], *(step["asset_issuer"] for step in send["path"])}
    assert not WatchList.of(issuers).matches(named)
    assert payment_record_text(compact(claimable))[1] == (claimable["source_account"], claimant)
