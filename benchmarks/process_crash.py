"""Process-crash failover: SIGKILL of the leader's *worker*, its parent releasing its lease.

Per lease TTL, three nodes (each a parent and a worker: ingestion/node/parent.py) follow a simulator
that closes a small ledger every ``LEDGER_INTERVAL`` seconds. Each trial waits a random fraction
of the renew interval (the kill lands anywhere in the renewal cycle), SIGKILLs the leader's worker
and measures, on the harness's monotonic clock:

- ``lead``: the kill -> the first ``became-leader`` line another node prints;
- ``commit``: the kill -> the first events-stream entry under a newer token (``XREAD BLOCK``);

and reads the parent's ``worker-died`` line (``release_ms``: the worker's death seen -> its lease
released) and the grant's ``takeover_ms`` (Redis's clock: the release -> the grant). The killed
node's parent exits (137); the node is restarted under the same id before the next trial. At the
end the stream is checked record by record against the simulator (ingestion/verify.py).
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import redis
import trio

from benchmarks.failover import _first_commit_after, _wait_leader_committing
from benchmarks.procs import percentile
from ingestion.testing.cluster import LogLine
from ingestion.testing.processes import NodeProcess, Simulator
from ingestion.verify import verify_job

LEDGER_INTERVAL = 0.01
NODES = 3


def _first_leader_line(nodes: dict[str, NodeProcess], after: float, timeout: float) -> LogLine:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for node in nodes.values():
            for line in reversed(node.lines):
                if line.at < after:
                    break
                if line.event == "became-leader":
                    return line
        time.sleep(0.001)
    raise TimeoutError(f"no became-leader within {timeout}s")


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99), "max_ms": max(values),
    }  # fmt: skip


def run_ttl(
    client: redis.Redis, sim: Simulator, redis_url: str, ttl_ms: int, trials: int, log: Any
) -> dict[str, Any]:
    job = f"process-crash-{ttl_ms}"
    events = f"ingestion:{{{job}}}:events"
    renew = ttl_ms / 5000
    lead: list[float] = []
    commit: list[float] = []
    release: list[float] = []
    takeover: list[float] = []
    nodes: dict[str, NodeProcess] = {}
    start = {"redis_url": redis_url, "horizon": sim.url, "ttl_ms": ttl_ms, "job": job}
    try:
        for i in range(NODES):
            node_id = f"pc-{ttl_ms}-{i}"
            nodes[node_id] = NodeProcess.start(node_id, **start)  # type: ignore[arg-type]
        for _ in range(trials):
            token, leader_id = _wait_leader_committing(client, job, ttl_ms / 1000 * 3 + 10)
            victim = nodes[leader_id]
            worker = victim.worker_pid
            time.sleep(random.uniform(0.05, 0.05 + renew))
            last = client.xrevrange(events, count=1)
            last_id = last[0][0] if last else b"0-0"
            killed_at = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            led = _first_leader_line(nodes, killed_at, ttl_ms / 1000 * 3 + 10)
            seen_at, _ = _first_commit_after(client, events, last_id, token, ttl_ms / 1000 * 3 + 10)
            died = victim.event("worker-died", timeout=10)
            lead.append((led.at - killed_at) * 1000)
            commit.append((seen_at - killed_at) * 1000)
            release.append(float(died.fields["release_ms"]))
            takeover.append(float(led.fields["takeover_ms"]))
            status = victim.process.wait(10)
            if status != 128 + signal.SIGKILL:
                raise RuntimeError(f"{leader_id}: the parent exited {status}, not 137")
            nodes[leader_id] = NodeProcess.start(leader_id, **start)  # type: ignore[arg-type]
            nodes[leader_id].event("standby", timeout=30)
        for node in nodes.values():
            node.stop()
        verified = trio.run(verify_job, redis_url, job, sim.url)
    finally:
        for node in nodes.values():
            node.stop()
    log(
        f"  worker SIGKILL, ttl {ttl_ms} ms, {trials} trials: lead p50 {percentile(lead, 50):.0f} "
        f"/ p99 {percentile(lead, 99):.0f} ms, first commit p50 {percentile(commit, 50):.0f} / "
        f"p99 {percentile(commit, 99):.0f} ms; release p99 {percentile(release, 99):.1f} ms; "
        f"{verified.summary()}"
    )
    return {
        "ttl_ms": ttl_ms,
        "trials": trials,
        "lead": _stats(lead),
        "first_commit": _stats(commit),
        "release": _stats(release),
        "takeover": _stats(takeover),
        "exactly_once": verified.ok,
        "records": verified.count,
    }


def run(redis_url: str, *, ttls_ms: tuple[int, ...], trials: int, log: Any = print) -> dict[str, Any]:
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=5, ledger_interval=LEDGER_INTERVAL)
    client = redis.Redis.from_url(redis_url)
    try:
        return {str(ttl): run_ttl(client, sim, redis_url, ttl, trials, log) for ttl in ttls_ms}
    finally:
        sim.stop()
        client.close()
