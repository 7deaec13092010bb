"""The lease machine and its deadline arithmetic, alone: plain numbers for time."""

from __future__ import annotations

import pytest

from actors.lease import (
    Extended,
    LeaseMachine,
    LeaseProtocolError,
    LeaseTiming,
    Lost,
    LostReason,
    Role,
    standby_wait,
)

TIMING = LeaseTiming(ttl=5.0, renew_interval=1.0, margin=1.0, drift=0.01)


def test_deadlines_are_measured_from_when_the_request_was_sent_less_drift_and_margin() -> None:
    assert TIMING.lease_deadline(100.0) == pytest.approx(100.0 + 5.0 * 0.99)
    assert TIMING.ingest_deadline(100.0) == pytest.approx(100.0 + 4.95 - 1.0)


@pytest.mark.parametrize(
    ("ttl", "renew", "margin", "drift"),
    [(5.0, 4.0, 1.0, 0.01), (1.0, 0.5, 0.5, 0.0), (5.0, 1.0, 1.0, 0.6), (5.0, 0.0, 1.0, 0.0)],
)
def test_timing_that_leaves_no_room_to_renew_is_refused(
    ttl: float, renew: float, margin: float, drift: float
) -> None:
    with pytest.raises(ValueError):
        LeaseTiming(ttl=ttl, renew_interval=renew, margin=margin, drift=drift)


def test_renewal_moves_the_deadline_from_its_send_time() -> None:
    m = LeaseMachine(TIMING)
    term = m.granted(7, sent_at=10.0)
    assert m.role is Role.LEADER and term.ingest_deadline == pytest.approx(13.95)
    effect = m.renewed(7, sent_at=11.0, now=11.2)
    assert effect == Extended(7, pytest.approx(14.95))


def test_a_late_renewal_answer_never_moves_the_deadline_backwards() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    m.renewed(1, sent_at=2.0, now=2.1)
    effect = m.renewed(1, sent_at=1.0, now=2.2)  # an older request answered later
    assert isinstance(effect, Extended) and effect.ingest_deadline == pytest.approx(5.95)


def test_a_renewal_answered_after_the_ingest_deadline_does_not_revive_the_term() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    assert m.renewed(1, sent_at=3.0, now=3.95) == Lost(1, LostReason.LEASE_EXPIRED)
    assert m.role is Role.STANDBY


def test_failed_renewals_are_retried_until_the_deadline_then_redis_unavailable() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    assert m.renew_failed(1, now=1.5) is None
    assert m.renew_failed(1, now=2.5) is None
    assert m.deadline_passed(1, now=3.0) is None
    assert m.deadline_passed(1, now=3.95) == Lost(1, LostReason.REDIS_UNAVAILABLE)


def test_expiry_without_failures_is_reported_as_lease_expired() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    assert m.deadline_passed(1, now=4.0) == Lost(1, LostReason.LEASE_EXPIRED)


def test_a_successful_renewal_clears_earlier_failures() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    m.renew_failed(1, now=1.5)
    m.renewed(1, sent_at=2.0, now=2.1)
    assert m.deadline_passed(1, now=6.0) == Lost(1, LostReason.LEASE_EXPIRED)


@pytest.mark.parametrize(
    ("method", "reason"),
    [("renew_rejected", LostReason.RENEW_REJECTED), ("fenced", LostReason.FENCED),
     ("released", LostReason.RELEASED)],
)
def test_term_ending_inputs(method: str, reason: LostReason) -> None:
    m = LeaseMachine(TIMING)
    m.granted(3, sent_at=0.0)
    assert getattr(m, method)(3) == Lost(3, reason)
    assert m.role is Role.STANDBY and m.term is None


def test_inputs_about_an_older_term_are_ignored() -> None:
    m = LeaseMachine(TIMING)
    m.granted(1, sent_at=0.0)
    m.fenced(1)
    m.granted(2, sent_at=10.0)
    assert m.fenced(1) is None
    assert m.renewed(1, sent_at=11.0, now=11.1) is None
    assert m.deadline_passed(1, now=100.0) is None
    assert m.term is not None and m.term.token == 2


def test_a_second_grant_while_leading_is_a_protocol_error_and_changes_nothing() -> None:
    m = LeaseMachine(TIMING)
    term = m.granted(1, sent_at=0.0)
    with pytest.raises(LeaseProtocolError):
        m.granted(2, sent_at=1.0)
    assert m.term == term


def test_shutdown_ends_the_term_and_stops_the_machine() -> None:
    m = LeaseMachine(TIMING)
    m.granted(4, sent_at=0.0)
    assert m.shutdown() == Lost(4, LostReason.SHUTDOWN)
    assert m.role is Role.STOPPED
    with pytest.raises(LeaseProtocolError):
        m.granted(5, sent_at=1.0)


@pytest.mark.parametrize(
    ("ttl_left", "expected"), [(3000, 3.0 + 0.01), (-2, 0.01), (-1, 5.0 + 0.01), (9000, 5.01)]
)
def test_standby_waits_for_the_remaining_ttl_plus_jitter(ttl_left: int, expected: float) -> None:
    assert standby_wait(ttl_left, 5000, 0.01) == pytest.approx(expected)
