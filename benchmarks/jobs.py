"""Many jobs on few nodes (the balancer): 3 node processes hosting the same 30 Horizon jobs.

Measured, in one run:

- cold start: all three nodes started at once -> every job led and no node above its share;
- stable membership: leadership changes during ``stable_s`` seconds (goal 0), and the Redis
  commands per second per node meanwhile (INFO commandstats, nothing else talking to Redis);
- SIGKILL of a node: for each of its jobs, kill -> the job led again (p50 / p99 over the trials);
  then the node is restarted and the shares restored before the next trial;
- RSS of one node as its job count grows (1, 10, 30 jobs, all led by it): its worker process's,
  which hosts the jobs (``NodeProcess.worker_pid``); the parent, which only releases a dead
  worker's leases, hosts none and is left out.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from actors.lease_store import job_keys
from benchmarks.procs import memory_kib, percentile
from ingestion.testing.processes import NodeProcess, Simulator

RESOURCES = ("/operations", "/payments", "/effects", "/transactions", "/ledgers")


def job_flags(prefix: str, count: int) -> list[str]:
    return [f for i in range(count) for f in ("--job", f"{prefix}{i:02d}={RESOURCES[i % len(RESOURCES)]}")]


def _holders(client: redis.Redis, prefix: str, count: int) -> dict[str, str | None]:
    pipe = client.pipeline(transaction=False)
    names = [f"{prefix}{i:02d}" for i in range(count)]
    for name in names:
        pipe.get(job_keys(name)["lease"])
    return {
        name: (value.decode().partition("|")[2] if value else None)
        for name, value in zip(names, pipe.execute(), strict=True)
    }


def _balanced(holders: dict[str, str | None], nodes: list[str]) -> bool:
    counts = Counter(holders.values())
    share = math.ceil(len(holders) / len(nodes))
    return None not in counts and set(counts) <= set(nodes) and max(counts.values()) <= share


def _wait_balanced(client: redis.Redis, prefix: str, count: int, nodes: list[str], limit: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if _balanced(_holders(client, prefix, count), nodes):
            return time.monotonic() - start
        time.sleep(0.02)
    raise RuntimeError(f"not balanced within {limit}s: {_holders(client, prefix, count)}")


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def _start(
    name: str, redis_url: str, horizon: str, ttl_ms: int, prefix: str, count: int, extra: Sequence[str] = ()
) -> NodeProcess:
    """A node process hosting the jobs ``prefix00``..., from the tip (``extra``: more flags)."""
    return NodeProcess.start(
        name, redis_url=redis_url, horizon=horizon, ttl_ms=ttl_ms, job=f"{prefix}00",
        start_cursor="now", extra=[*job_flags(prefix, count)[2:], *extra],
    )  # fmt: skip


def run(
    redis_url: str, *, jobs: int = 30, ttl_ms: int = 2000, stable_s: float = 60.0, trials: int = 5,
    log: Any = print,
) -> dict[str, Any]:  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    sim = Simulator.start(history_ledgers=5, ops_per_ledger=5, ledger_interval=1.0)
    names = ["b1", "b2", "b3"]
    out: dict[str, Any] = {"jobs": jobs, "nodes": len(names), "ttl_ms": ttl_ms}
    nodes: dict[str, NodeProcess] = {}
    try:
        prefix = "bal"
        started = time.monotonic()
        for name in names:
            nodes[name] = _start(name, redis_url, sim.url, ttl_ms, prefix, jobs)
        _wait_balanced(client, prefix, jobs, names, 60)
        out["cold_start_s"] = time.monotonic() - started
        log(f"  cold start: balanced after {out['cold_start_s']:.1f}s")
        time.sleep(2 * ttl_ms / 1000)  # let the last campaigns settle

        marks = {n: len(p.lines) for n, p in nodes.items()}
        before, at = _commands(client), time.monotonic()
        time.sleep(stable_s)
        per_s = (_commands(client) - before) / (time.monotonic() - at)
        changes = sum(
            1 for n, p in nodes.items() for line in p.lines[marks[n]:]
            if line.event in ("became-leader", "lost-leadership")
        )  # fmt: skip
        out["stable_s"] = stable_s
        out["stable_changes"] = changes
        out["commands_per_s_per_node"] = per_s / len(names)
        log(f"  stable {stable_s:.0f}s: {changes} leadership changes, "
            f"{per_s / len(names):.1f} Redis commands/s per node")

        samples: list[float] = []
        for trial in range(trials):
            victim = names[trial % len(names)]
            held = [j for j, h in _holders(client, prefix, jobs).items() if h == victim]
            nodes[victim].kill(9)
            killed = time.monotonic()
            pending = set(held)
            while pending and time.monotonic() - killed < 30:
                now = _holders(client, prefix, jobs)
                for job in list(pending):
                    if now[job] not in (None, victim):
                        samples.append((time.monotonic() - killed) * 1000)
                        pending.discard(job)
                time.sleep(0.01)
            if pending:
                raise RuntimeError(f"jobs {sorted(pending)} not re-led within 30s")
            nodes[victim] = _start(victim, redis_url, sim.url, ttl_ms, prefix, jobs)
            rejoin = _wait_balanced(client, prefix, jobs, names, 60)
            # the rejoined node must have its share again (not only nobody over it)
            log(f"  trial {trial + 1}: {len(held)} jobs re-led, max {max(samples[-len(held):]):.0f} ms; "
                f"rebalanced {rejoin:.1f}s after the restart")  # fmt: skip
            time.sleep(ttl_ms / 1000)
        out["relead"] = {
            "samples": len(samples),
            "p50_ms": percentile(samples, 50),
            "p99_ms": percentile(samples, 99),
            "max_ms": max(samples),
        }
    finally:
        for p in nodes.values():
            p.stop()

    rss: dict[str, int] = {}
    try:
        for count in (1, 10, 30):
            prefix = f"rss{count}-"
            node = _start("rss", redis_url, sim.url, ttl_ms, prefix, count)
            try:
                node.event("became-leader", timeout=30)
                time.sleep(4.0)
                rss[str(count)] = memory_kib(node.worker_pid)["VmRSS"]
                log(f"  one node, {count} jobs: RSS {rss[str(count)] / 1024:.0f} MiB")
            finally:
                node.stop()
    finally:
        sim.stop()
        client.close()
    out["rss_kib"] = rss
    return out
