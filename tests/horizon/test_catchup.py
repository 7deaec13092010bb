"""Overlapped catch-up: the range planner alone, then HorizonSource paging ledger ranges side by
side against the simulator (with a response delay), checked record by record against the
simulator's own records, through the switch to the live stream."""

from __future__ import annotations

import signal

import pytest
import trio

from actors.source import Record
from ingestion.horizon.catchup import (
    LedgerRange,
    ledger_of,
    ledger_start_cursor,
    ledgers_per_range,
    overlappable,
    plan_ranges,
)
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.cluster import open_cluster
from tests.support.simulator import check_exact, following, source_for


def toid(ledger: int, tx: int = 0, op: int = 0) -> int:
    return ledger << 32 | tx << 12 | op


def test_ranges_cover_the_history_after_the_cursor_once_and_in_order() -> None:
    cursor = str(toid(100, 3, 2))
    plan = plan_ranges(cursor, oldest=50, latest=120, ledgers_per_range=8)
    assert plan[0] == LedgerRange(0, cursor, 108)
    assert [r.end for r in plan] == [108, 116, 121]
    assert plan[1].after == str(toid(108) - 1) and plan[2].after == str(toid(116) - 1)
    # every record of ledgers 100..120 after the cursor is in exactly one range
    for ledger in range(100, 121):
        token = str(toid(ledger, 5, 1))
        owners = [r for r in plan if r.keeps(token) and int(token) > int(r.after)]
        assert len(owners) == 1, ledger


def test_cursor_zero_starts_at_the_oldest_ledger_and_an_expired_cursor_is_not_split() -> None:
    plan = plan_ranges("0", oldest=1000, latest=1003, ledgers_per_range=2)
    assert [(r.after, r.end) for r in plan] == [
        (ledger_start_cursor(1000), 1002), (ledger_start_cursor(1002), 1004)
    ]
    # Older than Horizon's history: records are missing; that is for the sequential path to report.
    assert plan_ranges(str(toid(900)), oldest=1000, latest=2000, ledgers_per_range=2) == []
    assert plan_ranges(str(toid(2000, 1, 1)), oldest=1000, latest=2000, ledgers_per_range=2) == [
        LedgerRange(0, str(toid(2000, 1, 1)), 2001)
    ]
    assert plan_ranges(str(toid(2001)), oldest=1000, latest=2000, ledgers_per_range=2) == []


def test_effect_and_trade_tokens_and_range_sizes() -> None:
    effect = f"{toid(77, 2, 1)}-3"
    assert ledger_of(effect) == 77
    assert LedgerRange(0, "1", 78).keeps(effect) and not LedgerRange(0, "1", 77).keeps(effect)
    assert ledgers_per_range(100, 4, 200) == 8
    assert ledgers_per_range(5000, 4, 200) == 1
    assert ledgers_per_range(0, 4, 200) == 64
    assert overlappable("/operations") and overlappable("/effects?include_failed=true")
    assert not overlappable(f"/accounts/G{'A' * 55}/payments")
    with pytest.raises(ValueError):
        plan_ranges("0", 1, 2, 0)


def test_a_range_keeps_the_records_of_a_page_before_its_end() -> None:
    rng = LedgerRange(0, "1", 78)
    page = tuple(Record(t, "{}") for t in (str(toid(76, 1, 1)), f"{toid(77, 2, 1)}-3", str(toid(77, 3))))
    assert rng.kept(page) is page  # the last is kept: the whole page, one check
    crossing = (*page, Record(str(toid(78)), "{}"), Record(str(toid(79, 1)), "{}"))
    assert rng.kept(crossing) == page
    assert rng.kept(crossing) == tuple(r for r in crossing if rng.keeps(r.paging_token))
    assert LedgerRange(0, "1", 76).kept(page) == () and rng.kept(()) == ()


@pytest.mark.parametrize(
    "resource", ["/operations", "/effects", "/ledgers", "/transactions", "/payments", "/trades"]
)
async def test_ranges_paged_side_by_side_give_exactly_the_sequential_records_then_the_live_ones(
    resource: str,
) -> None:
    config = SimulatorConfig(
        ledger_interval=None, history_ledgers=60, ops_per_ledger=40, response_delay_ms=10
    )
    async with open_simulator(config) as sim:
        history = sim.records(resource)
        source = source_for(sim.url, resource=resource, parallel_requests=4, pages_per_range=2,
                            page_limit=50)  # fmt: skip
        async with following(source, "0") as (f, _):
            await f.wait_for(len(history), within=60)
            check_exact(f.records, history)
            live = [sim.close_ledger() for _ in range(2)]
            new = [r for r in sim.records(resource) if ledger_of(r["paging_token"]) in live]
            await f.wait_for(len(history) + len(new), within=15)
            await trio.sleep(0.2)
        check_exact(f.records, history + new)


@pytest.mark.slow
async def test_sigkill_and_sigterm_in_the_middle_of_an_overlapped_catch_up_lose_and_repeat_nothing(
    job: str,
) -> None:
    """30,000 operations of history at 20 ms per response, ranges paged 4 at a time: the leader is
    SIGKILLed, then its successor SIGTERMed, each in the middle of the catch-up. Ranges in flight
    are dropped; each new leader resumes from the committed cursor."""
    async with open_cluster(job, ttl_ms=1500, ledger_interval=0.5, ops_per_ledger=100,
                            history_ledgers=300, response_delay_ms=20) as c:  # fmt: skip
        for name in ("n1", "n2", "n3"):
            await c.start_node(name)
        await c.log.wait_for("horizon-catch-up-overlapped", within=30)
        await c.wait_for_events(5_000, within=60)
        first = [e.node for e in c.leaders()][-1]
        killed_at = await c.kill(first)
        second = await c.log.wait_for("became-leader", since=killed_at, within=5)
        mid = await c.events_now()
        assert mid < 30_000, "the catch-up finished before the second fault: not a mid-catch-up test"
        await c.wait_for_events(mid + 3_000, within=60)
        asked = c.signal(second.node, signal.SIGTERM)
        await c.log.wait_for("became-leader", since=asked, within=5)
        await c.wait_for_events(30_500, within=90)
        result = await c.verify()
        assert result.ok, result.summary()
        overlapped = c.log.of("horizon-catch-up-overlapped")
        assert len({e.node for e in overlapped}) >= 2  # each leader caught up through ranges
