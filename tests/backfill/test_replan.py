"""A backfill's plan written again: the same span keeps its ranges whatever the node count (each
range is a job with rows of its own: another split would commit its ledgers twice), and the plan
is written in one step, so that two commands cannot both think theirs is the plan."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis

from actors.lease_store import NODE_REGISTRY_KEY, connect, job_keys
from ingestion.backfill.plan import Plan
from ingestion.backfill.status import listed_jobs, read_plan, settle, write_plan
from ingestion.common.keyspace import backfill_key
from ingestion.testing.local_redis import LocalRedis
from tests.support.cli import one_line, run
from tests.support.lakes import backfill_config as config
from tests.support.lakes import long_lake


def _live(client: redis.Redis, *nodes: str) -> None:
    """``nodes`` in the registry as live now (what the command counts for its default ranges)."""
    seconds, micros = client.time()  # type: ignore[misc]
    client.zadd(NODE_REGISTRY_KEY, {n: seconds * 1000 + micros // 1000 for n in nodes})


@pytest.mark.slow  # (seven commands, each a process)
def test_a_cancelled_backfill_run_again_keeps_its_ranges_whatever_the_node_count(
    job: str, tmp_path: Path, private_redis: LocalRedis
) -> None:
    long_lake(tmp_path / "lake", 99)
    cfg = config(tmp_path / "config.toml", job, tmp_path / "lake")
    cli = ["backfill", job, "--config", str(cfg), "--redis", private_redis.url]
    redis_client = connect(private_redis.url, timeout=2.0)  # (its own Redis: the registry is the test's)
    try:
        _live(redis_client, f"{job}-a")  # one live node: 4 ranges by default
        planned = run(*cli, "--from", "84", "--to", "99", "--detach")
        assert planned.returncode == 0 and "planned: ledgers 84..99 in 4 ranges" in planned.stdout, planned
        cancelled = run(*cli, "--cancel")
        assert f"backfill of {job} (ledgers 84..99 in 4 ranges) cancelled: 0 of 4 ranges were done" in (
            cancelled.stdout
        ), cancelled.stdout
        again = run(*cli, "--cancel")
        assert "was already cancelled: nothing changed" in again.stdout, again.stdout

        _live(redis_client, f"{job}-b", f"{job}-c")  # three now: 12 by default, but the span is planned
        resumed = run(*cli, "--from", "84", "--to", "99", "--detach")
        assert resumed.returncode == 0 and "resumed: ledgers 84..99 in 4 ranges" in resumed.stdout, resumed
        plan = read_plan(redis_client, job)
        assert plan is not None and (plan.ranges, plan.state) == (4, "running")
        # another split of the same span, asked for: refused, nothing written
        redis_client.hset(backfill_key(job), "state", "cancelled")
        refused = one_line(run(*cli, "--from", "84", "--to", "99", "--ranges", "3", "--detach"))
        assert "were planned in 4 ranges (cancelled)" in refused and "give --ranges 4" in refused, refused
        assert redis_client.hget(backfill_key(job), "state") == "cancelled"
        # another span while one runs: refused as before
        redis_client.hset(backfill_key(job), "state", "running")
        busy = one_line(run(*cli, "--from", "84", "--to", "90", "--detach"))
        assert f"job {job} has a backfill running (ledgers 84..99 in 4 ranges)" in busy, busy
    finally:
        redis_client.close()


def test_two_plans_of_other_spans_written_at_once_one_wins(job: str, redis_client: redis.Redis) -> None:
    """Written read-then-write, both could read "no plan" and both be told theirs runs."""
    for round_ in range(30):
        redis_client.delete(backfill_key(job))
        outcomes: list[str] = []
        barrier = threading.Barrier(2)

        def plan(last: int, barrier: threading.Barrier, outcomes: list[str]) -> None:
            barrier.wait()
            outcomes.append(write_plan(redis_client, Plan(job, 10, last, 2, "running", "t", "u"), 0).outcome)

        threads = [threading.Thread(target=plan, args=(last, barrier, outcomes)) for last in (20, 30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == ["busy", "planned"], (round_, outcomes)


def test_only_the_ranges_of_a_running_plan_not_yet_done_are_listed_as_jobs(
    job: str, redis_client: redis.Redis
) -> None:
    """A range done, or one of a plan cancelled, done or replaced, is no node's job any more: it is
    shown under its backfill, not listed (inspect, the console) as a job without a leader."""
    plan = Plan(job, 10, 29, 2, "running", "t", "u")
    first, second = plan.names
    other = Plan(job, 40, 49, 1).names[0]  # a range of an older span
    keys = [backfill_key(job), *(job_keys(n)["token"] for n in (job, first, second, other))]
    try:
        for name in (job, first, second, other):
            redis_client.set(job_keys(name)["token"], 1)  # each elected once

        def listed() -> list[str]:
            return [n for n in listed_jobs(redis_client) if n.startswith(job)]

        assert listed() == [job]  # no plan: every range at rest
        assert write_plan(redis_client, plan, 0).outcome == "planned"
        assert listed() == [job, first, second]
        redis_client.hset(backfill_key(first), "done", "x")
        keys.append(backfill_key(first))
        assert listed() == [job, second]
        assert settle(redis_client, plan, "cancelled", "t") == (True, "cancelled")
        assert listed() == [job]
    finally:
        redis_client.delete(*keys)
