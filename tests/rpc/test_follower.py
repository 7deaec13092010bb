"""The RPC follower's decisions, alone: no server, no clock but the numbers given."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from actors.source import Watermark
from ingestion.common.retry import RetryPolicy
from ingestion.rpc.follower import Phase, RpcFollower, parse_answer, read_events
from ingestion.rpc.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PROCESSING_LIMIT,
    RANGE_MESSAGE,
    Cursor,
    EventFilter,
)

URLS = ("http://a", "http://b")
POLICY = RetryPolicy(base=0.1, cap=2.0, attempts_per_url=2, malformed_retries=2)


def follower(start: str = "0", urls: tuple[str, ...] = URLS, **kw: Any) -> RpcFollower:
    return RpcFollower(urls, (), start, POLICY, rand=lambda: 0.0, **kw)


def event(ledger: int, tx: int = 1, op: int = 0, index: int = 0) -> dict[str, Any]:
    c = Cursor(ledger, tx, op, index)
    return {"type": "contract", "ledger": ledger, "id": str(c), "topic": [], "value": "AAAAAQ=="}


def result(
    events: list[dict[str, Any]], cursor: Cursor | str, latest: int, close: int = 1000
) -> dict[str, Any]:
    return {
        "events": events,
        "cursor": str(cursor),
        "latestLedger": latest,
        "oldestLedger": 1,
        "latestLedgerCloseTime": str(close),
        "oldestLedgerCloseTime": "0",
    }


def params(f: RpcFollower) -> dict[str, Any]:
    return orjson.loads(f.next_request().body)["params"]


def test_start_zero_learns_the_oldest_ledger_from_the_range_error() -> None:
    f = follower("0")
    assert params(f)["startLedger"] == 1
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=500, latest=900), now=0)
    assert out.gap is None and out.delay == 0 and out.notes[0].event == "rpc-start-oldest"
    assert params(f)["startLedger"] == 500 and "cursor" not in params(f)["pagination"]


def test_a_short_page_commits_its_events_and_the_scanned_through_cursor() -> None:
    f = follower("500")
    out = f.on_result(result([event(501), event(503)], Cursor.through(900), 900), 1000, now=0)
    assert out.batch is not None
    assert [r.paging_token for r in out.batch.records] == [str(Cursor(501, 1)), str(Cursor(503, 1))]
    assert out.batch.through == str(Cursor.through(900)) == out.batch.cursor
    assert f.phase is Phase.CURSOR and params(f)["pagination"]["cursor"] == str(Cursor.through(900))


def test_a_full_page_ends_at_its_last_event_and_asks_again_at_once() -> None:
    f = follower("500")
    events = [event(501, index=i) for i in range(3)]
    out = f.on_result(result(events, events[-1]["id"], 900), 3, now=0)
    assert out.batch is not None and out.batch.through is None and out.delay == 0
    assert out.batch.cursor == events[-1]["id"]


def test_a_scan_capped_below_the_latest_ledger_asks_again_at_once() -> None:
    f = follower("500")
    out = f.on_result(result([], Cursor.through(10_499), 20_000), 1000, now=0)
    assert out.delay == 0 and out.batch is not None and not out.batch.records
    assert out.batch.through == str(Cursor.through(10_499))


def test_at_the_tip_it_waits_for_the_next_ledger_close_then_polls_in_short_steps() -> None:
    f = follower(str(Cursor.through(100)))
    # Ledgers close every 5 s (whole-second close times), seen as they come.
    for i, latest in enumerate(range(101, 104)):
        out = f.on_result(result([], Cursor.through(latest), latest, close=5 * latest), 1000, now=5.0 * i)
    assert f.interval() == pytest.approx(5.0)
    # The next close is due 5 s after ledger 103 was seen: ask half a second early...
    assert out.delay == pytest.approx(4.5)
    # ...then in short steps until it is there: not another whole interval.
    out = f.on_result(result([], Cursor.through(103), 103, close=515), 1000, now=14.5)
    assert out.batch is None and out.delay == pytest.approx(0.25)


def test_nothing_new_at_the_tip_gives_no_batch() -> None:
    f = follower(str(Cursor.through(100)))
    out = f.on_result(result([], Cursor.through(100), 100), 1000, now=0)
    assert out.batch is None


def test_a_cursor_below_the_oldest_ledger_is_a_history_gap() -> None:
    f = follower(str(Cursor(100, 2, 0, 1)))
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=300, latest=900), now=0)
    assert out.gap is not None and (out.gap.cursor_ledger, out.gap.elder_ledger) == (100, 300)
    f.skip_to(300)
    assert params(f)["startLedger"] == 300


def test_a_cursor_above_the_latest_ledger_tries_the_other_url_and_never_jumps() -> None:
    f = follower(str(Cursor.through(1000)), reset_after=30)
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=1, latest=990), now=0)
    assert out.gap is None and out.fatal is None and out.delay == 0  # another URL, at once
    assert [n.event for n in out.notes] == ["rpc-cursor-ahead", "rpc-failover"] and f.url == "http://b"
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=1, latest=995), now=1)
    assert out.delay > 0  # every URL is behind: back off
    # It lasts: said loudly, once per reset_after, and the position never moves.
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=1, latest=10), now=31)
    assert "rpc-network-reset-suspected" in [n.event for n in out.notes]
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=1, latest=10), now=40)
    assert "rpc-network-reset-suspected" not in [n.event for n in out.notes]
    assert f.position == Cursor.through(1000)
    assert params(f)["pagination"]["cursor"] == str(Cursor.through(1000))


def test_invalid_params_are_fatal_and_name_the_filter() -> None:
    flt = EventFilter(("contract",), (), (("AAAADwAAAAh0cmFuc2Zlcg==", "**"),))
    f = RpcFollower(URLS, (flt,), "0", POLICY)
    out = f.on_error(INVALID_PARAMS, "filter 1 invalid: topic 1 invalid: bad", now=0)
    assert out.fatal is not None and "filter 1 invalid" in out.fatal and "transfer" not in out.fatal
    assert "AAAADwAAAAh0cmFuc2Zlcg==" in out.fatal


def test_processing_limit_halves_the_page_then_restores_it() -> None:
    f = follower("500", page_limit=1000)
    out = f.on_error(PROCESSING_LIMIT, "request exceeded processing limit threshold", now=0)
    assert out.fatal is None and out.delay > 0 and f.limit == 500
    f.on_error(PROCESSING_LIMIT, "request exceeded processing limit threshold", now=1)
    assert f.limit == 250 and params(f)["pagination"]["limit"] == 250
    f.on_result(result([], Cursor.through(700), 900), 250, now=2)
    assert f.limit == 500


def test_failures_move_to_the_next_url_and_back_off_boundedly() -> None:
    f = follower("500")
    delays = []
    for i in range(6):
        out = f.on_transport_error("ConnectError", now=i)
        delays.append(out.delay)
    assert f.url_index == 3  # two attempts per URL
    assert all(0 < d <= POLICY.cap for d in delays) and delays == sorted(delays)


def test_429_waits_at_least_retry_after() -> None:
    f = follower("500")
    out = f.on_http_error(429, "Too Many Requests", 7.0, now=0)
    assert out.delay >= 7.0 and out.fatal is None


def test_4xx_from_every_url_is_fatal_but_one_bad_url_fails_over() -> None:
    f = follower("500")
    out = f.on_http_error(404, "not found", None, now=0)
    assert out.fatal is None and f.url == "http://b" and out.delay == 0
    out = f.on_http_error(404, "not found", None, now=0)
    assert out.fatal is not None and "every RPC URL" in out.fatal


@pytest.mark.parametrize(
    "bad",
    [
        lambda e: [e[1], e[0]],  # out of order
        lambda e: [{**e[0], "ledger": 7}],  # ledger field disagrees with the id
        lambda e: [{**e[0], "id": "nope"}],
    ],
)
def test_malformed_pages_are_retried_then_fatal(bad: Any) -> None:
    f = follower("500")
    events = bad([event(501), event(502)])
    for _ in range(POLICY.malformed_retries):
        out = f.on_result(result(events, Cursor.through(600), 900), 1000, now=0)
        assert out.batch is None and out.fatal is None
    out = f.on_result(result(events, Cursor.through(600), 900), 1000, now=0)
    assert out.fatal is not None


def test_an_answer_cannot_move_the_position_backwards() -> None:
    f = follower(str(Cursor.through(600)))
    out = f.on_result(result([event(550)], Cursor.through(700), 900), 1000, now=0)
    assert out.batch is None  # an event before the cursor: malformed, nothing committed
    out = f.on_result(result([], Cursor.through(500), 900), 1000, now=0)
    assert out.batch is None and f.position == Cursor.through(600)


def test_parse_answer() -> None:
    assert parse_answer(b'{"jsonrpc":"2.0","id":1,"result":{"a":1}}') == ({"a": 1}, None)
    assert parse_answer(b'{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"x"}}') == (
        None, (-32001, "x"),
    )  # fmt: skip
    with pytest.raises(ValueError):
        parse_answer(b"[1]")


def test_one_huge_gap_between_close_times_does_not_stretch_the_wait() -> None:
    """A network that halted for a while (or a simulator whose history closed long ago) gives one
    huge gap between close times; the medians keep it from stretching the wait at the tip."""
    f = follower(str(Cursor.through(100)))
    closes = [(100, 1_000, 0.0), (101, 500_000, 1.0), (102, 500_001, 2.0), (103, 500_002, 3.0)]
    for ledger, close, seen in closes:
        out = f.on_result(result([], Cursor.through(ledger), ledger, close=close), 1000, now=seen)
    assert f.interval() == pytest.approx(1.0)
    assert out.delay == pytest.approx(0.85)


def test_before_it_knows_the_interval_a_new_leader_polls_at_growing_steps() -> None:
    f = follower(str(Cursor.through(100)))
    out = f.on_result(result([], Cursor.through(100), 100, close=500), 1000, now=0.0)
    assert out.delay == pytest.approx(0.85)  # the default guess, 1 s, minus asking early
    now, delays = 0.85, []
    for _ in range(5):
        delays.append(f.on_result(result([], Cursor.through(100), 100, close=500), 1000, now=now).delay)
        now += delays[-1]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.25, 0.25])
    # A whole (guessed) interval late: once a second from then on.
    assert f.on_result(result([], Cursor.through(100), 100, close=500), 1000, now=2.1).delay == 1.0
    # One more ledger seen: the interval is known (here 5 s) and the wait follows it.
    out = f.on_result(result([], Cursor.through(101), 101, close=505), 1000, now=5.0)
    assert f.interval() == pytest.approx(5.0) and out.delay == pytest.approx(4.5)


def test_scanned_through_the_ledger_before_the_oldest_is_no_gap() -> None:
    """Through ledger 299 and the RPC keeps 300 on: nothing is missing, but it refuses a cursor
    inside ledger 299; the follower goes on from ledger 300 instead of reporting a gap."""
    f = follower(str(Cursor.through(299)))
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=300, latest=900), now=0)
    assert out.gap is None and out.fatal is None and out.delay == 0
    assert params(f)["startLedger"] == 300
    # One event short of the end of ledger 299 is a real gap: the rest of 299 is gone.
    f = follower(str(Cursor(299, 5)))
    out = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=300, latest=900), now=0)
    assert out.gap is not None and out.gap.cursor_ledger == 299


def test_a_stale_rpc_is_left_for_the_next_url_and_polling_slows_down() -> None:
    """No new ledger for longer than stale_after: with several URLs, move on (once per period);
    a whole interval late, poll once an interval (at most a second) instead of in short steps."""
    f = follower(str(Cursor.through(100)), stale_after=30.0)
    for i, ledger in enumerate((101, 102, 103)):
        f.on_result(result([], Cursor.through(ledger), ledger, close=5 * ledger), 1000, now=5.0 * i)
    stuck = result([], Cursor.through(103), 103, close=515)
    assert f.on_result(stuck, 1000, now=15.0).delay == pytest.approx(0.25)  # due: short steps
    assert f.on_result(stuck, 1000, now=20.0).delay == pytest.approx(1.0)  # an interval late: slower
    out = f.on_result(stuck, 1000, now=41.0)
    assert [n.event for n in out.notes] == ["rpc-stale"] and f.url == "http://b" and out.delay == 0
    out = f.on_result(stuck, 1000, now=50.0)
    assert not out.notes and f.url == "http://b"  # not again before another period
    single = follower(str(Cursor.through(100)), urls=("http://a",), stale_after=30.0)
    single.on_result(result([], Cursor.through(101), 101), 1000, now=0.0)
    assert not single.on_result(result([], Cursor.through(101), 101), 1000, now=100.0).notes


def test_an_answer_past_its_own_latest_ledger_is_refused() -> None:
    """A cursor (or an event) beyond the answer's ``latestLedger`` would commit a position past
    ledgers that have not closed: the answer is malformed, nothing is committed, the position
    stays, and a server that keeps saying it is given up on like any malformed one."""
    f = follower("500")
    out = f.on_result(result([], Cursor.through(905), 900), 1000, now=0)
    assert out.batch is None and out.fatal is None and out.delay > 0
    assert f.phase is Phase.LEDGER and params(f)["startLedger"] == 500
    out = f.on_result(result([event(901)], Cursor.through(901), 900), 1000, now=1)
    assert out.batch is None and f.phase is Phase.LEDGER
    # Up to the latest ledger's largest cursor is fine.
    out = f.on_result(result([event(900)], Cursor.through(900), 900), 1000, now=2)
    assert out.batch is not None and out.batch.cursor == str(Cursor.through(900))
    for _ in range(POLICY.malformed_retries + 1):
        last = f.on_result(result([], Cursor.through(901), 900), 1000, now=3)
    assert last.fatal is not None and "latest ledger" in last.fatal
    assert f.position == Cursor.through(900)


def _answer(res: dict[str, Any], indent: bool = False) -> bytes:
    doc = {"jsonrpc": "2.0", "id": 1, "result": res}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)


def test_a_page_read_without_decoding_its_events_agrees_with_the_general_path() -> None:
    """read_events + on_events (the catch-up path: each event kept as its text) gives the batch
    on_result gives for the decoded answer: same tokens, same bodies (compact), same cursor."""
    events = [event(501, index=i) for i in range(3)] + [event(502), event(510, tx=2, op=3)]
    for indent in (False, True):
        for start, res, limit in (
            ("500", result(events, Cursor.through(900), 900), 1000),
            ("500", result(events, events[-1]["id"], 900), 5),
            ("0500", result([], Cursor.through(800), 900), 1000),
        ):
            fast, slow = follower(start), follower(start)
            page = read_events(_answer(res, indent))
            assert page is not None
            got = fast.on_events(page, limit, now=0)
            want = slow.on_result(parse_answer(_answer(res, indent))[0], limit, now=0)
            assert got is not None and got.batch == want.batch and got.delay == want.delay
            assert fast.position == slow.position


def test_a_page_that_breaks_a_rule_is_left_to_the_general_path() -> None:
    events = [event(501), event(503)]
    out_of_order = result([events[1], events[0]], Cursor.through(900), 900)
    wrong_ledger = result([{**events[0], "ledger": 7}], Cursor.through(900), 900)
    past_latest = result(events, Cursor.through(901), 900)
    below_last = result(events, str(Cursor(502, 1)), 900)
    for res in (out_of_order, wrong_ledger, past_latest, below_last):
        page = read_events(_answer(res))
        assert page is not None and follower("500").on_events(page, 1000, now=0) is None
        assert follower("500").on_result(res, 1000, now=0).batch is None  # malformed
    page = read_events(_answer(result(events, Cursor.through(900), 900)))
    assert page is not None and follower("500").on_events(page, 1, now=0) is None  # over the limit
    f = follower(str(Cursor(503, 1)))
    assert f.on_events(page, 1000, now=0) is None  # not after the position
    for content in (b'{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"x"}}', b"{", b"\xff"):
        assert read_events(content) is None


def test_each_batch_says_through_which_ledger_the_job_is_complete() -> None:
    """Issue 49: a scanned-through cursor completes its ledger; a full page ending inside ledger
    L completes L - 1 (more of L may follow); with the latest ledger seen."""
    f = follower("500")
    events = [event(501, index=i) for i in range(3)]
    full = f.on_result(result(events, events[-1]["id"], 900), 3, now=0)
    assert full.batch is not None and full.batch.watermark == Watermark(500)
    assert full.batch.watermark.source_latest == 900
    quiet = f.on_result(result([], Cursor.through(901), 901), 1000, now=1)
    assert quiet.batch is not None and not quiet.batch.records and quiet.batch.watermark == Watermark(901)


def test_a_skipped_history_gap_holds_the_watermark_at_the_ledger_the_position_completes() -> None:
    f = follower("500")
    f.on_result(result([], Cursor.through(600), 600), 1000, now=0)
    gap = f.on_error(INVALID_REQUEST, RANGE_MESSAGE.format(oldest=700, latest=900), now=1).gap
    assert gap is not None
    f.skip_to(gap.elder_ledger, "history gap: ledgers before 700 are gone")
    out = f.on_result(result([event(701)], Cursor.through(900), 900), 1000, now=2)
    assert out.batch is not None
    assert out.batch.watermark == Watermark(600, "history gap: ledgers before 700 are gone")
    f.skip_to(950, "another gap")  # the first gap holds it; a later one changes nothing
    assert f.watermark() == Watermark(600, "history gap: ledgers before 700 are gone")
