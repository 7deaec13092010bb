"""Redis high availability: failover time through Sentinel, and the cost of replica acknowledgements.

One Sentinel deployment (a primary, two replicas, three sentinels, ``down-after-milliseconds``
1000) on loopback, from the tests' harness (``ingestion/testing/redis_ha.py``).

- **Failover**: two nodes ingest from the simulator; the fault is a planned failover
  (``SENTINEL FAILOVER``) or a SIGKILL of the primary (which is then restarted and rejoins as a
  replica before the next trial). The figure is the time from the fault to the first events entry
  written on the new primary, read from that entry's stream id (the primary's clock, the same host
  as the harness): detection, promotion, the clients' reconnection and a new term (or the same
  term continuing) together.
- **Commit cost**: ``LeaseStore.commit`` of 200 records of about 1 KB, one at a time, with
  ``min_replicas_acked`` 0 and 1, in alternating rounds on the same deployment.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from actors.lease_store import Acquired, Committed, LeaseStore, connect, job_keys
from benchmarks.commit_cost import _records
from benchmarks.procs import percentile
from ingestion.testing.cluster import open_cluster
from ingestion.testing.redis_ha import SentinelGroup

TTL_MS = 2000


def _first_entry_after(g: SentinelGroup, port: int, job: str, after_id: str) -> str | None:
    client = g.client(g.server(port))
    try:
        found = client.xrange(job_keys(job)["events"], min=f"({after_id}", count=1)
        return str(found[0][0]) if found else None
    finally:
        client.close()


def _last_id(g: SentinelGroup, port: int, job: str) -> str:
    client = g.client(g.server(port))
    try:
        last = client.xrevrange(job_keys(job)["events"], count=1)
        return str(last[0][0]) if last else "0-0"
    finally:
        client.close()


async def _failovers(
    g: SentinelGroup, kind: str, trials: int, acked: int, log: Any
) -> list[float]:
    job = f"bench-ha-{kind}-{acked}-{int(time.time())}"
    figures: list[float] = []
    env = {"INGESTION_REDIS_MIN_REPLICAS_ACKED": str(acked)}
    async with open_cluster(job, ttl_ms=TTL_MS, redis_url=g.url) as c:
        await c.start_node("n1", env=env)
        await c.start_node("n2", env=env)
        await c.log.wait_for("became-leader", within=30)
        await c.wait_for_events(100, within=60)
        for trial in range(trials):
            await c.wait_for_progress(100, within=60)
            old = g.primary()
            fault_ms = time.time() * 1000
            if kind == "planned":
                await trio.to_thread.run_sync(g.failover)
            else:
                await trio.to_thread.run_sync(g.kill, old)
            new = await trio.to_thread.run_sync(g.wait_for_new_primary, old.port)
            seen = await trio.to_thread.run_sync(_last_id, g, new.port, job)
            with trio.fail_after(60):
                while True:
                    first = _first_entry_after(g, new.port, job, seen)
                    if first is not None:
                        break
                    await trio.sleep(0.01)
            took = int(first.partition("-")[0]) - fault_ms
            figures.append(took)
            log(f"  {kind} (min_replicas_acked={acked}) trial {trial + 1}: first commit on the new "
                f"primary after {took:.0f} ms")  # fmt: skip
            if kind == "sigkill":
                await trio.to_thread.run_sync(g.restart, old)
                await trio.to_thread.run_sync(g.wait_is_replica, old, 60.0)
            else:
                await trio.to_thread.run_sync(g.wait_is_replica, old, 60.0)
            # One replica in sync is what the next trial needs (and what acks ask for); a second
            # one that is slow to rejoin must not end the run.
            await trio.to_thread.run_sync(g.wait_replicas_synced, 60.0, 1)
        result = await c.verify()
        if not result.ok:
            raise AssertionError(f"{kind}: the stream failed verification: {result.summary()}")
    return figures


async def _commit_rates(g: SentinelGroup, rounds: int, commits: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"0": [], "1": []}
    for r in range(rounds):
        for acked in (0, 1):
            job = f"bench-commit-acked{acked}-{r}-{int(time.time())}"
            store = LeaseStore(connect(g.url, timeout=5.0), job, min_replicas_acked=acked)
            grant = await store.acquire("bench", 600_000)
            assert isinstance(grant, Acquired)
            cursor: str | None = None
            started = time.perf_counter()
            for i in range(commits):
                res = await store.commit("bench", grant.token, cursor, _records(i * 200, 200))
                assert isinstance(res, Committed), res
                cursor = res.cursor
            rates[str(acked)].append(commits / (time.perf_counter() - started))
            store.client.delete(*store.keys.values())
            store.client.close()
    return rates


def run(*, trials: int, log: Any = print) -> dict[str, Any]:
    g = SentinelGroup().start()
    try:
        rates = trio.run(_commit_rates, g, 3, 200)
        for acked, values in rates.items():
            log(f"  commit, 200 records, min_replicas_acked={acked}: "
                f"{sorted(values)[len(values) // 2]:,.0f} commits/s (median of {len(values)})")  # fmt: skip
        runs = {
            f"{kind}{suffix}": trio.run(_failovers, g, kind, trials, acked, log)
            for acked, suffix in ((1, ""), (0, "_acked0"))
            for kind in ("planned", "sigkill")
        }
    finally:
        g.stop()
    out: dict[str, Any] = {"down_after_ms": g.down_after_ms, "ttl_ms": TTL_MS}
    for name, figures in runs.items():
        out[name] = {
            "trials": len(figures),
            "p50_ms": percentile(figures, 50),
            "p99_ms": percentile(figures, 99),
            "max_ms": max(figures),
        }
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    out["commit"] = {"acked0_per_s": med["0"], "acked1_per_s": med["1"], "ratio": med["1"] / med["0"]}
    return out
