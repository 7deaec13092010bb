"""The liveness rule, checked by simulation (tests/support/liveness_sim.py drives actors/liveness.py).

Random worlds: every step asserts that a job some live node hosts and can serve is led by a node
that can serve it within B. ``LIVENESS_SEEDS=5000`` runs a soak instead of the suite's 200.
The three worlds of issue 23 are scripted too, and run against the rules the code had before
(tests/support/liveness_old_rules.py) to show the simulation finds them. So is a leader whose Horizon
answers pages but blocks the stream, against the probe Horizon had before (a GET of the
collection, which such a Horizon answers: the leader kept a job it could not serve).
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest

import actors.liveness as rules
from tests.support import liveness_old_rules as old_rules
from tests.support.liveness_sim import HANDOVER, STEP, TTL, LivenessViolation, World, bound_ms, run

SEEDS = int(os.environ.get("LIVENESS_SEEDS", "200"))
CHUNK = 20


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_random_worlds_keep_every_servable_job_led_within_b_then_balanced_and_still(first: int) -> None:
    worst = 0
    for seed in range(first, min(first + CHUNK, SEEDS)):
        worst = max(worst, run(seed, rules, events=8).worst)
    assert worst <= bound_ms(rules)


def two_nodes_two_jobs(
    rule_module: ModuleType, *, probe_root: bool = False, probe_stream: bool = True
) -> World:
    world = World(0, rule_module, probe_root=probe_root, probe_stream=probe_stream)
    world.all_jobs = ("j0", "j1")
    world.lease = dict.fromkeys(world.all_jobs)
    world.health = {j: {} for j in world.all_jobs}
    world.bad_since = dict.fromkeys(world.all_jobs)
    world.join(world.all_jobs)
    world.join(world.all_jobs)
    for _ in range(3 * TTL // STEP):
        world.step()
    assert sorted(lease[0] for lease in world.lease.values() if lease) == ["n0", "n1"]  # one each
    return world


def finding_1(rule_module: ModuleType) -> World:
    """One node's source is cut off for both jobs: it hands its job back; the other node is at
    its share."""
    world = two_nodes_two_jobs(rule_module)
    for job in world.all_jobs:
        world.data_ok[("n1", job)] = world.root_ok[("n1", job)] = False
    for _ in range((HANDOVER + bound_ms(rules) + 2 * TTL) // STEP):
        world.step()
    return world


def finding_2(rule_module: ModuleType) -> World:
    """A job stops on one node only (a history gap on that node's Horizon)."""
    world = two_nodes_two_jobs(rule_module)
    job = next(j for j, lease in world.lease.items() if lease and lease[0] == "n0")
    world.stop_job("n0", job)
    for _ in range((bound_ms(rules) + 2 * TTL) // STEP):
        world.step()
    return world


def finding_3(rule_module: ModuleType) -> World:
    """The leader's server answers ``/`` but fails every request for the job."""
    world = two_nodes_two_jobs(rule_module, probe_root=True)
    job = next(j for j, lease in world.lease.items() if lease and lease[0] == "n1")
    world.data_ok[("n1", job)] = False
    for _ in range((HANDOVER + bound_ms(rules) + 2 * TTL) // STEP):
        world.step()
    return world


@pytest.mark.parametrize("finding", [finding_1, finding_2, finding_3])
def test_the_worlds_of_issue_23_are_led_within_b(finding) -> None:  # type: ignore[no-untyped-def]
    world = finding(rules)
    assert world.worst <= bound_ms(rules)
    assert all(world.lease.values())


@pytest.mark.parametrize("finding", [finding_1, finding_2, finding_3])
def test_the_simulation_finds_the_worlds_of_issue_23_under_the_old_rules(finding) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LivenessViolation) as caught:
        finding(old_rules)
    print(f"{finding.__name__}: {caught.value}")


def test_the_simulation_fails_random_worlds_under_the_old_rules() -> None:
    failed = 0
    for seed in range(20):
        try:
            run(seed, old_rules, events=8, probe_root=True)
        except AssertionError:
            failed += 1
    assert failed >= 5


def stream_blocked(*, probe_stream: bool) -> tuple[World, str]:
    """The leader's Horizon answers pages (and the probe's GET) but blocks the stream it follows
    at the tip (a proxy): it gets nothing, and records neither a success nor a failure."""
    world = two_nodes_two_jobs(rules, probe_stream=probe_stream)
    job = next(j for j, lease in world.lease.items() if lease and lease[0] == "n1")
    world.stream_ok[("n1", job)] = False
    world.log(f"stream of n1 blocked for {job} (pages answer)")
    for _ in range((HANDOVER + bound_ms(rules) + 2 * TTL) // STEP):
        world.step()
    return world, job


def test_a_leader_whose_stream_is_blocked_while_pages_answer_hands_over_and_stays_off() -> None:
    world, job = stream_blocked(probe_stream=True)
    assert world.worst <= bound_ms(rules)
    assert world.lease[job] is not None and world.lease[job][0] == "n0"
    # While the stream stays blocked, n1's probe (which opens the stream) fails: n1 is not able,
    # the balancer never hands the job back to it (no back-and-forth).
    changes = world.changes
    for _ in range(4 * HANDOVER // STEP):
        world.step()
    assert world.changes == changes and world.lease[job][0] == "n0"  # type: ignore[index]
    world.heal()  # and healed, the share is balanced again
    for _ in range(bound_ms(rules) // STEP + 40):
        world.step()
    assert world.balanced()


def test_the_simulation_finds_a_blocked_stream_kept_under_a_probe_that_only_gets_pages() -> None:
    with pytest.raises(LivenessViolation) as caught:
        stream_blocked(probe_stream=False)
    print(f"stream blocked, GET-only probe: {caught.value}")
    failed = 0
    for seed in range(20):
        try:
            run(seed, rules, events=8, probe_stream=False)
        except AssertionError:
            failed += 1
    assert failed >= 1
