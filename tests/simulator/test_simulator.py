"""The simulator over real sockets: paging, streaming and fault knobs behave as Horizon's would."""

from __future__ import annotations

import datetime
import json
import signal
import time
from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio
import trio.testing

from ingestion.common.paging import toid, toid_parts, token_key
from ingestion.simulator import Faults, MalformedKind, Simulator, open_simulator
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import ChainSpec
from ingestion.testing.wait import wait_until
from tests.support.simulator import SMALL, read_stream, running, simulator_process


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async for s in running():
        yield s


async def get(url: str, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(url, **kwargs)  # type: ignore[arg-type]


def tokens(response: httpx.Response) -> list[str]:
    return [r["paging_token"] for r in response.json()["_embedded"]["records"]]


# -- paging --------------------------------------------------------------------------------------


async def test_page_is_hal_json_with_go_escaped_links(sim: Simulator) -> None:
    r = await get(f"{sim.url}/operations?limit=3")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/hal+json; charset=utf-8"
    assert b"cursor=\\u0026limit=3\\u0026order=asc" in r.content
    assert b"&" not in r.content
    assert r.content.startswith(b'{\n  "_links": {\n    "self": {\n      "href": ')
    body = r.json()
    assert body["_links"]["self"]["href"] == f"{sim.url}/operations?cursor=&limit=3&order=asc"
    last = body["_embedded"]["records"][-1]["paging_token"]
    assert body["_links"]["next"]["href"] == f"{sim.url}/operations?cursor={last}&limit=3&order=asc"
    assert "x-ratelimit-limit" not in r.headers  # no --rate-limit: no limiter, no headers


async def test_cursor_is_exclusive_and_next_link_continues(sim: Simulator) -> None:
    everything = tokens(await get(f"{sim.url}/operations?limit=200"))
    assert len(everything) == 4 * 6
    first = await get(f"{sim.url}/operations?limit=5")
    second = await get(first.json()["_links"]["next"]["href"])
    assert tokens(first) + tokens(second) == everything[:10]
    after = await get(f"{sim.url}/operations?cursor={everything[3]}&limit=2")
    assert tokens(after) == everything[4:6]


async def test_tokens_sort_as_numbers_and_default_limit_is_10(sim: Simulator) -> None:
    for resource in ("/ledgers", "/transactions", "/operations", "/effects", "/payments"):
        got = tokens(await get(f"{sim.url}{resource}"))
        assert got == sorted(got, key=token_key)
        assert len(got) == min(10, len(sim.records(resource)))


@pytest.mark.parametrize("limit", ["0", "201", "-1", "ten"])
async def test_limit_out_of_bounds_is_a_400_problem(sim: Simulator, limit: str) -> None:
    r = await get(f"{sim.url}/operations?limit={limit}")
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json; charset=utf-8"
    problem = r.json()
    assert problem["type"] == "https://stellar.org/horizon-errors/bad_request"
    assert problem["status"] == 400
    assert problem["extras"]["invalid_field"] == "limit"


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/operations?cursor=abc", "cursor"),
        ("/operations?cursor=12-1", "cursor"),
        ("/effects?cursor=-5", "cursor"),
        ("/operations?order=up", "order"),
        ("/accounts/GNOTANACCOUNT/operations", "account_id"),
    ],
)
async def test_bad_parameters_are_400_problems(sim: Simulator, path: str, field: str) -> None:
    r = await get(f"{sim.url}{path}")
    assert r.status_code == 400
    assert r.json()["extras"]["invalid_field"] == field


@pytest.mark.parametrize(
    "path", ["/nope", "/ledgers/1", "/operations/5", "/transactions/" + "0" * 64]
)
async def test_unknown_paths_and_records_are_404_not_found(sim: Simulator, path: str) -> None:
    r = await get(f"{sim.url}{path}")
    assert r.status_code == 404
    assert r.json()["type"] == "https://stellar.org/horizon-errors/not_found"


async def test_desc_order_is_the_reverse_and_prev_link_flips_order(sim: Simulator) -> None:
    asc = [r["paging_token"] for r in sim.records("/effects")]
    r = await get(f"{sim.url}/effects?order=desc&limit=200")
    assert tokens(r) == asc[::-1]
    r = await get(f"{sim.url}/effects?order=desc&limit=3&cursor={asc[5]}")
    assert tokens(r) == [asc[4], asc[3], asc[2]]
    assert "order=asc" in r.json()["_links"]["prev"]["href"]


async def test_cursor_now_pages_nothing_newer(sim: Simulator) -> None:
    assert tokens(await get(f"{sim.url}/operations?cursor=now")) == []
    assert len(tokens(await get(f"{sim.url}/operations?cursor=now&order=desc&limit=200"))) == 24


async def test_scoped_lists_agree_with_the_records(sim: Simulator) -> None:
    ops = sim.records("/operations")
    op = ops[7]
    ledger = int(op["paging_token"]) >> 32
    by_ledger = [o for o in ops if int(o["paging_token"]) >> 32 == ledger]
    r = await get(f"{sim.url}/ledgers/{ledger}/operations?limit=200")
    assert tokens(r) == [o["paging_token"] for o in by_ledger]
    r = await get(f"{sim.url}/transactions/{op['transaction_hash']}/operations")
    assert op["paging_token"] in tokens(r)
    r = await get(f"{sim.url}/accounts/{op['source_account']}/operations?limit=200")
    assert op["paging_token"] in tokens(r)
    r = await get(f"{sim.url}/operations/{op['id']}")
    assert r.json() == op
    r = await get(f"{sim.url}/operations/{op['id']}/effects")
    assert all(t.startswith(op["id"] + "-") for t in tokens(r))


async def test_records_are_joined_consistently(sim: Simulator) -> None:
    ledgers = {lg["sequence"]: lg for lg in sim.records("/ledgers")}
    txs = {tx["hash"]: tx for tx in sim.records("/transactions")}
    ops = sim.records("/operations")
    for lg in ledgers.values():
        assert toid_parts(int(lg["paging_token"])) == (lg["sequence"], 0, 0)
        assert ledgers.get(lg["sequence"] - 1, {"hash": lg["prev_hash"]})["hash"] == lg["prev_hash"]
    for tx in txs.values():
        ledger, order, index = toid_parts(int(tx["paging_token"]))
        assert (ledger, index) == (tx["ledger"], 0) and order >= 1
        assert tx["created_at"] == ledgers[ledger]["closed_at"]
    for op in ops:
        tx = txs[op["transaction_hash"]]
        ledger, order, index = toid_parts(int(op["id"]))
        assert int(op["id"]) >> 12 << 12 == int(tx["paging_token"])
        assert 1 <= index <= tx["operation_count"]
        assert op["created_at"] == tx["created_at"]
        assert op["_links"]["transaction"]["href"].endswith(tx["hash"])
    op_ids = {op["id"] for op in ops}
    for effect in sim.records("/effects"):
        op_id, n = effect["paging_token"].split("-")
        assert op_id in op_ids and int(n) >= 1
        assert effect["id"] == f"{int(op_id):019d}-{int(n):010d}"
    assert sum(lg["operation_count"] for lg in ledgers.values()) == len(ops)


def test_chain_is_deterministic_under_a_seed() -> None:
    spec = ChainSpec(seed=3, ops_per_ledger=25)
    a, b, c = Chain(spec, 3), Chain(spec, 3), Chain(attrs.evolve(spec, seed=4), 3)
    key = a.page("operations", after=None, descending=False, limit=30)[-1]
    assert a.record(key) == b.record(key)
    assert a.record(key) != c.record(key)


def test_chain_rebuilds_evicted_ledgers_identically() -> None:
    chain = Chain(ChainSpec(ops_per_ledger=50), history_ledgers=20, cache_records=100)
    keys = chain.page("effects", after=None, descending=False, limit=5)
    before = [dict(chain.record(k)) for k in keys]
    for seq in range(chain.first, chain.latest + 1):
        chain.content(seq)  # push the first ledger out of the LRU
    assert [chain.record(k) for k in keys] == before


# -- streaming -----------------------------------------------------------------------------------


async def test_stream_says_hello_then_records_then_byebye_after_limit(sim: Simulator) -> None:
    response, frames, ended = await read_stream(f"{sim.url}/operations?cursor=0&limit=3")
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert frames[0].fields == (("retry", "1000"), ("event", "open"), ("data", '"hello"'))
    expected = sim.records("/operations")[:3]
    for frame, record in zip(frames[1:4], expected, strict=True):
        assert frame.get("id") == record["paging_token"]
        assert json.loads(frame.get("data") or "") == record
    assert frames[4].fields == (("retry", "10"), ("event", "close"), ("data", '"byebye"'))
    assert ended and len(frames) == 5


async def test_stream_without_limit_says_byebye_after_ten_events_like_horizon(sim: Simulator) -> None:
    _, frames, ended = await read_stream(f"{sim.url}/operations?cursor=0")
    expected = [r["paging_token"] for r in sim.records("/operations")[:10]]
    assert [f.get("id") for f in frames[1:-1]] == expected
    assert ended and frames[-1].get("data") == '"byebye"'


async def test_stream_events_are_compact_go_json(sim: Simulator) -> None:
    _, frames, _ = await read_stream(f"{sim.url}/effects?limit=1", frames=2)
    data = frames[1].get("data") or ""
    assert "\\u0026cursor=" in data and ": " not in data.split('"created_at"')[0][:50]


async def test_last_event_id_overrides_cursor(sim: Simulator) -> None:
    ops = sim.records("/operations")
    _, frames, _ = await read_stream(
        f"{sim.url}/operations?cursor=0&limit=2",
        headers={"Last-Event-ID": ops[10]["paging_token"]},
    )
    assert [f.get("id") for f in frames[1:3]] == [ops[11]["paging_token"], ops[12]["paging_token"]]


async def until_streams(sim: Simulator, count: int) -> None:
    """Wait (bounded) until ``count`` streams are open: no guessing with sleeps under load."""
    await wait_until(lambda: sim.active_streams >= count, 5, what=f"{count} open streams", every=0.01)


async def test_stream_sends_new_records_as_ledgers_close(sim: Simulator) -> None:
    async with trio.open_nursery() as nursery:
        result: list = []

        async def reader() -> None:
            result.append(await read_stream(f"{sim.url}/ledgers?cursor=now&limit=2"))

        nursery.start_soon(reader)
        await until_streams(sim, 1)
        first = sim.close_ledger()
        second = sim.close_ledger()
    _, frames, ended = result[0]
    assert [f.get("id") for f in frames[1:3]] == [str(first << 32), str(second << 32)]
    assert ended and frames[-1].get("event") == "close"


async def test_stream_ends_with_byebye_at_the_connection_timeout() -> None:
    async for s in running(attrs.evolve(SMALL, stream_timeout=0.3)):
        _, frames, ended = await read_stream(f"{s.url}/operations?cursor=now")
        assert ended
        assert [f.get("event") for f in frames] == ["open", "close"]


async def test_client_disconnect_ends_the_stream_task(sim: Simulator) -> None:
    _, frames, ended = await read_stream(f"{sim.url}/operations?cursor=now", frames=1)
    assert not ended and frames[0].get("event") == "open"
    await wait_until(lambda: not sim.active_streams, 2, what="no open stream", every=0.01)


async def test_stream_with_a_bad_cursor_fails_before_hello_with_a_problem(sim: Simulator) -> None:
    response, frames, _ = await read_stream(f"{sim.url}/operations?cursor=x")
    assert response.status_code == 400 and frames == []
    assert response.headers["content-type"].startswith("application/problem+json")


# -- faults --------------------------------------------------------------------------------------


async def test_rate_limit_fault_answers_429_with_headers_for_n_requests(sim: Simulator) -> None:
    sim.faults.fail_requests(429, count=2, retry_after=3)
    for _ in range(2):
        r = await get(f"{sim.url}/operations")
        assert r.status_code == 429
        assert r.headers["retry-after"] == "3"
        assert r.headers["x-ratelimit-remaining"] == "0"
        assert {"x-ratelimit-limit", "x-ratelimit-reset"} <= set(r.headers)
        assert r.json()["type"] == "https://stellar.org/horizon-errors/rate_limit_exceeded"
    assert (await get(f"{sim.url}/operations")).status_code == 200


async def test_rate_limit_is_horizons_gcra_with_its_headers_problem_and_retry_after() -> None:
    # 3600 an hour: one request per second, bursts of 3 + 1.
    async with open_simulator(attrs.evolve(SMALL, rate_limit=3600, rate_burst=3)) as s:
        # The limiter reads the test's clock: the requests below fall in one emission interval
        # however slowly a loaded machine serves them, and the interval passes when the test says.
        limiter = s._app.limiter
        assert limiter is not None
        now = [trio.current_time()]
        limiter.clock = lambda: now[0]
        seen = []
        for _ in range(5):
            r = await get(f"{s.url}/ledgers?limit=1")
            seen.append((r.status_code, r.headers.get("x-ratelimit-remaining")))
        assert seen == [(200, "3"), (200, "2"), (200, "1"), (200, "0"), (429, "0")]
        assert r.headers["x-ratelimit-limit"] == "4" and r.headers["retry-after"] == "1"
        assert r.json()["type"] == "https://stellar.org/horizon-errors/rate_limit_exceeded"
        now[0] += 1.0  # one emission interval later, one more request is allowed
        assert (await get(f"{s.url}/")).status_code == 200
        assert (await get(f"{s.url}/")).status_code == 429
        # A stream opened without budget gets the 429 problem before any frame.
        response, frames, _ = await read_stream(f"{s.url}/ledgers?cursor=now")
        assert response.status_code == 429 and frames == []


async def test_a_stream_that_runs_out_of_rate_limit_gets_an_error_event_mid_stream() -> None:
    # Each new ledger wakes the stream and costs one request, as in Horizon's stream handler.
    async with open_simulator(attrs.evolve(SMALL, rate_limit=36, rate_burst=2)) as s:
        async with trio.open_nursery() as nursery:
            result: list = []

            async def reader() -> None:
                result.append(await read_stream(f"{s.url}/ledgers?cursor=now&limit=200"))

            nursery.start_soon(reader)
            await until_streams(s, 1)

            def stream_ended() -> bool:  # each wake-up by a new ledger spends one of the 3
                if result:
                    return True
                s.close_ledger()
                return False

            await wait_until(stream_ended, 5, what="the rate-limited stream ended", every=0.05)
        _, frames, ended = result[0]
        events = [f.get("event") for f in frames]
        assert events[0] == "open" and events[-1] == "error" and set(events[1:-1]) == {None}
        assert frames[-1].get("data") == "problem: rate_limit_exceeded" and ended


async def test_server_error_fault_lasts_for_its_seconds(sim: Simulator) -> None:
    now = moved_clock(sim.faults)
    sim.faults.fail_requests(500, seconds=0.3)
    r = await get(f"{sim.url}/ledgers")
    assert r.status_code == 500 and r.json()["type"].endswith("/server_error")
    response, _, _ = await read_stream(f"{sim.url}/ledgers")
    assert response.status_code == 500
    now[0] += 0.29
    assert (await get(f"{sim.url}/ledgers")).status_code == 500
    now[0] += 0.02
    assert (await get(f"{sim.url}/ledgers")).status_code == 200


def moved_clock(faults: Faults) -> list[float]:
    """Make ``faults`` read a clock the test moves (``now[0] += seconds``): a fault's seconds then
    pass only when the test says, however slowly a loaded machine serves the requests."""
    now = [faults.clock()]
    faults.clock = lambda: now[0]
    return now


async def test_close_stream_after_n_events_drops_it_without_byebye(sim: Simulator) -> None:
    sim.faults.close_streams_after(2)
    _, frames, ended = await read_stream(f"{sim.url}/operations?cursor=0")
    assert ended and [f.get("event") for f in frames] == ["open", None, None]
    _, frames, _ = await read_stream(f"{sim.url}/operations?cursor=0&limit=3")
    assert frames[-1].get("event") == "close"  # only the next stream was cut


@pytest.mark.parametrize("kind", list(MalformedKind))
async def test_malformed_event_is_sent_once(sim: Simulator, kind: MalformedKind) -> None:
    ops = [r["paging_token"] for r in sim.records("/operations")]
    _, first, _ = await read_stream(f"{sim.url}/operations?cursor=0&limit=1")
    sim.faults.send_malformed(kind)
    _, frames, _ = await read_stream(f"{sim.url}/operations?cursor={ops[2]}&limit=3")
    events = frames[1:-1]
    assert len(events) == 4  # three good ones and the bad one
    ids = [e.get("id") for e in events]
    if kind is MalformedKind.BROKEN_JSON:
        with pytest.raises(json.JSONDecodeError):
            json.loads(events[0].get("data") or "")
    elif kind is MalformedKind.MISSING_PAGING_TOKEN:
        assert ids[0] is None and "paging_token" not in json.loads(events[0].get("data") or "")
    elif kind is MalformedKind.DUPLICATE:
        assert ids == [ops[3], ops[3], ops[4], ops[5]]
        assert events[0] == events[1]
    else:
        assert ids == [ops[3], ops[2], ops[4], ops[5]]
    assert [i for i in ids if i is not None][-1] == ops[5]
    assert first  # the first stream had no previous event and was left alone


async def test_stall_silences_streams_for_its_seconds(sim: Simulator) -> None:
    sim.faults.stall_streams(0.5)
    start = trio.current_time()
    _, frames, _ = await read_stream(f"{sim.url}/operations?cursor=0&limit=1")
    assert trio.current_time() - start >= 0.45
    assert [f.get("event") for f in frames] == ["open", None, "close"]


async def test_go_down_refuses_connections_then_comes_back_with_the_same_chain(
    sim: Simulator,
) -> None:
    before = (await get(f"{sim.url}/operations?limit=200")).content
    await sim.go_down(0.3)
    with pytest.raises(httpx.ConnectError):
        await get(f"{sim.url}/")
    await wait_until(lambda: sim.is_up, 3, what="the simulator up again")
    assert (await get(f"{sim.url}/operations?limit=200")).content == before


async def test_going_down_drops_open_streams(sim: Simulator) -> None:
    async with trio.open_nursery() as nursery:
        result: list = []

        async def reader() -> None:
            result.append(await read_stream(f"{sim.url}/operations?cursor=now"))

        nursery.start_soon(reader)
        await until_streams(sim, 1)
        await sim.restart()
    _, frames, ended = result[0]
    assert ended and [f.get("event") for f in frames] == ["open"]
    assert (await get(f"{sim.url}/")).status_code == 200


async def test_control_endpoint_arms_and_clears_faults(sim: Simulator) -> None:
    async with httpx.AsyncClient(base_url=sim.url) as client:
        r = await client.post("/_simulator/faults", json={"fail": {"status": 500, "count": 1}})
        assert r.json()["fail"]["count"] == 1
        assert (await client.get("/ledgers")).status_code == 500
        assert (await client.get("/ledgers")).status_code == 200
        await client.post("/_simulator/faults", json={"malformed": {"kind": "duplicate"}})
        assert (await client.get("/_simulator/faults")).json()["malformed"] == ["duplicate"]
        await client.delete("/_simulator/faults")
        assert (await client.get("/_simulator/faults")).json()["malformed"] == []
        bad = await client.post("/_simulator/faults", json={"explode": {}})
        assert bad.status_code == 400
        latest = (await client.get("/_simulator/ledgers")).json()["latest_ledger"]
        r = await client.post("/_simulator/ledgers", json={"count": 2})
        assert r.json()["latest_ledger"] == latest + 2
        r = await client.post("/_simulator/faults", json={"down": {"seconds": 1.0}})
        assert r.status_code == 200
    await wait_until(lambda: not sim.is_up, 5, what="the simulator down", every=0.01)
    async with httpx.AsyncClient(base_url=sim.url) as fresh:
        if not sim.is_up:  # on a starved machine it may already be back
            with pytest.raises(httpx.ConnectError):
                await fresh.get("/")
        await wait_until(lambda: sim.is_up, 5, what="the simulator up again")
        assert (await fresh.get("/")).status_code == 200


def test_fault_knobs_are_pure_state_with_an_injected_clock() -> None:
    now = [0.0]
    faults = Faults(clock=lambda: now[0])
    faults.fail_requests(503, seconds=10)
    assert faults.take_request_failure() is not None
    now[0] = 10.0
    assert faults.take_request_failure() is None
    faults.send_malformed("duplicate")
    assert faults.take_malformed(have_previous=False) is None
    assert faults.take_malformed(have_previous=True) is MalformedKind.DUPLICATE
    with pytest.raises(ValueError, match="status"):
        faults.fail_requests(404)


async def test_ledgers_close_on_the_interval() -> None:
    async for s in running(attrs.evolve(SMALL, ledger_interval=0.05)):
        start = s.chain.latest
        await trio.sleep(0.3)
        assert s.chain.latest >= start + 3


# -- the command line ----------------------------------------------------------------------------


async def test_cli_prints_its_url_and_exits_0_on_sigint() -> None:
    async with simulator_process("--port", "0", "--history-ledgers", "2") as (proc, announced):
        assert announced["event"] == "simulator-listening"
        assert (await get(announced["url"] + "/")).json()["history_latest_ledger"] > 0
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            assert await proc.wait() == 0


async def test_live_ledgers_close_at_the_current_time_and_history_stays_in_the_past() -> None:
    async for s in running(SMALL):
        async with httpx.AsyncClient(timeout=5) as http:
            old = (await http.get(f"{s.url}/ledgers", params={"order": "asc", "limit": "1"})).json()
            seq = s.close_ledger()
            new = (await http.get(f"{s.url}/ledgers/{seq}")).json()
            ops = (await http.get(f"{s.url}/ledgers/{seq}/operations")).json()["_embedded"]["records"]
            root = (await http.get(f"{s.url}/")).json()
    closed = datetime.datetime.fromisoformat(new["closed_at"].replace("Z", "+00:00")).timestamp()
    assert abs(closed - time.time()) < 5
    assert old["_embedded"]["records"][0]["closed_at"] == "2025-01-01T00:00:00Z"  # deterministic
    assert all(op["created_at"] == new["closed_at"] for op in ops)
    assert root["history_latest_ledger_closed_at"] == new["closed_at"]


async def test_retention_keeps_only_the_newest_ledgers_and_the_elder_ledger_moves_as_they_close() -> None:
    async for s in running(attrs.evolve(SMALL, retention_ledgers=3)):
        first_op = s.records("/operations")[0]
        root = (await get(f"{s.url}/")).json()
        assert root["history_elder_ledger"] == root["history_latest_ledger"] - 2 == s.chain.first
        oldest = (await get(f"{s.url}/ledgers?limit=200")).json()["_embedded"]["records"]
        assert [r["sequence"] for r in oldest] == list(range(s.chain.first, s.chain.latest + 1))
        s.close_ledger()
        root = (await get(f"{s.url}/")).json()
        assert root["history_elder_ledger"] == root["history_latest_ledger"] - 2
        assert (await get(f"{s.url}/operations/{first_op['id']}")).status_code == 404
        # order=asc from a cursor older than history: silently moved up to the elder ledger
        page = (await get(f"{s.url}/operations?cursor={first_op['paging_token']}&limit=1")).json()
        assert toid_parts(int(page["_embedded"]["records"][0]["paging_token"]))[0] == s.chain.first


async def test_an_account_horizon_has_not_ingested_answers_404(sim: Simulator) -> None:
    unknown = "GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7"
    r = await get(f"{sim.url}/accounts/{unknown}/payments")
    assert r.status_code == 404 and r.json()["type"].endswith("/not_found")
    known = sim.records("/operations")[0]["source_account"]
    assert (await get(f"{sim.url}/accounts/{known}/operations")).status_code == 200


async def test_frozen_ingestion_answers_200_with_nothing_new_while_core_goes_on(sim: Simulator) -> None:
    now = moved_clock(sim.faults)
    latest = sim.chain.latest
    async with httpx.AsyncClient(timeout=5) as client:
        r = await client.post(f"{sim.url}/_simulator/faults", json={"freeze": {"seconds": 0.3}})
    assert r.status_code == 200 and r.json()["freeze"]["seconds"] > 0
    sim.close_ledger()
    sim.close_ledger()
    root = (await get(f"{sim.url}/")).json()
    assert (root["history_latest_ledger"], root["core_latest_ledger"]) == (latest, latest + 2)
    page = (await get(f"{sim.url}/ledgers?order=desc&limit=1")).json()
    assert page["_embedded"]["records"][0]["sequence"] == latest
    now[0] += 0.31
    sim.close_ledger()  # ingestion resumes: the ledgers closed meanwhile reach history
    root = (await get(f"{sim.url}/")).json()
    assert root["history_latest_ledger"] == root["core_latest_ledger"] == latest + 3


# -- fidelity (#11.9) ----------------------------------------------------------------------------


async def test_a_bare_effects_cursor_means_after_all_of_that_operations_effects(sim: Simulator) -> None:
    effects = sim.records("/effects")
    op = effects[0]["paging_token"].split("-")[0]
    later = [e["paging_token"] for e in effects if int(e["paging_token"].split("-")[0]) > int(op)]
    assert tokens(await get(f"{sim.url}/effects?cursor={op}&limit=200")) == later[:200]


async def test_503_is_stale_history_and_502_comes_from_a_proxy_without_a_problem(sim: Simulator) -> None:
    sim.faults.fail_requests(503, count=1)
    r = await get(f"{sim.url}/operations")
    assert r.status_code == 503 and r.json()["type"].endswith("/stale_history")
    sim.faults.fail_requests(502, count=1)
    r = await get(f"{sim.url}/operations")
    assert r.status_code == 502 and r.headers["content-type"] == "text/html"
    assert b"502 Bad Gateway" in r.content


async def test_links_carry_the_numeric_cursor_for_now(sim: Simulator) -> None:
    body = (await get(f"{sim.url}/operations?cursor=now&limit=5")).json()
    number = str(toid(sim.chain.latest + 1) - 1)
    assert body["_links"]["self"]["href"].startswith(f"{sim.url}/operations?cursor={number}&")
    assert body["_links"]["next"]["href"].startswith(f"{sim.url}/operations?cursor={number}&")


async def test_streams_poll_for_new_ledgers_at_the_sse_update_frequency() -> None:
    async with open_simulator(attrs.evolve(SMALL, sse_update_frequency=0.2)) as s:
        async with trio.open_nursery() as nursery:
            result: list = []

            async def reader() -> None:
                result.append(await read_stream(f"{s.url}/ledgers?cursor=now&limit=2"))

            nursery.start_soon(reader)
            await until_streams(s, 1)
            first, second = s.close_ledger(), s.close_ledger()
        _, frames, _ = result[0]
        assert [f.get("id") for f in frames[1:3]] == [str(first << 32), str(second << 32)]


async def test_include_failed_and_join_are_validated_and_echoed_in_links(sim: Simulator) -> None:
    r = await get(f"{sim.url}/operations?include_failed=maybe")
    assert r.status_code == 400 and r.json()["extras"]["invalid_field"] == "include_failed"
    r = await get(f"{sim.url}/operations?join=ledgers")
    assert r.status_code == 400 and r.json()["extras"]["invalid_field"] == "join"
    body = (await get(f"{sim.url}/operations?join=transactions&include_failed=true&limit=2")).json()
    assert "join=transactions" in body["_links"]["next"]["href"]
    first = body["_embedded"]["records"][0]
    assert first["transaction"]["hash"] == first["transaction_hash"]


# -- trades, liquidity pools, claimable balances (#11.6) ---------------------------------------

RICH = attrs.evolve(SMALL, history_ledgers=12, ops_per_ledger=40)


async def test_trades_have_operation_order_tokens_and_the_scoped_collections_filter_them() -> None:
    async with open_simulator(RICH) as s:
        trades = s.records("/trades")
        assert trades, "the chain has no trades"
        first = trades[0]
        op, order = first["paging_token"].split("-")
        assert first["id"] == first["paging_token"] and int(order) >= 0
        assert (await get(f"{s.url}/operations/{op}")).json()["type"] in (
            "manage_sell_offer", "manage_buy_offer", "path_payment_strict_send",
            "path_payment_strict_receive",
        )  # fmt: skip
        assert first["trade_type"] == "orderbook" and set(first["price"]) == {"n", "d"}
        page = (await get(f"{s.url}/trades?cursor={first['paging_token']}&limit=3")).json()
        assert tokens_of(page) == [t["paging_token"] for t in trades[1:4]]
        account = first["base_account"]
        mine = s.records(f"/accounts/{account}/trades")
        assert first in mine and all(account in (t["base_account"], t["counter_account"]) for t in mine)
        offer = s.records(f"/offers/{first['base_offer_id']}/trades")
        offer_id = first["base_offer_id"]
        assert offer == [t for t in trades if offer_id in (t["base_offer_id"], t["counter_offer_id"])]


async def test_liquidity_pool_and_claimable_balance_collections_hold_what_touched_them() -> None:
    async with open_simulator(RICH) as s:
        ops = s.records("/operations")
        deposit = next(o for o in ops if o["type"].startswith("liquidity_pool_"))
        pool = deposit["liquidity_pool_id"]
        pool_ops = s.records(f"/liquidity_pools/{pool}/operations")
        assert deposit in pool_ops and all(o["liquidity_pool_id"] == pool for o in pool_ops)
        pool_effects = s.records(f"/liquidity_pools/{pool}/effects")
        assert {e["type"] for e in pool_effects} <= {"liquidity_pool_deposited", "liquidity_pool_withdrew"}
        created = next(o for o in ops if o["type"] == "create_claimable_balance")
        effects = s.records(f"/operations/{created['id']}/effects")
        balance = effects[0]["balance_id"]
        balance_ops = s.records(f"/claimable_balances/{balance}/operations")
        assert balance_ops[0] == created
        assert all(o["type"] in ("create_claimable_balance", "claim_claimable_balance") for o in balance_ops)
        txs = s.records(f"/claimable_balances/{balance}/transactions")
        assert {t["hash"] for t in txs} == {o["transaction_hash"] for o in balance_ops}
        assert (await get(f"{s.url}/liquidity_pools/{'ab' * 32}/operations")).status_code == 404
        assert (await get(f"{s.url}/liquidity_pools/xyz/operations")).status_code == 400
        assert (await get(f"{s.url}/claimable_balances/{'00' * 36}/operations")).status_code == 404


def tokens_of(page: dict) -> list[str]:
    return [r["paging_token"] for r in page["_embedded"]["records"]]
