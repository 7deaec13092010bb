"""HorizonSource against the Horizon simulator over real HTTP on 127.0.0.1, one test per fault.

Each test checks the records the source yields against ``sim.records(resource)`` record by record:
same paging tokens in the same order, no gap, no duplicate, and bodies byte-identical to what the
simulator streams (``compact_json`` of the record is exactly the simulator's compact rendering).
"""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import structlog
import trio
import trio.lowlevel
from httpx_sse import aconnect_sse

from actors.source import Record, SourceFatalError
from ingestion.common.paging import toid
from ingestion.simulator import MalformedKind, Simulator, SimulatorConfig, open_simulator
from ingestion.testing.wait import wait_until
from tests.support.ports import closed_port_url
from tests.support.simulator import Follower, after, check_exact, close_ledgers, following, source_for

SMALL = SimulatorConfig(ledger_interval=None, history_ledgers=20, ops_per_ledger=10)


# --- catch-up and live -----------------------------------------------------------------------


async def test_catch_up_of_50k_operations_then_live_ledgers_record_by_record() -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=250, ops_per_ledger=200)
    async with open_simulator(config) as sim:
        history = sim.records("/operations")
        assert len(history) == 50_000
        async with following(source_for(sim.url, prefetch=2), "0") as (f, _):
            await f.wait_for(len(history), within=60)
            check_exact(f.records, history)
            assert all(len(b.records) == 200 for b in f.batches[:-1])  # a batch per full page
            live = [sim.close_ledger() for _ in range(3)]
            await f.wait_for(len(history) + 600)
        # Only the new ledgers: sim.records("/operations") again would cost the simulator seconds.
        new = [r for seq in live for r in sim.records(f"/ledgers/{seq}/operations")]
        assert len(new) == 600
        check_exact(f.records, history + new)


async def test_scoped_resources_are_followed_exactly() -> None:
    async with open_simulator(SMALL) as sim:
        account = sim.records("/payments")[0]["from"]
        for resource in ("/effects", f"/accounts/{account}/payments", "/ledgers", "/transactions"):
            expected = sim.records(resource)
            source = source_for(sim.url, resource=resource, page_limit=7)
            async with following(source, "0") as (f, _):
                await f.wait_for(len(expected))
            check_exact(f.records[: len(expected)], expected)


async def test_cursor_now_yields_only_new_records() -> None:
    async with open_simulator(SMALL) as sim:
        before = len(sim.records("/operations"))
        async with following(source_for(sim.url), "now") as (f, _):

            def twenty_new_records() -> bool:  # ledgers closed before the stream opened are not new
                if len(f.records) >= 20:
                    return True
                sim.close_ledger()
                return False

            await wait_until(twenty_new_records, 10, what="20 records from new ledgers", every=0.1)
        full = sim.records("/operations")
        start = [r["paging_token"] for r in full].index(f.records[0].paging_token)
        assert start >= before
        check_exact(f.records, full[start : start + len(f.records)])


async def test_paged_and_streamed_bodies_are_byte_identical_on_the_wire() -> None:
    async with open_simulator(SMALL) as sim:
        async with following(source_for(sim.url, page_limit=50), "0") as (f, _):
            await f.wait_for(200)
        paged = {r.paging_token: r.body for r in f.records[:150]}
        streamed: dict[str, str] = {}
        async with (
            httpx.AsyncClient(timeout=5) as client,
            aconnect_sse(
                client, "GET", sim.url + "/operations", params={"cursor": "0", "limit": "200"}
            ) as es,
        ):
            async for sse in es.aiter_sse():
                if sse.event == "message":
                    streamed[sse.id] = sse.data
                    if len(streamed) == 150:
                        break
        assert paged == streamed


async def test_every_stream_request_carries_limit_200_so_horizon_does_not_close_every_10() -> None:
    async with open_simulator(SMALL) as sim:
        start = sim.records("/operations")[-5]["paging_token"]
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url), start) as (f, _):
                await f.wait_for(4)
                await close_ledgers(sim, 6)  # 60 records: one stream, no reconnect every 10
                await f.wait_for(64)
        check_exact(f.records, after(sim, "/operations", start))
        streams = [r for r in sim.requests if r.stream]
        assert streams and all(r.query.get("limit") == "200" for r in streams)
        assert not [e for e in logs if e["event"] == "horizon-stream-reconnect"]


async def test_a_sparse_stream_closed_at_the_timeout_is_reopened_at_once_not_backed_off() -> None:
    # Horizon closes a quiet stream after 55 s (here 0.3 s): normal, reconnect at once; only a
    # stream that closes soon after opening (here within 1 s) is backed off.
    for timeout, quick_close, backs_off in ((0.3, 0.2, False), (0.0, 1.0, True)):
        async with open_simulator(attrs.evolve(SMALL, stream_timeout=timeout)) as sim:
            with structlog.testing.capture_logs() as logs:
                async with following(source_for(sim.url, stream_quick_close=quick_close), "now"):
                    await trio.sleep(1.5)
        delays = [e["delay"] for e in logs if e["event"] == "horizon-stream-reconnect"]
        assert len(delays) >= 3
        if backs_off:
            assert all(d > 0 for d in delays)
        else:
            assert delays == [0.0] * len(delays) and len(delays) >= 4


# --- faults ----------------------------------------------------------------------------------


async def test_streams_cut_after_n_events_resume_without_gap_or_duplicate() -> None:
    async with open_simulator(SMALL) as sim:
        start = sim.records("/operations")[-5]["paging_token"]
        sim.faults.close_streams_after(3, streams=6)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url), start) as (f, _):
                await f.wait_for(4)
                await close_ledgers(sim, 3)
                await f.wait_for(34)
        check_exact(f.records, after(sim, "/operations", start))
        assert sum(e["event"] == "horizon-stream-reconnect" for e in logs) >= 6


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_bursts_of_failures_are_retried_to_the_exact_same_records(status: int) -> None:
    async with open_simulator(SMALL) as sim:
        sim.faults.fail_requests(status, count=4, retry_after=0)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url, page_limit=30), "0") as (f, _):
                await f.wait_for(100)
                sim.faults.fail_requests(status, count=3, retry_after=0)
                await close_ledgers(sim, 2)
                await f.wait_for(220)
        check_exact(f.records, sim.records("/operations"))
        retries = [e for e in logs if e["event"] == "horizon-retry"]
        assert len(retries) >= 7 and all(e["status"] == status for e in retries)
        assert all(0 < e["delay"] <= 0.2 for e in retries)


@pytest.mark.parametrize("kind", list(MalformedKind))
async def test_malformed_stream_events_are_dropped_and_refetched(kind: MalformedKind) -> None:
    async with open_simulator(SMALL) as sim:
        start = sim.records("/operations")[-3]["paging_token"]
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url), start) as (f, _):
                await f.wait_for(2)
                sim.faults.send_malformed(kind)
                await close_ledgers(sim, 1)
                await f.wait_for(12)
                await close_ledgers(sim, 1)
                await f.wait_for(22)
        check_exact(f.records, after(sim, "/operations", start))
        bad = [e for e in logs if e["event"] == "horizon-malformed-record"]
        assert len(bad) == 1 and bad[0]["value"]


async def test_stalled_stream_is_reconnected_and_nothing_is_lost() -> None:
    async with open_simulator(SMALL) as sim:
        start = sim.records("/operations")[-1]["paging_token"]
        with structlog.testing.capture_logs() as logs:
            source = source_for(sim.url, stream_idle_timeout=0.3)
            async with following(source, start) as (f, _):
                await trio.sleep(0.1)
                sim.faults.stall_streams(1.0)
                await close_ledgers(sim, 2)
                await f.wait_for(20)
        check_exact(f.records, after(sim, "/operations", start))
        assert any(e.get("reason") == "idle" for e in logs)


async def test_server_going_down_and_coming_back_loses_nothing() -> None:
    async with open_simulator(SMALL) as sim:
        async with following(source_for(sim.url), "0") as (f, _):
            await f.wait_for(200)
            await sim.go_down()
            await close_ledgers(sim, 2)  # the chain goes on while the server is down
            await trio.sleep(0.5)
            await sim.come_up()
            await f.wait_for(220)
            await close_ledgers(sim, 1)
            await f.wait_for(230)
        check_exact(f.records, sim.records("/operations"))


async def test_fails_over_from_a_closed_port_to_the_simulator() -> None:
    async with open_simulator(SMALL) as sim:
        dead = await closed_port_url()
        with structlog.testing.capture_logs() as logs:
            async with following(source_for([dead, sim.url], attempts_per_url=2), "0") as (f, _):
                await f.wait_for(200)
                await close_ledgers(sim, 1)
                await f.wait_for(210)
        check_exact(f.records, sim.records("/operations"))
        switch = [e for e in logs if e["event"] == "horizon-failover"]
        assert switch[0]["from_url"] == dead and switch[0]["to_url"] == sim.url


async def test_fails_over_from_a_dead_url_and_resumes_from_the_same_cursor() -> None:
    async with open_simulator(SMALL) as sim:
        start = sim.records("/operations")[9]["paging_token"]
        dead = await closed_port_url()
        source = source_for([dead, sim.url], attempts_per_url=2, page_limit=3)
        with structlog.testing.capture_logs() as logs:
            async with following(source, start) as (f, _):
                await f.wait_for(6)
        check_exact(f.records[:6], after(sim, "/operations", start)[:6])
        failover = [e for e in logs if e["event"] == "horizon-failover"]
        assert failover[0]["from_url"] == dead and failover[0]["to_url"] == sim.url
        assert [e["attempt"] for e in logs if e["event"] == "horizon-retry"] == [1, 2]


async def test_leaving_early_closes_everything_promptly() -> None:
    async with open_simulator(SMALL) as sim:
        first = sim.records("/operations")[0]["paging_token"]
        for _ in range(3):
            with trio.fail_after(10):
                async with source_for(sim.url, page_limit=3, prefetch=2).stream("0") as batches:
                    batch = await batches.receive()
            assert batch.records[0].paging_token == first


async def test_fails_over_between_two_simulators_when_the_first_dies() -> None:
    async with open_simulator(SMALL) as one, open_simulator(SMALL) as two:
        source = source_for([one.url, two.url], attempts_per_url=2)
        with structlog.testing.capture_logs() as logs:
            async with following(source, "0") as (f, _):
                await f.wait_for(200)
                served_by_one = len(f.records)
                await one.go_down()
                for sim in (one, two):
                    await close_ledgers(sim, 2)
                await f.wait_for(220)
        # Same seed, same chain; only the hosts in the records' links differ.
        expected_one, expected_two = one.records("/operations"), two.records("/operations")
        assert [r["paging_token"] for r in expected_one] == [
            r["paging_token"] for r in expected_two
        ]
        check_exact(f.records[:served_by_one], expected_one[:served_by_one])
        check_exact(f.records[served_by_one:], expected_two[served_by_one:])
        assert any(e["event"] == "horizon-failover" and e["to_url"] == two.url for e in logs)


@pytest.mark.parametrize(
    ("resource", "cursor", "words"),
    [
        ("/operations", "12-1", ["400", "invalid_field=cursor", "cursor=12-1"]),
        ("/accounts/GNOTANACCOUNT/payments", "0", ["400", "account_id", "GNOTANACCOUNT"]),
        ("/transactions/" + "ab" * 32 + "/operations", "0", ["404", "not found", "--resource"]),
    ],
)
async def test_requests_horizon_rejects_raise_source_fatal_error(
    resource: str, cursor: str, words: list[str]
) -> None:
    async with open_simulator(SMALL) as sim:
        follower = Follower()
        with trio.fail_after(5):
            await follower.run(source_for(sim.url, resource=resource), cursor)
        assert follower.error is not None and not follower.records
        for word in words:
            assert word in str(follower.error)


async def test_streamed_live_records_are_batched_together() -> None:
    async with open_simulator(SMALL) as sim:
        last = sim.records("/operations")[-1]["paging_token"]
        async with following(source_for(sim.url, stream_batch_window=0.05), last) as (f, _):
            await trio.sleep(0.3)
            sim.close_ledger()
            await f.wait_for(10)
        assert len(f.batches) <= 2 and len(f.records) == 10


# --- history retention (#11.2) ---------------------------------------------------------------

RETAINED = attrs.evolve(SMALL, retention_ledgers=5)  # 20 ledgers closed, only the newest 5 kept


def old_cursor(sim: Simulator, ledgers_in: int = 2) -> str:
    return str(toid(sim.chain.spec.first_ledger + ledgers_in, 1, 1))


async def test_a_cursor_older_than_retained_history_stops_with_history_gap_reading_nothing() -> None:
    async with open_simulator(RETAINED) as sim:
        cursor = old_cursor(sim)
        with structlog.testing.capture_logs() as logs:
            follower = Follower()
            with trio.fail_after(5):
                await follower.run(source_for(sim.url), cursor)
        assert isinstance(follower.error, SourceFatalError) and not follower.records
        assert "history gap" in str(follower.error) and "on_history_gap" in str(follower.error)
        gap = next(e for e in logs if e["event"] == "history-gap")
        assert gap["log_level"] == "error"
        assert (gap["cursor"], gap["cursor_ledger"], gap["elder_ledger"], gap["horizon"]) == (
            cursor, sim.chain.spec.first_ledger + 2, sim.chain.first, sim.url
        )
        assert [r.path for r in sim.requests] == ["/"]  # nothing paged, nothing streamed


async def test_on_history_gap_skip_audits_the_gap_and_resumes_from_the_elder_ledger() -> None:
    audited: list[tuple[str, dict[str, str]]] = []

    async def audit(event: str, fields: dict[str, str]) -> bool:
        audited.append((event, fields))
        return True

    async with open_simulator(RETAINED) as sim:
        cursor = old_cursor(sim)
        retained = sim.records("/operations")
        source = source_for(sim.url, on_history_gap="skip", audit=audit)
        async with following(source, cursor) as (f, _):
            await f.wait_for(len(retained))
        check_exact(f.records, retained)
        assert int(retained[0]["paging_token"]) >> 32 == sim.chain.first
        assert audited == [
            (
                "history-gap",
                {
                    "cursor": cursor,
                    "cursor_ledger": str(sim.chain.spec.first_ledger + 2),
                    "elder_ledger": str(sim.chain.first),
                    "horizon": sim.url,
                },
            )
        ]


async def test_failing_over_to_a_horizon_with_shorter_history_checks_it_again() -> None:
    async with open_simulator(SMALL) as full, open_simulator(RETAINED) as short:
        cursor = old_cursor(full, 1)
        source = source_for([full.url, short.url], page_limit=10)
        got: list[Record] = []
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(SourceFatalError),
            trio.fail_after(10),
        ):
            async with source.stream(cursor) as batches:
                got.extend((await batches.receive()).records)
                await full.go_down()  # the rest must come from the Horizon with less history
                async for batch in batches:
                    got.extend(batch.records)
        assert got and int(got[-1].paging_token) >> 32 < short.chain.first
        check_exact(got, after(full, "/operations", cursor)[: len(got)])
        gaps = [e for e in logs if e["event"] == "history-gap"]
        assert [g["horizon"] for g in gaps] == [short.url]
        assert any(e["event"] == "horizon-failover" and e["to_url"] == short.url for e in logs)
        assert not [r for r in short.requests if r.path != "/"]


# --- rate limit (#11.4) ----------------------------------------------------------------------


async def test_catch_up_under_a_rate_limit_gets_no_429_and_takes_the_time_the_budget_allows() -> None:
    # 14400 an hour: one request per 0.25 s after a burst of 20. 300 ledgers in pages of 10 need
    # 30 requests: the budget allows them in (30 - 20) * 0.25 = 2.5 s.
    per_hour, burst, pages = 14_400, 19, 30
    config = attrs.evolve(SMALL, history_ledgers=300, rate_limit=per_hour, rate_burst=burst)
    async with open_simulator(config) as sim:
        expected = sim.records("/ledgers")
        source = source_for(sim.url, resource="/ledgers", page_limit=10, retry_after_cap=5.0)
        start = trio.current_time()
        async with following(source, "0") as (f, _):
            await f.wait_for(len(expected), within=30)
            took = trio.current_time() - start
        check_exact(f.records, expected)
        assert sim.statuses[429] == 0
        budget = (pages - (burst + 1)) * 3600 / per_hour
        print(f"rate-limited catch-up: {took:.2f} s, the budget allows {budget:.2f} s")
        # Paced by the budget, not by back-offs: a source that waited out even one Retry-After
        # cap (5 s) on top would exceed this; the rest is slack for a loaded machine.
        assert took <= 2 * budget


async def test_429_waits_as_long_as_retry_after_says() -> None:
    async with open_simulator(SMALL) as sim:
        sim.faults.fail_requests(429, count=1, retry_after=1)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url, retry_after_cap=5.0), "0") as (f, _):
                await f.wait_for(1)
        refused, retried = sim.requests[0], sim.requests[1]
        assert retried.at - refused.at >= 1.0
        check_exact(f.records[:1], sim.records("/operations")[:1])
        (retry,) = [e for e in logs if e["event"] == "horizon-retry"]
        assert retry["status"] == 429 and retry["delay"] == 1.0 and "Rate Limit" in retry["error"]


async def test_retry_after_is_honoured_on_503_as_on_429() -> None:
    async with open_simulator(SMALL) as sim:
        sim.faults.fail_requests(503, count=1, retry_after=1)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url, retry_after_cap=5.0), "0") as (f, _):
                await f.wait_for(10)
        retry = next(e for e in logs if e["event"] == "horizon-retry")
        assert retry["status"] == 503 and retry["delay"] >= 1.0


# --- heavy queries (#11.8) -------------------------------------------------------------------


async def test_after_504s_the_page_is_retried_with_a_smaller_limit_that_then_grows_back() -> None:
    async with open_simulator(SMALL) as sim:  # 200 operations
        sim.faults.fail_requests(504, count=2)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for(sim.url), "0") as (f, _):
                await f.wait_for(200)
        check_exact(f.records, sim.records("/operations"))
        limits = [r.query["limit"] for r in sim.requests if not r.stream]
        assert limits == ["200", "100", "50", "100", "200"]
        reduced = [e["limit"] for e in logs if e["event"] == "horizon-page-limit-reduced"]
        assert reduced == [100, 50]


# --- account-scoped 404 (#11.5) --------------------------------------------------------------


async def test_an_account_one_horizon_has_not_ingested_is_read_from_another_url() -> None:
    async with open_simulator(SMALL) as lagging, open_simulator(attrs.evolve(SMALL, seed=2)) as full:
        account = full.records("/operations")[0]["source_account"]
        resource = f"/accounts/{account}/operations"
        assert not lagging.chain.knows_account(account) and full.chain.knows_account(account)
        with structlog.testing.capture_logs() as logs:
            async with following(source_for([lagging.url, full.url], resource=resource), "0") as (f, _):
                expected = full.records(resource)
                await f.wait_for(len(expected))
        check_exact(f.records, expected)
        assert [e["status"] for e in logs if e["event"] == "horizon-retry"] == [404] * 3
        assert any(e["event"] == "horizon-failover" and e["to_url"] == full.url for e in logs)


async def test_an_account_every_url_answers_404_for_the_give_up_time_stops_the_source() -> None:
    async with open_simulator(SMALL) as one, open_simulator(attrs.evolve(SMALL, seed=3)) as two:
        account = "GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7"  # in neither chain
        assert not one.chain.knows_account(account) and not two.chain.knows_account(account)
        resource = f"/accounts/{account}/payments"
        follower = Follower()
        start = trio.current_time()
        with trio.fail_after(10):
            await follower.run(
                source_for([one.url, two.url], resource=resource, not_found_give_up=0.5), "0"
            )
        took = trio.current_time() - start
        assert isinstance(follower.error, SourceFatalError) and "404" in str(follower.error)
        assert took >= 0.5 and len([r for r in one.requests if r.path == resource]) >= 2


# --- stale Horizon (#11.3) -------------------------------------------------------------------


async def test_a_stale_horizon_is_left_for_a_fresh_one() -> None:
    async with open_simulator(SMALL) as stale, open_simulator(SMALL) as fresh:
        cursor = stale.records("/operations")[-1]["paging_token"]
        source = source_for(
            [stale.url, fresh.url], stale_check_interval=0.2, stale_after_ledgers=2
        )
        with structlog.testing.capture_logs() as logs:
            async with following(source, cursor) as (f, _):
                await wait_until(
                    lambda: stale.active_streams, 5, what="a stream open on the stale Horizon", every=0.01
                )
                stale.faults.freeze_ingestion(60)  # answers 200 with nothing new from now on
                await close_ledgers(stale, 5)
                await close_ledgers(fresh, 5)
                expected = after(fresh, "/operations", cursor)
                await f.wait_for(len(expected), within=5)
        check_exact(f.records, expected)
        notice = next(e for e in logs if e["event"] == "horizon-stale")
        assert (notice["horizon"], notice["to_url"]) == (stale.url, fresh.url)
        assert notice["history_latest_ledger"] == stale.chain.latest
        assert notice["core_latest_ledger"] == stale.core_latest == fresh.chain.latest
        assert any(r.path == "/operations" and not r.stream for r in fresh.requests)


# --- resources and parameters (#11.6) --------------------------------------------------------


async def test_join_transactions_in_the_resource_embeds_each_operations_transaction() -> None:
    async with open_simulator(SMALL) as sim:
        plain = sim.records("/payments")
        source = source_for(sim.url, resource="/payments?join=transactions", page_limit=7)
        async with following(source, "0") as (f, _):
            await f.wait_for(len(plain))  # paged
            await close_ledgers(sim, 2)
            everything = sim.records("/payments")
            await f.wait_for(len(everything))  # streamed
        transactions = {t["hash"]: t for t in sim.records("/transactions")}
        assert [r.paging_token for r in f.records] == [p["paging_token"] for p in everything]
        for record, bare in zip(f.records, everything, strict=True):
            joined = json.loads(record.body)
            assert joined["transaction"] == transactions[bare["transaction_hash"]]
            assert {k: v for k, v in joined.items() if k != "transaction"} == bare
            fields = list(joined)
            assert fields[fields.index("transaction_hash") + 1] == "transaction"
        assert all(r.query.get("join") == "transactions" for r in sim.requests if r.path == "/payments")
        assert any(r.stream for r in sim.requests if r.path == "/payments")


RICH = attrs.evolve(SMALL, ops_per_ledger=40)


@pytest.mark.parametrize("scope", ["/trades", "pool-effects", "balance-operations", "account-trades"])
async def test_trades_pool_and_balance_collections_are_followed_exactly(scope: str) -> None:
    async with open_simulator(RICH) as sim:
        ops = sim.records("/operations")
        if scope == "pool-effects":
            pool = next(o for o in ops if o["type"].startswith("liquidity_pool_"))["liquidity_pool_id"]
            resource = f"/liquidity_pools/{pool}/effects"
        elif scope == "balance-operations":
            created = next(o for o in ops if o["type"] == "create_claimable_balance")
            balance = sim.records(f"/operations/{created['id']}/effects")[0]["balance_id"]
            resource = f"/claimable_balances/{balance}/operations"
        elif scope == "account-trades":
            resource = f"/accounts/{sim.records('/trades')[0]['counter_account']}/trades"
        else:
            resource = scope
        expected = sim.records(resource)
        assert expected
        async with following(source_for(sim.url, resource=resource, page_limit=5), "0") as (f, _):
            await f.wait_for(len(expected))
            await close_ledgers(sim, 3)  # what the stream brings, if anything, must be exact too
            await trio.sleep(0.2)
        check_exact(f.records, sim.records(resource)[: len(f.records)])
        assert len(f.records) >= len(expected)
