"""The chaos judge fed hand-made histories: each rule fails a bad one and passes its good twin."""

from __future__ import annotations

from chaos.check import (
    AuditGrant,
    FaultWindow,
    LoggedGrant,
    Sample,
    commit_times,
    election_problems,
    fault_free,
    leaderless,
    liveness_problems,
)
from ingestion.verify import SourceRecord, StreamEntry, check_stream

JOB = "j"
EVERY = frozenset({JOB})


def ticks(start: float, end: float, every: float = 0.2) -> list[float]:
    n = int((end - start) / every)
    return [start + i * every for i in range(n + 1)]


def test_commits_are_where_the_cursor_moved() -> None:
    seen = ((0, None), (1, "5"), (2, "5"), (3, "7"), (4, None), (5, "9"))
    samples = [Sample(t, JOB, "n1", c) for t, c in seen]
    assert commit_times(samples) == [3, 5]  # the first cursor seen is no commit; a failed read is none


def test_an_instant_fault_splits_the_fault_free_time_and_an_outage_removes_its_span() -> None:
    faults = [FaultWindow("node-kill", "n1", 10, 10, EVERY), FaultWindow("horizon-5xx", "h", 20, 25, EVERY),
              FaultWindow("pg-restart", "pg", 30, 40, frozenset({"other"}))]  # fmt: skip
    assert [(s.start, s.end) for s in fault_free(faults, JOB, 0, 50)] == [(0, 10), (10, 20), (25, 50)]


def test_a_job_silent_past_b_in_fault_free_time_is_a_liveness_violation() -> None:
    kill = FaultWindow("node-kill", "n1", 10, 10, EVERY)
    commits = ticks(0, 10) + ticks(22, 60)  # nothing for 12 s after the kill
    problems = liveness_problems(JOB, commits, [kill], 0, 60, bound=9.6)
    assert len(problems) == 1 and "12.0 s" in problems[0] and "node-kill n1" in problems[0]
    assert liveness_problems(JOB, ticks(0, 10) + ticks(19, 60), [kill], 0, 60, bound=9.6) == []


def test_silence_during_an_outage_is_not_held_to_b_but_after_it_is() -> None:
    outage = FaultWindow("redis-primary-kill", "p", 10, 25, EVERY)
    assert liveness_problems(JOB, ticks(0, 10) + ticks(30, 60), [outage], 0, 60, bound=9.6) == []
    late = liveness_problems(JOB, ticks(0, 10) + ticks(36, 60), [outage], 0, 60, bound=9.6)
    assert len(late) == 1 and "t=25.0..36.0" in late[0]
    # a fault of another job's layer does not excuse this one
    other = FaultWindow("pg-restart", "pg", 10, 25, frozenset({"other"}))
    assert liveness_problems(JOB, ticks(0, 10) + ticks(30, 60), [other], 0, 60, bound=9.6)


def test_a_job_that_stops_for_good_fails_at_the_end_of_the_run() -> None:
    assert liveness_problems(JOB, ticks(0, 40), [], 0, 60, bound=9.6)


def test_leaderless_stretches_run_from_the_first_poll_without_a_lease_to_the_next_with_one() -> None:
    holders = ["n1", None, None, "n2", "n2", None, "n3"]
    stretches = leaderless(Sample(float(i), JOB, h, "1") for i, h in enumerate(holders))
    assert [(s.start, s.end) for s in stretches] == [(1, 3), (5, 6)]


def grants(*spec: tuple[int, str, str, int, int | None, int | None]) -> list[AuditGrant]:
    return [AuditGrant(at, event, node, token, prev, take) for at, event, node, token, prev, take in spec]


def test_a_consistent_audit_passes() -> None:
    audit = grants(
        (1000, "became-leader", "n1", 1, None, None), (5000, "released", "n1", 1, None, None),
        (5010, "became-leader", "n2", 2, 1, 10), (9000, "became-leader", "n3", 3, 2, 1600),
    )  # fmt: skip
    logged = [LoggedGrant(1, "n1", 1), LoggedGrant(5, "n2", 2), LoggedGrant(9, "n3", 3)]
    assert election_problems(JOB, audit, logged, 1500) == []


def test_a_grant_while_the_previous_lease_still_held_is_two_overlapping_terms() -> None:
    audit = grants((1000, "became-leader", "n1", 1, None, None), (1400, "became-leader", "n2", 2, 1, 400))
    logged = [LoggedGrant(1, "n1", 1), LoggedGrant(1.4, "n2", 2)]
    (problem,) = election_problems(JOB, audit, logged, 1500)
    assert "two terms overlapped" in problem


def test_tokens_that_fall_or_repeat_and_grants_nobody_logged_are_reported() -> None:
    audit = grants((1000, "became-leader", "n1", 5, None, None), (3000, "became-leader", "n2", 4, 5, 2000),
                   (6000, "became-leader", "n3", 4, 4, 3000))  # fmt: skip
    logged = [LoggedGrant(1, "n1", 5), LoggedGrant(3, "n2", 4)]
    problems = election_problems(JOB, audit, logged, 1500)
    assert any("tokens must rise" in p for p in problems)
    assert any("granted twice" in p for p in problems)
    assert any("never logged it" in p for p in problems)


def test_a_grant_the_node_logged_as_unconfirmed_or_released_as_orphaned_is_accounted_for() -> None:
    audit = grants(
        (1000, "became-leader", "n1", 1, None, None), (1090, "released", "n1", 1, None, None),
        (1100, "became-leader", "n1", 2, 1, 10), (1290, "released", "n1", 2, None, None),
        (1300, "became-leader", "n2", 3, 2, 10), (3000, "became-leader", "n2", 4, 3, 1600),
    )  # fmt: skip
    logged = [LoggedGrant(1.0, "n1", 1, "unconfirmed"), LoggedGrant(1.2, "n1", 2, "orphaned"),
              LoggedGrant(1.3, "n2", 3)]  # fmt: skip
    (problem,) = election_problems(JOB, audit, logged, 1500)
    assert "token 4 to n2, which never logged it" in problem
    # another node's unconfirmed line for the token does not count for the grantee
    logged.append(LoggedGrant(3.0, "n1", 4, "unconfirmed"))
    assert election_problems(JOB, audit, logged, 1500)
    logged.append(LoggedGrant(3.0, "n2", 4, "unconfirmed"))
    assert election_problems(JOB, audit, logged, 1500) == []


def test_a_grant_whose_answer_the_node_never_had_is_not_held_against_it() -> None:
    audit = grants((1000, "became-leader", "n1", 1, None, None), (4000, "became-leader", "n2", 2, 1, 1600))
    logged = [LoggedGrant(1.0, "n1", 1)]
    assert election_problems(JOB, audit, logged, 1500, unanswered=[("n2", 4150)]) == []
    (problem,) = election_problems(JOB, audit, logged, 1500, unanswered=[("n1", 4150), ("n2", 12000)])
    assert "token 2 to n2, which never logged it" in problem


def test_one_token_logged_by_two_nodes_is_a_violation_unless_redis_rolled_back() -> None:
    logged = [LoggedGrant(1, "n1", 3), LoggedGrant(2, "n2", 3)]
    assert election_problems(JOB, [], logged, 1500)
    assert election_problems(JOB, [], logged, 1500, rollbacks=True) == []


def test_a_stale_leaders_late_write_and_a_duplicate_fail_the_stream_check() -> None:
    source = [SourceRecord(str(i), {"paging_token": str(i)}) for i in range(1, 6)]
    good = [StreamEntry(f"{1000 + i}-0", str(i), 1, "n1", f'{{"paging_token": "{i}"}}') for i in range(1, 6)]
    assert check_stream(good, source).ok
    # n1's batch 3..4 landing again under its old token after n2 was granted token 2
    late = [*good[:4], StreamEntry("3000-0", "3", 1, "n1", '{"paging_token": "3"}')]
    from ingestion.verify import Grant

    result = check_stream(late, source, [Grant("900-0", "n1", 1), Grant("2000-0", "n2", 2)])
    assert not result.ok
    assert any("duplicate" in p for p in result.problems)
    assert any("stale leader" in p for p in result.problems)
