"""The subscription machine (``ingestion/api/subscription.py``) driven as plain function calls: the
seam between history and live events, the outbox's bounds and the cut, with time passed in."""

from __future__ import annotations

import pytest

from ingestion.api.subscription import Cut, Limits, Phase, StreamEvent, Subscription


def eid(ledger: int, i: int = 0) -> str:
    return f"{ledger << 32:019d}-{i:010d}"


def events(*ledgers: int) -> list[StreamEvent]:
    return [StreamEvent(eid(n), {"id": eid(n)}) for n in ledgers]


def drain(sub: Subscription) -> list[tuple[list[str], str]]:
    """Send everything queued: (event ids, cursor) per notification."""
    out = []
    while (n := sub.next_notification()) is not None:
        out.append(([e["id"] for e in n.events], n.cursor))
        sub.sent()
    return out


def test_history_then_live_with_the_events_published_during_history_merged_once() -> None:
    sub = Subscription(eid(0), Limits(page=2, outbox=10))
    read = sub.next_read()
    assert read is not None and read.after == eid(0) and read.limit == 2
    assert sub.next_read() is None  # one read at a time
    sub.on_live(events(3, 4), now=0.0)  # committed while the first page is read
    sub.on_history(read, events(1, 2), exhausted=False, now=0.0)
    assert sub.next_read() is None  # the page waits for the client first
    assert drain(sub) == [([eid(1), eid(2)], eid(2))]
    read = sub.next_read()
    assert read is not None and read.after == eid(2)
    sub.on_live(events(5), now=0.0)
    # the store had 3 and 4 by then: the page has them, the pending copies are not sent again
    sub.on_history(read, events(3, 4), exhausted=False, now=0.0)
    drain(sub)
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, events(5), exhausted=True, now=0.0)
    assert sub.phase is Phase.LIVE
    assert drain(sub) == [([eid(5)], eid(5)), ([], eid(5))]  # the empty one: history is done
    sub.on_live(events(5, 6), now=1.0)  # the feed repeats 5 (read again after a reconnect)
    assert drain(sub) == [([eid(6)], eid(6))]
    assert sub.next_read() is None


def test_pending_events_the_history_did_not_reach_are_sent_at_the_seam_in_order() -> None:
    sub = Subscription(eid(0), Limits(page=10))
    read = sub.next_read()
    assert read is not None
    sub.on_live(events(2, 3), now=0.0)  # committed after the read's snapshot
    sub.on_history(read, events(1), exhausted=True, now=0.0)
    assert drain(sub) == [([eid(1)], eid(1)), ([eid(2), eid(3)], eid(3))]


def test_an_overflow_of_pending_events_makes_the_read_in_flight_unable_to_end_history() -> None:
    sub = Subscription(eid(0), Limits(page=10, pending=3))
    read = sub.next_read()
    assert read is not None
    sub.on_live(events(1, 2), now=0.0)
    sub.on_live(events(3, 4), now=0.0)  # over 3 pending: dropped, to be read again
    assert sub.pending == []
    sub.on_history(read, [], exhausted=True, now=0.0)  # its snapshot may predate 1..4
    assert sub.phase is Phase.HISTORY
    read = sub.next_read()
    assert read is not None and read.generation == 1
    sub.on_history(read, events(1, 2, 3, 4), exhausted=True, now=0.0)
    assert sub.phase is Phase.LIVE
    assert drain(sub) == [([eid(1), eid(2), eid(3), eid(4)], eid(4)), ([], eid(4))]


def test_live_events_are_split_into_notifications_of_a_page_at_most() -> None:
    sub = Subscription(eid(0), Limits(page=2, outbox=10))
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, [], exhausted=True, now=0.0)
    drain(sub)
    sub.on_live(events(1, 2, 3), now=0.0)
    assert drain(sub) == [([eid(1), eid(2)], eid(2)), ([eid(3)], eid(3))]


def test_a_client_over_the_outbox_bound_is_cut_with_a_reason_and_nothing_more_is_queued() -> None:
    sub = Subscription(eid(0), Limits(page=2, outbox=4))
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, [], exhausted=True, now=0.0)
    drain(sub)
    assert sub.next_notification() is None
    sub.on_live(events(1, 2, 3, 4), now=0.0)
    assert sub.check(0.0) is None  # at the bound, not over it
    assert sub.next_notification() is not None  # handed out, never sent: the client is stuck
    sub.on_live(events(5), now=0.1)
    cut = sub.check(0.1)
    assert (
        isinstance(cut, Cut)
        and cut.kind == "outbox"
        and "5 events waiting, over the limit of 4" in cut.reason
    )
    assert len(cut.reason.encode()) <= 123  # a WebSocket close reason's bound
    assert sub.phase is Phase.CUT and sub.queued_events == 0 and not sub.outbox
    sub.on_live(events(6), now=0.2)
    assert sub.check(0.2) == cut and not sub.outbox
    sub.sent()  # the stuck send ends after all: nothing breaks


def test_a_client_that_leaves_a_notification_unsent_longer_than_max_lag_is_cut() -> None:
    sub = Subscription(eid(0), Limits(page=10, max_lag=2.0))
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, events(1), exhausted=False, now=10.0)
    assert sub.next_notification() is not None
    assert sub.check(12.0) is None
    cut = sub.check(12.01)
    assert cut is not None and cut.kind == "lag" and "waited over 2 s" in cut.reason


def test_a_client_that_keeps_up_is_never_cut() -> None:
    sub = Subscription(eid(0), Limits(page=10, outbox=10, max_lag=1.0))
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, [], exhausted=True, now=0.0)
    assert drain(sub) == [([], eid(0))]
    for n in range(1, 200):
        sub.on_live(events(n), now=float(n))
        assert sub.check(float(n)) is None
        assert drain(sub) == [([eid(n)], eid(n))]


def test_history_answers_that_break_the_order_or_answer_no_read_are_refused() -> None:
    sub = Subscription(eid(5), Limits(page=10))
    read = sub.next_read()
    assert read is not None
    with pytest.raises(ValueError, match="not after"):
        sub.on_history(read, events(5), exhausted=False, now=0.0)
    with pytest.raises(ValueError, match="not after"):
        sub.on_history(read, events(7, 6), exhausted=False, now=0.0)
    assert sub.reading == read and sub.position == eid(5)  # left as it was
    sub.on_history(read, events(6), exhausted=False, now=0.0)
    with pytest.raises(ValueError, match="no such history read"):
        sub.on_history(read, events(7), exhausted=False, now=0.0)
    with pytest.raises(ValueError, match="no notification"):
        sub.sent()


def test_limits_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        Limits(page=10, outbox=5)
    with pytest.raises(ValueError, match="out of range"):
        Limits(max_lag=0)


def test_a_read_that_matched_nothing_moves_the_position_through_the_rows_it_judged() -> None:
    sub = Subscription(eid(0), Limits(page=10))
    read = sub.next_read()
    assert read is not None
    sub.on_history(read, [], exhausted=False, now=0.0, through=eid(40))
    read = sub.next_read()
    assert read is not None and read.after == eid(40)  # never the same rows twice
    sub.on_live(events(30, 41), now=0.0)
    sub.on_history(read, events(41), exhausted=True, now=0.0, through=eid(41))
    assert drain(sub) == [([eid(41)], eid(41)), ([], eid(41))]
