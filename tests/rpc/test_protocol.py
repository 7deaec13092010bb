"""Stellar RPC getEvents rules, alone: event ids, request validation (the server's messages),
filter matching with * and **, topic segments written by hand."""

from __future__ import annotations

import pytest

from ingestion.rpc.protocol import (
    INVALID_PARAMS,
    Cursor,
    EventFilter,
    GetEventsRequest,
    InvalidCursor,
    RpcError,
    ledger_range_of,
    matches,
    segment_from_text,
    topic_from_text,
)

CONTRACT = "CDLZFC3SYJYDZT7K67VZ75HPJVIEUVNIXF47ZG2FB2RMQQVU2HHGCYSC"
TRANSFER = segment_from_text("sym:transfer")
MINT = segment_from_text("sym:mint")
A = segment_from_text("u32:1")
B = segment_from_text("u32:2")


def test_event_ids_are_toid_and_index_zero_padded_and_round_trip() -> None:
    c = Cursor(50_000_123, 7, 0, 2)
    text = str(c)
    assert text == f"{(50_000_123 << 32) | (7 << 12):019d}-0000000002"
    assert Cursor.parse(text) == c
    assert str(Cursor.through(5)) == f"{(6 << 32) - 1:019d}-4294967295"
    assert Cursor(5, 1) < Cursor(5, 1, 0, 1) < Cursor(5, 2) < Cursor.through(5) < Cursor(6)
    # Resuming after a scanned-through cursor starts inside the same ledger, past all its events.
    assert Cursor(5, 999) < Cursor.through(5).successor() and Cursor.through(5).successor().ledger == 5
    for bad in ("", "12", "12-", "-3", "a-1", "1-4294967296", f"{1 << 63}-0"):
        with pytest.raises(InvalidCursor, match="invalid event id"):
            Cursor.parse(bad)


def test_the_range_error_gives_oldest_and_latest() -> None:
    assert ledger_range_of("startLedger must be within the ledger range: 100 - 200") == (100, 200)
    assert ledger_range_of("something else") is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"startLedger": 5, "pagination": {"cursor": str(Cursor(5))}},
         "ledger ranges and cursor cannot both be set"),
        ({}, "startLedger must be positive"),
        ({"startLedger": 5, "pagination": {"limit": 10001}}, "limit must not exceed 10000"),
        ({"startLedger": 5, "filters": [{}] * 6}, "maximum 5 filters per request"),
        ({"startLedger": 5, "filters": [{"type": "diagnostic"}]},
         "filter 1 invalid: filter type invalid: if set, type must be either 'system' or 'contract'"),
        ({"startLedger": 5, "filters": [{"contractIds": [CONTRACT] * 6}]},
         "filter 1 invalid: maximum 5 contract IDs per filter"),
        ({"startLedger": 5, "filters": [{}, {"contractIds": ["GABC"]}]},
         "filter 2 invalid: contract ID 1 invalid"),
        ({"startLedger": 5, "filters": [{"topics": [["*"]] * 6}]},
         "filter 1 invalid: maximum 5 topics per filter"),
        ({"startLedger": 5, "filters": [{"topics": [["*"], ["**", "*"]]}]},
         "filter 1 invalid: topic 2 invalid: segment 1 invalid: "
         "wildcard '**' is only allowed as the last segment"),
        ({"startLedger": 5, "filters": [{"topics": [["*"] * 5]}]},
         "filter 1 invalid: topic 1 invalid: topic cannot have more than 4 segments"),
        ({"startLedger": 5, "filters": [{"topics": [[]]}]},
         "filter 1 invalid: topic 1 invalid: topic must have at least 1 segment"),
        ({"startLedger": 5, "xdrFormat": "xml"}, "got 'xml': expected base64, json for optional 'xdrFormat'"),
        ({"pagination": {"cursor": "12"}}, "invalid event id 12"),
    ],
)  # fmt: skip
def test_invalid_requests_get_the_servers_message(params: dict, message: str) -> None:
    with pytest.raises(RpcError) as err:
        GetEventsRequest.from_params(params)
    assert err.value.code == INVALID_PARAMS and err.value.message == message


def test_four_segments_then_a_trailing_double_star_is_valid() -> None:
    request = GetEventsRequest.from_params(
        {"startLedger": 5, "filters": [{"topics": [[TRANSFER, "*", "*", "*", "**"]]}]}
    )
    assert request.filters[0].topics == ((TRANSFER, "*", "*", "*", "**"),)
    assert GetEventsRequest.from_params(request.to_params()) == request


def test_topic_matching_with_wildcards() -> None:
    f = EventFilter(topics=((TRANSFER, "*"),))
    assert f.matches("contract", CONTRACT, [TRANSFER, A])
    assert not f.matches("contract", CONTRACT, [TRANSFER, A, B])  # exact length without **
    assert not f.matches("contract", CONTRACT, [MINT, A])
    rest = EventFilter(topics=((TRANSFER, "**"),))
    assert rest.matches("contract", CONTRACT, [TRANSFER])  # ** matches zero segments too
    assert rest.matches("contract", CONTRACT, [TRANSFER, A, B, A])
    assert not rest.matches("contract", CONTRACT, [MINT])
    assert EventFilter(topics=(("**",),)).matches("contract", CONTRACT, [])


def test_filters_are_ored_and_fields_anded() -> None:
    by_type = EventFilter(types=("system",))
    by_contract_and_topic = EventFilter((), (CONTRACT,), ((MINT,),))
    both = (by_type, by_contract_and_topic)
    assert matches(both, "system", "", [TRANSFER])
    assert matches(both, "contract", CONTRACT, [MINT])
    assert not matches(both, "contract", CONTRACT, [TRANSFER])
    assert not matches(both, "contract", "C" + CONTRACT[1:-1] + "A", [MINT])
    assert matches((), "contract", CONTRACT, [TRANSFER])  # no filter: everything


def test_segments_written_by_hand() -> None:
    assert topic_from_text("sym:transfer,*,**") == (TRANSFER, "*", "**")
    assert segment_from_text(TRANSFER) == TRANSFER
    for bad in ("u32:-1", "bool:maybe", "address:GXYZ", "not base64!", "AAAA"):
        with pytest.raises(ValueError):
            segment_from_text(bad)


def test_json_null_leaves_a_field_at_its_zero_value_as_go_does() -> None:
    params = {
        "startLedger": 5, "endLedger": None, "filters": None, "xdrFormat": None,
        "pagination": {"cursor": None, "limit": None},
    }  # fmt: skip
    assert GetEventsRequest.from_params(params) == GetEventsRequest(start_ledger=5)
    with_filter = {"startLedger": 5, "filters": [{"type": None, "contractIds": None, "topics": None}]}
    assert GetEventsRequest.from_params(with_filter).filters == (EventFilter(),)
