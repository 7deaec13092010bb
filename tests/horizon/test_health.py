"""The pure Horizon health decisions: root resource, history gaps (no I/O)."""

from __future__ import annotations

import pytest

from ingestion.common.paging import toid
from ingestion.common.retry import RetryPolicy
from ingestion.horizon.follower import HorizonFollower, Mode, PageRequest
from ingestion.horizon.health import (
    HistoryGap,
    RatePacer,
    RootInfo,
    Staleness,
    assess_staleness,
    cursor_ledger,
    history_gap,
    parse_rate_headers,
)
from ingestion.simulator.ratelimit import RateLimiter


def test_root_info_reads_the_ledger_fields_and_rejects_a_broken_root() -> None:
    info = RootInfo.parse(
        b'{"history_elder_ledger": 5, "history_latest_ledger": 9, "core_latest_ledger": 10}'
    )
    assert info == RootInfo(5, 9, 10)
    for bad in (b"[]", b"{}", b'{"history_elder_ledger": "5"}', b"not json"):
        with pytest.raises(ValueError):
            RootInfo.parse(bad)


def test_cursor_ledger_is_the_toid_s_top_bits_and_none_for_now_0_and_ledger_0() -> None:
    assert cursor_ledger(str(toid(123, 4, 5))) == 123
    assert cursor_ledger(f"{toid(77, 1, 1)}-3") == 77  # an effect
    assert cursor_ledger("now") is None and cursor_ledger("0") is None
    assert cursor_ledger("12") is None  # ledger 0 does not exist: "from the start"


def test_a_cursor_before_the_elder_ledger_is_a_gap_and_one_inside_history_is_not() -> None:
    elder = 1000
    assert history_gap(str(toid(999, 3, 1)), elder, "/operations") == HistoryGap(
        str(toid(999, 3, 1)), 999, elder
    )
    assert history_gap(str(toid(1000, 1, 1)), elder, "/operations") is None
    assert history_gap(str(toid(5000)), elder, "/payments") is None
    # /ledgers: the cursor's own ledger was read; only the next one must still be there.
    assert history_gap(str(toid(999)), elder, "/ledgers") is None
    assert history_gap(str(toid(998)), elder, "/ledgers") is not None
    assert history_gap(str(toid(998)), elder, "/accounts/GA/effects") is not None
    # A Horizon that keeps everything, and cursors with no position in history.
    assert history_gap(str(toid(5)), 1, "/operations") is None
    assert history_gap(str(toid(5)), 0, "/operations") is None
    assert history_gap("now", elder, "/operations") is None
    assert history_gap("0", elder, "/operations") is None


def test_skipping_a_gap_resumes_before_the_elder_ledger_s_first_record() -> None:
    gap = HistoryGap(str(toid(10, 1, 1)), 10, 50)
    resume = int(gap.resume_cursor)
    assert resume < toid(50) < toid(50, 1, 1) and resume >> 32 == 49
    f = HorizonFollower(["http://h"], "/operations", gap.cursor, RetryPolicy())
    f.skip_to(gap.resume_cursor)
    assert f.mode is Mode.CATCH_UP
    assert f.next_attempt().request == PageRequest(
        "http://h", "http://h/operations", gap.resume_cursor, 200
    )
    with pytest.raises(ValueError):
        f.skip_to(gap.cursor)  # never backwards


# --- rate-limit pacing --------------------------------------------------------------------------


def test_parse_rate_headers_reads_horizons_headers_and_ignores_their_absence() -> None:
    headers = {"x-ratelimit-limit": "101", "x-ratelimit-remaining": "7", "x-ratelimit-reset": "95"}
    assert parse_rate_headers(headers) == (101, 7, 95.0)
    assert parse_rate_headers({}) is None
    assert parse_rate_headers({**headers, "x-ratelimit-remaining": "x"}) is None


def simulate_catch_up(requests: int, per_hour: int, burst: int) -> tuple[float, int]:
    """Drive the pacer against the simulator's own GCRA with a fake clock; each request takes
    ``latency`` seconds. Returns (when the last answer came, how many were limited)."""
    clock = [0.0]
    limiter = RateLimiter(per_hour, burst, lambda: clock[0])
    pacer = RatePacer()
    latency = 0.005
    limited = 0
    for _ in range(requests):
        clock[0] += pacer.reserve(clock[0])
        decision = limiter.take("me")
        limited += decision.limited
        clock[0] += latency
        headers = {k.decode(): v.decode() for k, v in decision.headers()}
        pacer.answered(clock[0], parse_rate_headers(headers))
    return clock[0], limited


@pytest.mark.parametrize(
    ("per_hour", "burst", "requests"), [(3600, 100, 400), (14_400, 19, 60), (7200, 3, 40)]
)
def test_paced_catch_up_never_hits_429_and_uses_the_budget(per_hour: int, burst: int, requests: int) -> None:
    took, limited = simulate_catch_up(requests, per_hour, burst)
    assert limited == 0
    budget = (requests - (burst + 1)) * 3600 / per_hour  # a burst, then one per interval
    assert budget <= took <= 1.3 * budget + 0.005 * requests


def test_without_rate_headers_nothing_is_paced_and_in_flight_requests_count() -> None:
    pacer = RatePacer()
    assert [pacer.reserve(0.0) for _ in range(50)] == [0.0] * 50
    pacer = RatePacer()
    pacer.reserve(0.0)
    pacer.reserve(0.0)  # still in flight when the first answer arrives
    pacer.answered(1.0, (11, 1, 10.0))  # one left; T <= 10 / 9
    assert pacer.reserve(1.0) == pytest.approx(10 / 9)  # the in-flight one took the last


# --- staleness --------------------------------------------------------------------------------


def test_a_horizon_behind_its_core_or_another_url_is_stale_and_the_freshest_is_chosen() -> None:
    a, b, c = "http://a", "http://b", "http://c"
    fresh = RootInfo(1, 100, 100)
    assert assess_staleness(a, {a: fresh, b: RootInfo(1, 99, 100)}, max_lag=3) is None
    # behind another URL (its own core stalled too)
    stale = assess_staleness(a, {a: RootInfo(1, 90, 90), b: fresh, c: RootInfo(1, 95, 95)}, 3)
    assert stale == Staleness(a, 90, 90, b, 100) and stale.switch_to == b
    # behind its own core, nothing better: stale, but nowhere to go
    alone = assess_staleness(a, {a: RootInfo(1, 90, 100), b: RootInfo(1, 90, 100)}, 3)
    assert alone is not None and alone.switch_to is None
    assert assess_staleness(a, {a: RootInfo(1, 90, 100)}, 3) == Staleness(a, 90, 100, None, None)
    # unreadable roots say nothing
    assert assess_staleness(a, {a: None, b: fresh}, 3) is None
    assert assess_staleness(a, {a: fresh, b: None}, 3) is None
