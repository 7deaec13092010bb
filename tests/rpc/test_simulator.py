"""The simulator's Stellar RPC server over real sockets: getEvents as stellar-rpc runs it, the
other methods' shapes, and its fault knobs."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import httpx
import pytest
import trio
from stellar_sdk import Address, scval, xdr
from stellar_sdk.soroban_rpc import (
    GetEventsResponse,
    GetHealthResponse,
    GetLatestLedgerResponse,
    GetNetworkResponse,
)

from ingestion.cli.simulate import config_from_args
from ingestion.rpc.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LEDGER_SCAN_LIMIT,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROCESSING_LIMIT,
    RANGE_MESSAGE,
    TX_MASK,
    Cursor,
    EventFilter,
)
from ingestion.simulator import RpcFailureKind, RpcFaults, Simulator, SimulatorConfig, open_simulator
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import NETWORK_PASSPHRASE, PROTOCOL_VERSION, ChainSpec, ledger_hash_of
from ingestion.simulator.rpc import go_duration
from ingestion.simulator.rpc_events import EventLog, ledger_events, scval_b64, stroops_of
from tests.support.simulator import simulator_process

# 60 ledgers, the newest 50 kept: oldest 50000010, latest 50000059 (system events in 20, 40).
CONFIG = SimulatorConfig(
    rpc_port=0, ledger_interval=None, history_ledgers=60, retention_ledgers=50, ops_per_ledger=20, seed=3
)
SYM = {name: str(scval.to_symbol(name).to_xdr()) for name in ("transfer", "approve", "counter", "ping")}


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with open_simulator(CONFIG) as s:
        yield s


async def post(sim: Simulator, body: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await client.post(sim.rpc_url, content=content, headers={"content-type": "application/json"})


async def call(sim: Simulator, method: str, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
    response = await post(sim, {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id
    return answer


async def events(sim: Simulator, **params: Any) -> dict[str, Any]:
    answer = await call(sim, "getEvents", params)
    assert "error" not in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


async def error(sim: Simulator, method: str, params: Any) -> tuple[int, str]:
    answer = await call(sim, method, params)
    return answer["error"]["code"], answer["error"]["message"]


async def page_all(sim: Simulator, limit: int, **first: Any) -> tuple[list[dict[str, Any]], str]:
    """Every event from ``first``'s start, following cursors until a page comes back empty."""
    out: list[dict[str, Any]] = []
    result = await events(sim, pagination={"limit": limit}, **first)
    while result["events"]:
        out += result["events"]
        result = await events(sim, pagination={"cursor": result["cursor"], "limit": limit})
    return out, result["cursor"]


def native(b64: str) -> Any:
    value = scval.to_native(xdr.SCVal.from_xdr(b64))
    return value.address if isinstance(value, Address) else value


# -- getEvents: what is served -------------------------------------------------------------------


async def test_events_parse_with_the_sdk_model_and_ids_are_the_cursor_of_their_fields(sim: Simulator) -> None:
    result = await events(sim, startLedger=sim.chain.first, pagination={"limit": 1000})
    GetEventsResponse.model_validate(result)
    got = result["events"]
    assert got == sim.rpc_events() and len(got) > 50
    assert [e["id"] for e in got] == sorted(e["id"] for e in got) and len({e["id"] for e in got}) == len(got)
    position: dict[tuple[int, int, int], int] = {}
    for e in got:
        where = (e["ledger"], e["transactionIndex"], e["operationIndex"])
        index = position[where] = position.get(where, -1) + 1
        assert e["id"] == str(Cursor(*where, index))
        assert list(e) == [
            "type",
            "ledger",
            "ledgerClosedAt",
            "contractId",
            "id",
            "operationIndex",
            "transactionIndex",
            "txHash",
            "inSuccessfulContractCall",
            "topic",
            "value",
        ]
    assert result["latestLedger"] == sim.chain.latest and result["oldestLedger"] == sim.chain.first
    assert result["latestLedgerCloseTime"] == str(sim.chain.closed_at(sim.chain.latest))
    assert result["oldestLedgerCloseTime"] == str(sim.chain.closed_at(sim.chain.first))
    assert result["cursor"] == str(Cursor.through(sim.chain.latest))


async def test_each_invoke_host_function_operation_emits_its_transfer_event(sim: Simulator) -> None:
    by_id = {e["id"]: e for e in sim.rpc_events()}
    invokes = [op for op in sim.records("/operations") if op["type"] == "invoke_host_function"]
    assert invokes
    for op in invokes:
        toid = int(op["id"])
        cursor = Cursor(toid >> 32, (toid >> 12) & TX_MASK, (toid & 0xFFF) - 1, 0)  # Horizon's op from 1
        event, change = by_id[str(cursor)], op["asset_balance_changes"][0]
        asset = (
            "native"
            if change["asset_type"] == "native"
            else f"{change['asset_code']}:{change['asset_issuer']}"
        )
        assert event["type"] == "contract" and event["contractId"] == change["to"]
        assert event["txHash"] == op["transaction_hash"] and event["ledgerClosedAt"] == op["created_at"]
        assert [native(t) for t in event["topic"]] == ["transfer", op["source_account"], change["to"], asset]
        assert native(event["value"]) == stroops_of(change["amount"])


async def test_a_system_event_closes_every_20th_ledger_after_all_transactions(sim: Simulator) -> None:
    system = [e for e in sim.rpc_events() if e["type"] == "system"]
    assert [e["ledger"] for e in system] == [50_000_020, 50_000_040]
    for e in system:
        assert Cursor.parse(e["id"]) == Cursor(e["ledger"], TX_MASK, 0, 0) and e["contractId"] == ""
        assert [native(t) for t in e["topic"]] == ["ledger_closed", e["ledger"]]
        last = [x for x in sim.rpc_events() if x["ledger"] == e["ledger"]][-1]
        assert last == e


def test_events_are_a_function_of_seed_and_ledger_and_their_cache_is_bounded() -> None:
    spec = ChainSpec(seed=5, ops_per_ledger=30)
    one, two = Chain(spec, 40), Chain(spec, 40, cache_records=100)
    assert [ledger_events(one, s) for s in range(one.first, one.latest + 1)] == [
        ledger_events(two, s) for s in range(two.first, two.latest + 1)
    ]
    log = EventLog(one, cache_events=20)
    everything = [log.events(s) for s in range(one.first, one.latest + 1)]
    assert sum(map(len, everything)) > 40 and len(log._cache) <= 20
    assert [log.events(s) for s in range(one.first, one.latest + 1)] == everything
    assert log.events(one.latest + 1) == () and log.events(one.first - 1) == ()


def test_our_scval_encodings_are_the_sdks() -> None:
    address = "CAKOY3D4C4KUGFH5XI2WABOKBU6O7GTZ6UHUOYLWDHBCDCRCD5V7AG3Z"
    assert scval_b64(("address", address)) == scval.to_address(address).to_xdr()
    assert scval_b64(("i128", 2**70 + 5)) == scval.to_int128(2**70 + 5).to_xdr()
    assert scval_b64(("u64", 7)) == scval.to_uint64(7).to_xdr()
    assert stroops_of("12.3456789") == 123_456_789 and stroops_of("0.0000001") == 1


async def test_json_format_sends_topic_json_and_value_json_of_the_same_values(sim: Simulator) -> None:
    start = {"startLedger": sim.chain.first, "pagination": {"limit": 1000}}
    plain = (await events(sim, **start))["events"]
    as_json = (await events(sim, xdrFormat="json", **start))["events"]
    kinds = set()
    for b64, js in zip(plain, as_json, strict=True):
        assert "topic" not in js and "value" not in js
        assert {k: v for k, v in js.items() if not k.endswith("Json")} == {
            k: v for k, v in b64.items() if k not in ("topic", "value")
        }
        for segment, shown in zip(b64["topic"], js["topicJson"], strict=True):
            ((kind, value),) = shown.items()
            kinds.add(kind)
            assert native(segment) == (int(value) if kind in ("i128", "u64") else value)
        ((kind, value),) = js["valueJson"].items()
        kinds.add(kind)
        assert native(b64["value"]) == (int(value) if kind in ("i128", "u64") else value)
    assert kinds == {"symbol", "address", "string", "i128", "u32", "u64", "bool"}


# -- getEvents: cursors ----------------------------------------------------------------------------


async def test_paging_with_cursors_gives_every_event_exactly_once_in_order(sim: Simulator) -> None:
    got, cursor = await page_all(sim, 7, startLedger=sim.chain.first)
    assert got == sim.rpc_events()
    assert cursor == str(Cursor.through(sim.chain.latest))


async def test_a_full_page_ends_at_its_last_id_a_short_one_at_the_last_ledger_scanned(sim: Simulator) -> None:
    everything = sim.rpc_events()
    full = await events(sim, startLedger=sim.chain.first, pagination={"limit": 5})
    assert full["events"] == everything[:5] and full["cursor"] == everything[4]["id"]
    after = await events(sim, pagination={"cursor": full["cursor"], "limit": 3})
    assert after["events"] == everything[5:8]  # strictly after the cursor
    end = sim.chain.first + 3
    short = await events(sim, startLedger=sim.chain.first, endLedger=end, pagination={"limit": 1000})
    assert short["events"] == [e for e in everything if e["ledger"] < end]
    assert short["cursor"] == str(Cursor.through(end - 1))
    resumed = await events(sim, pagination={"cursor": short["cursor"], "limit": 1000})
    assert resumed["events"][0] == next(e for e in everything if e["ledger"] == end)


async def test_polling_at_the_tip_returns_nothing_until_a_ledger_closes(sim: Simulator) -> None:
    _, cursor = await page_all(sim, 1000, startLedger=sim.chain.first)
    for _ in range(2):
        again = await events(sim, pagination={"cursor": cursor})
        assert again["events"] == [] and again["cursor"] == cursor
    while True:  # a ledger with events
        seq = sim.close_ledger()
        if sim.rpc_events([EventFilter()])[-1]["ledger"] == seq:
            break
    fresh = await events(sim, pagination={"cursor": cursor, "limit": 1000})
    assert fresh["events"] and {e["ledger"] for e in fresh["events"]} == {seq}
    assert fresh["events"] == [e for e in sim.rpc_events() if e["ledger"] == seq]
    assert fresh["cursor"] == str(Cursor.through(seq))


async def test_one_request_scans_at_most_10000_ledgers() -> None:
    config = attrs.evolve(
        CONFIG, history_ledgers=LEDGER_SCAN_LIMIT + 1500, retention_ledgers=0, ops_per_ledger=1
    )
    async with open_simulator(config) as sim:
        first, latest = sim.chain.first, sim.chain.latest
        nobody = {"contractIds": ["CAKOY3D4C4KUGFH5XI2WABOKBU6O7GTZ6UHUOYLWDHBCDCRCD5V7AG3Z"]}
        capped = await events(sim, startLedger=first, filters=[nobody])
        assert capped["events"] == []
        assert capped["cursor"] == str(Cursor.through(first + LEDGER_SCAN_LIMIT - 1))
        rest = await events(sim, pagination={"cursor": capped["cursor"]}, filters=[nobody])
        assert rest["events"] == [] and rest["cursor"] == str(Cursor.through(latest))
        bounded = await events(sim, startLedger=first + 5, endLedger=first + 9, filters=[nobody])
        assert bounded["cursor"] == str(Cursor.through(first + 8))


# -- getEvents: validation and range ---------------------------------------------------------------

C1 = "CAKOY3D4C4KUGFH5XI2WABOKBU6O7GTZ6UHUOYLWDHBCDCRCD5V7AG3Z"
A_CURSOR = str(Cursor(50_000_020, 1, 0, 0))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"startLedger": 50_000_020, "pagination": {"cursor": A_CURSOR}},
            "ledger ranges and cursor cannot both be set",
        ),
        ({"startLedger": 0}, "startLedger must be positive"),
        ({"startLedger": 50_000_020, "pagination": {"limit": 10_001}}, "limit must not exceed 10000"),
        ({"startLedger": 50_000_020, "filters": [{}] * 6}, "maximum 5 filters per request"),
        (
            {"startLedger": 50_000_020, "filters": [{"type": "diagnostic"}]},
            "filter 1 invalid: filter type invalid: if set, type must be either 'system' or 'contract'",
        ),
        (
            {"startLedger": 50_000_020, "filters": [{"contractIds": [C1] * 6}]},
            "filter 1 invalid: maximum 5 contract IDs per filter",
        ),
        (
            {"startLedger": 50_000_020, "filters": [{}, {"contractIds": [C1, "CNOTACONTRACT"]}]},
            "filter 2 invalid: contract ID 2 invalid",
        ),
        (
            {"startLedger": 50_000_020, "filters": [{"topics": [["*"]] * 6}]},
            "filter 1 invalid: maximum 5 topics per filter",
        ),
        (
            {"startLedger": 50_000_020, "filters": [{"topics": [["*"], ["**", "*"]]}]},
            "filter 1 invalid: topic 2 invalid: segment 1 invalid: "
            "wildcard '**' is only allowed as the last segment",
        ),
        (
            {"startLedger": 50_000_020, "filters": [{"topics": [["*"] * 5]}]},
            "filter 1 invalid: topic 1 invalid: topic cannot have more than 4 segments",
        ),
        ({"pagination": {"cursor": "abc"}}, "invalid event id abc"),
    ],
)
async def test_invalid_params_get_the_servers_message(
    sim: Simulator, params: dict[str, Any], message: str
) -> None:
    assert await error(sim, "getEvents", params) == (INVALID_PARAMS, message)


async def test_a_segment_that_is_not_base64_xdr_is_invalid_params(sim: Simulator) -> None:
    params = {"startLedger": sim.chain.first, "filters": [{"topics": [["not base64!"]]}]}
    code, message = await error(sim, "getEvents", params)
    assert code == INVALID_PARAMS and message.startswith("xdr:decode")


async def test_a_start_outside_the_retained_range_is_an_invalid_request_naming_the_range(
    sim: Simulator,
) -> None:
    oldest, latest = sim.chain.first, sim.chain.latest
    assert oldest == latest - 49  # retention
    expected = (INVALID_REQUEST, RANGE_MESSAGE.format(oldest=oldest, latest=latest))
    assert await error(sim, "getEvents", {"startLedger": oldest - 1}) == expected
    assert await error(sim, "getEvents", {"startLedger": latest + 1}) == expected
    assert await error(sim, "getEvents", {"pagination": {"cursor": str(Cursor(oldest - 1, 3))}}) == expected
    assert (await events(sim, startLedger=oldest))["events"]



async def test_an_rpc_window_narrower_than_horizons_history_is_the_rpcs_range_alone() -> None:
    # stellar-rpc keeps 7 days whatever Horizon keeps: --rpc-retention-ledgers narrows the RPC only
    config = attrs.evolve(
        CONFIG, history_ledgers=30, retention_ledgers=0, rpc_retention_ledgers=10, rpc_max_healthy_latency=0
    )
    async with open_simulator(config) as sim:
        first, latest = sim.chain.first, sim.chain.latest
        assert latest - first + 1 == 30  # Horizon (and the chain) keep every ledger
        health = (await call(sim, "getHealth"))["result"]
        assert (health["oldestLedger"], health["latestLedger"]) == (latest - 9, latest)
        assert health["ledgerRetentionWindow"] == 10
        expected = (INVALID_REQUEST, RANGE_MESSAGE.format(oldest=latest - 9, latest=latest))
        assert await error(sim, "getEvents", {"startLedger": first}) == expected
        assert {e["ledger"] for e in (await events(sim, startLedger=latest - 9))["events"]} <= set(
            range(latest - 9, latest + 1)
        )
    assert config_from_args(["--rpc-retention-ledgers", "10"]).rpc_retention_ledgers == 10

# -- getEvents: filters ---------------------------------------------------------------------------


def _segments(e: dict[str, Any]) -> list[str]:
    return list(e["topic"])


FILTER_CASES: list[tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = [
    ({"topics": [[SYM["transfer"], "*", "*", "*"]]}, lambda e: _segments(e)[0] == SYM["transfer"]),
    ({"topics": [[SYM["approve"], "**"]]}, lambda e: _segments(e)[0] == SYM["approve"]),
    ({"topics": [["*"]]}, lambda e: len(_segments(e)) == 1),
    ({"topics": [["*", "*"]]}, lambda e: len(_segments(e)) == 2),
    ({"topics": [["*", "*", "**"]]}, lambda e: len(_segments(e)) >= 2),
    ({"topics": [["**"]]}, lambda e: True),
    ({"topics": [[SYM["counter"]]]}, lambda e: False),  # counter events have two segments
    ({"topics": [[SYM["counter"], "**"]]}, lambda e: _segments(e)[0] == SYM["counter"]),
    (
        {"topics": [[SYM["ping"], "**"], [SYM["counter"], "*"]]},
        lambda e: _segments(e)[0] in (SYM["ping"], SYM["counter"]),
    ),
    ({"type": "system"}, lambda e: e["type"] == "system"),
    (
        {"type": "contract", "topics": [["*", "*"]]},
        lambda e: e["type"] == "contract" and len(_segments(e)) == 2,
    ),
]


@pytest.mark.parametrize(("raw", "wanted"), FILTER_CASES)
async def test_filters_select_what_a_plain_filter_selects(
    sim: Simulator, raw: dict[str, Any], wanted: Callable[[dict[str, Any]], bool]
) -> None:
    everything = sim.rpc_events()
    expected = [e for e in everything if wanted(e)]
    got = (await events(sim, startLedger=sim.chain.first, filters=[raw], pagination={"limit": 1000}))[
        "events"
    ]
    assert got == expected
    assert got == sim.rpc_events([EventFilter.from_json(raw)])


async def test_contract_ids_and_several_filters_are_or_ed(sim: Simulator) -> None:
    everything = sim.rpc_events()
    c1, c2 = everything[0]["contractId"], everything[-3]["contractId"]
    filters = [{"contractIds": [c1]}, {"contractIds": [c2], "topics": [[SYM["transfer"], "**"]]}]
    got = (await events(sim, startLedger=sim.chain.first, filters=filters, pagination={"limit": 1000}))[
        "events"
    ]
    expected = [
        e
        for e in everything
        if e["contractId"] == c1 or (e["contractId"] == c2 and e["topic"][0] == SYM["transfer"])
    ]
    assert got == expected and {e["contractId"] for e in got} <= {c1, c2}


# -- the other methods and JSON-RPC errors ----------------------------------------------------------


async def test_health_latest_ledger_and_network_parse_with_the_sdk_models(sim: Simulator) -> None:
    seq = sim.close_ledger()  # history closed in the past: a live ledger makes the node healthy
    health = (await call(sim, "getHealth"))["result"]
    GetHealthResponse.model_validate(health)
    assert health == {
        "status": "healthy",
        "latestLedger": seq,
        "latestLedgerCloseTime": sim.chain.closed_at(seq),
        "oldestLedger": sim.chain.first,
        "oldestLedgerCloseTime": sim.chain.closed_at(sim.chain.first),
        "ledgerRetentionWindow": 50,
    }
    latest = (await call(sim, "getLatestLedger"))["result"]
    GetLatestLedgerResponse.model_validate(latest)
    assert latest["id"] == ledger_hash_of(CONFIG.seed, seq) and latest["sequence"] == seq
    assert (
        latest["closeTime"] == str(sim.chain.closed_at(seq)) and latest["protocolVersion"] == PROTOCOL_VERSION
    )
    assert latest["headerXdr"] and latest["metadataXdr"]
    network = (await call(sim, "getNetwork"))["result"]
    GetNetworkResponse.model_validate(network)
    assert network == {"passphrase": NETWORK_PASSPHRASE, "protocolVersion": PROTOCOL_VERSION}


async def test_health_fails_when_the_latest_ledger_closed_over_30s_ago(sim: Simulator) -> None:
    code, message = await error(sim, "getHealth", None)
    latency = round(time.time() - sim.chain.closed_at(sim.chain.latest))
    assert code == INTERNAL_ERROR
    assert message in {
        f"latency ({go_duration(s)}) since last known ledger closed is too high (>30s)"
        for s in (latency - 1, latency, latency + 1)
    }
    assert go_duration(45) == "45s" and go_duration(125) == "2m5s" and go_duration(3600) == "1h0m0s"


async def test_json_rpc_errors_for_bad_json_bad_requests_and_unknown_methods(sim: Simulator) -> None:
    assert await error(sim, "getTransactions", {}) == (METHOD_NOT_FOUND, "method not found")
    bad = (await post(sim, b"{not json")).json()
    assert bad["error"]["code"] == PARSE_ERROR and bad["id"] is None
    for body in ([{"jsonrpc": "2.0", "id": 1, "method": "getHealth"}], {"id": 4, "method": "getHealth"}, 5):
        answer = (await post(sim, body)).json()
        assert answer["error"]["code"] == INVALID_REQUEST
    assert (await call(sim, "getNetwork", request_id="abc"))["id"] == "abc"
    assert [r.method for r in sim.rpc_requests] == [
        "getTransactions",
        None,
        None,
        None,
        None,
        "getNetwork",
    ]
    assert sim.rpc_statuses[200] == 6 and sim.rpc_errors[INVALID_REQUEST] == 3


# -- faults ---------------------------------------------------------------------------------------


async def test_processing_limit_fails_the_next_requests_with_32001_over_http_200(sim: Simulator) -> None:
    sim.rpc_faults.fail_requests(RpcFailureKind.PROCESSING_LIMIT, count=2)
    for _ in range(2):
        assert await error(sim, "getNetwork", None) == (
            PROCESSING_LIMIT,
            "request exceeded processing limit threshold",
        )
    assert "result" in await call(sim, "getNetwork")


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (RpcFailureKind.TOO_MANY_REQUESTS, 429),
        (RpcFailureKind.UNAVAILABLE, 503),
        (RpcFailureKind.SERVER_ERROR, 500),
    ],
)
async def test_http_failures_answer_with_their_status(
    sim: Simulator, kind: RpcFailureKind, status: int
) -> None:
    sim.rpc_faults.fail_requests(kind, retry_after=7)
    failed = await post(sim, {"jsonrpc": "2.0", "id": 1, "method": "getNetwork"})
    assert failed.status_code == status
    assert failed.headers.get("retry-after") == ("7" if status == 429 else None)
    assert (await post(sim, {"jsonrpc": "2.0", "id": 1, "method": "getNetwork"})).status_code == 200
    assert sim.rpc_statuses[status] == 1 and sim.rpc_requests[-1].method == "getNetwork"


async def test_the_control_endpoint_arms_shows_and_clears_rpc_faults(sim: Simulator) -> None:
    url = f"{sim.rpc_url}/_simulator/faults"
    async with httpx.AsyncClient(timeout=5) as http:
        armed = await http.post(
            url, json={"fail": {"kind": "http_429", "count": 3, "retry_after": 2}, "lag_ledgers": 4}
        )
        assert armed.status_code == 200
        assert armed.json() == {
            "fail": {"kind": "http_429", "count": 3, "seconds": None, "retry_after": 2},
            "delay_ms": 0,
            "lag_ledgers": 4,
            "reset_to": None,
        }
        assert (await http.get(url)).json() == armed.json()
        assert (await http.post(url, json={"explode": {}})).status_code == 400
        assert (await http.post(url, json={"fail": {"kind": "http_418"}})).status_code == 400
        cleared = (await http.delete(url)).json()
    assert cleared["fail"] is None and cleared["lag_ledgers"] == 0
    assert len(sim.rpc_requests) == 0  # the control endpoint is not an RPC request


async def test_delay_ms_and_the_simulator_wide_response_delay_slow_every_answer(sim: Simulator) -> None:
    sim.rpc_faults.set_delay(150)
    start = trio.current_time()
    await call(sim, "getNetwork")
    assert trio.current_time() - start >= 0.15
    async with open_simulator(attrs.evolve(CONFIG, history_ledgers=2, response_delay_ms=150)) as slow:
        start = trio.current_time()
        await call(slow, "getNetwork")
        assert trio.current_time() - start >= 0.15


async def test_a_lagging_node_reports_and_serves_only_up_to_its_latest(sim: Simulator) -> None:
    sim.rpc_faults.lag(5)
    lagging = sim.chain.latest - 5
    assert (await call(sim, "getLatestLedger"))["result"]["sequence"] == lagging
    got, cursor = await page_all(sim, 1000, startLedger=sim.chain.first)
    assert got == sim.rpc_events() and got[-1]["ledger"] <= lagging and cursor == str(Cursor.through(lagging))
    code, message = await error(sim, "getEvents", {"startLedger": sim.chain.latest})
    assert (code, message) == (INVALID_REQUEST, RANGE_MESSAGE.format(oldest=sim.chain.first, latest=lagging))
    sim.rpc_faults.lag(0)
    caught_up = await events(sim, pagination={"cursor": cursor, "limit": 1000})
    assert caught_up["events"] == [e for e in sim.rpc_events() if e["ledger"] > lagging]


async def test_a_reset_node_reports_a_latest_far_below_and_refuses_old_cursors(sim: Simulator) -> None:
    _, cursor = await page_all(sim, 1000, startLedger=sim.chain.first)
    sim.rpc_faults.reset(1_000)
    assert (await call(sim, "getLatestLedger"))["result"]["sequence"] == 1_000
    code, message = await error(sim, "getEvents", {"pagination": {"cursor": cursor}})
    assert (code, message) == (INVALID_REQUEST, RANGE_MESSAGE.format(oldest=1_000, latest=1_000))
    assert (await events(sim, startLedger=1_000))["events"] == []


async def test_the_rpc_server_goes_down_and_comes_back_on_the_same_port(sim: Simulator) -> None:
    url = sim.rpc_url
    await sim.rpc_go_down()
    with pytest.raises(httpx.ConnectError):
        await post(sim, {"jsonrpc": "2.0", "id": 1, "method": "getNetwork"})
    async with httpx.AsyncClient(timeout=5) as http:
        assert (await http.get(f"{sim.url}/")).status_code == 200  # Horizon stays up
    await sim.rpc_come_up()
    assert sim.rpc_url == url and "result" in await call(sim, "getNetwork")


def test_rpc_faults_count_down_and_expire_by_the_clock() -> None:
    now = [100.0]
    faults = RpcFaults(clock=lambda: now[0])
    faults.fail_requests("http_503", seconds=2)
    assert faults.take_request_failure() is not None
    now[0] += 2
    assert faults.take_request_failure() is None and faults.snapshot()["fail"] is None
    faults.fail_requests()
    failure = faults.take_request_failure()
    assert failure is not None and failure.kind is RpcFailureKind.PROCESSING_LIMIT
    assert faults.take_request_failure() is None
    faults.lag(3)
    assert faults.ledger_range(10, 50) == (10, 47)
    faults.reset(5)
    assert faults.ledger_range(10, 50) == (5, 5)
    with pytest.raises(ValueError, match="not both"):
        faults.fail_requests(count=1, seconds=1)


# -- the command line ------------------------------------------------------------------------------


def test_rpc_port_flag() -> None:
    assert config_from_args([]).rpc_port is None
    assert config_from_args(["--rpc-port", "0"]).rpc_port == 0
    assert config_from_args(["--rpc-max-healthy-latency", "0"]).rpc_max_healthy_latency == 0


async def test_health_without_a_latency_limit_is_healthy_on_old_history() -> None:
    async with open_simulator(attrs.evolve(CONFIG, history_ledgers=2, rpc_max_healthy_latency=0)) as sim:
        assert (await call(sim, "getHealth"))["result"]["status"] == "healthy"


async def test_cli_announces_the_rpc_url() -> None:
    flags = ("--port", "0", "--rpc-port", "0", "--history-ledgers", "2")
    async with simulator_process(*flags) as (proc, announced):
        assert announced["event"] == "simulator-listening" and announced["rpc_url"] != announced["url"]
        async with httpx.AsyncClient(timeout=5) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "getNetwork"}
            answer = (await http.post(announced["rpc_url"], json=body)).json()
        assert answer["result"]["passphrase"] == NETWORK_PASSPHRASE
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            assert await proc.wait() == 0
