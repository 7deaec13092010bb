"""The source-aware leadership rule alone (actors.health): pure, no I/O."""

from __future__ import annotations

import pytest

from actors.health import SourceHealth, Verdict, decide


@pytest.mark.parametrize(
    ("leading", "healthy", "failing_for", "peers_healthy", "verdict"),
    [
        (True, True, 0.0, True, Verdict.KEEP),
        (True, False, 2.9, True, Verdict.KEEP),  # not failing for long enough yet
        (True, False, 3.0, True, Verdict.HAND_OVER),
        (True, False, 30.0, False, Verdict.KEEP),  # nobody can reach it: keep the lease
        (False, True, 0.0, False, Verdict.CAMPAIGN),
        (False, True, 0.0, True, Verdict.CAMPAIGN),
        (False, False, 9.0, True, Verdict.HOLD_OFF),  # another node can: leave it to that one
        (False, False, 9.0, False, Verdict.LAST_RESORT),  # nobody can: someone must lead
    ],
)
def test_the_rule(
    leading: bool, healthy: bool, failing_for: float, peers_healthy: bool, verdict: Verdict
) -> None:
    assert decide(leading=leading, healthy=healthy, failing_for=failing_for, handover_after=3.0,
                  peers_healthy=peers_healthy) is verdict  # fmt: skip


def test_failing_is_counted_from_the_last_answer_and_ends_with_the_next() -> None:
    health = SourceHealth()
    assert health.failing_for(10.0) == 0.0 and not health.healthy(10.0, within=3.0)
    health.failed(10.0)
    assert health.failing_for(12.0) == 2.0  # never answered: since the first failure
    health.ok(20.0)
    assert health.healthy(21.0, within=3.0) and not health.healthy(24.0, within=3.0)
    health.failed(23.0)
    health.failed(24.0)
    assert health.failing_for(25.0) == 5.0  # since the last answer, not the first failure
    assert not health.healthy(23.5, within=3.0)
    health.ok(26.0)
    assert health.failing_for(27.0) == 0.0
