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
from collections import Counter
from typing import Any

import redis
import trio

from actors.lease_store import job_keys
from benchmarks.failover import _first_commit_after, _wait_leader_committing
from benchmarks.procs import percentile
from ingestion.testing.cluster import LogLine
from ingestion.testing.processes import NodeProcess, Simulator
from ingestion.verify import verify_job

LEDGER_INTERVAL = 0.01
NODES = 3


def _first_leader_line(
    nodes: dict[str, NodeProcess], after: float, timeout: float, job: str | None = None
) -> LogLine:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = []
        for node in nodes.values():
            for line in reversed(node.lines):
                if line.at < after:
                    break
                if line.event == "became-leader" and (job is None or line.fields.get("job") == job):
                    found.append(line)
        if found:
            return min(found, key=lambda line: line.at)
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
    events = job_keys(job)["events"]
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


# --- every node at its share ----------------------------------------------------------------------

BALANCED_RESOURCES = ("/operations", "/payments", "/effects", "/transactions", "/ledgers", "/operations")


def _balanced_holders(client: redis.Redis, names: list[str]) -> dict[str, tuple[int, str] | None]:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(job_keys(name)["lease"])
    out: dict[str, tuple[int, str] | None] = {}
    for name, value in zip(names, pipe.execute(), strict=True):
        token, _, node = value.decode().partition("|") if value else ("", "", "")
        out[name] = (int(token), node) if value else None
    return out


def _wait_settled(client: redis.Redis, names: list[str], nodes: list[str], ttl: float) -> dict[str, Any]:
    """Every job led, every node at its share (two), unchanged over a lease TTL."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        first = _balanced_holders(client, names)
        counts = Counter(h[1] for h in first.values() if h is not None)
        if None not in first.values() and counts == Counter({n: 2 for n in nodes}):
            time.sleep(ttl)
            if _balanced_holders(client, names) == first:
                return first
        time.sleep(0.05)
    raise RuntimeError(f"not settled at two jobs a node within 60 s: {_balanced_holders(client, names)}")


def _granted_ms(client: redis.Redis, job: str, since_ms: int, held: tuple[int, str]) -> float:
    """When (Redis's clock, ms) ``job`` was granted after ``since_ms`` under a token above the one
    ``held``: its audit entry's id."""
    for entry_id, fields in client.xrange(job_keys(job)["audit"], min=str(since_ms)):
        if fields[b"event"] == b"became-leader" and int(fields[b"token"]) > held[0]:
            return float(entry_id.decode().partition("-")[0])
    raise RuntimeError(f"{job}: no grant after {since_ms} in the audit")


def run_balanced(redis_url: str, *, ttl_ms: int = 2000, kills: int = 20, log: Any = print) -> dict[str, Any]:
    """Six jobs on three nodes, every node at its share: ``kills`` times, SIGKILL a node's
    worker (round robin) and measure, for each of its two jobs, the kill -> the first
    ``became-leader`` line of that job from another node; the node is restarted and the shares
    restored (two each, still for a TTL) before the next kill. Every stream is verified at the end."""
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=5, ledger_interval=0.1)
    client = redis.Redis.from_url(redis_url)
    base = f"crash-balanced-{ttl_ms}"
    names = [base] + [f"{base}-{i}" for i in range(1, len(BALANCED_RESOURCES))]
    flags = [
        f
        for name, res in zip(names[1:], BALANCED_RESOURCES[1:], strict=True)
        for f in ("--job", f"{name}={res}")
    ]
    start = {"redis_url": redis_url, "horizon": sim.url, "ttl_ms": ttl_ms, "job": base, "extra": flags}
    node_ids = [f"cb-{i}" for i in range(NODES)]
    nodes: dict[str, NodeProcess] = {}
    lead: list[float] = []  # one per job taken over
    worst: list[float] = []  # one per kill: its slower job
    release: list[float] = []
    takeover: list[float] = []  # the release -> the grant, on Redis's clock
    granted: list[float] = []  # the kill -> the grant, on Redis's clock (no log pipe in it)
    try:
        for node_id in node_ids:
            nodes[node_id] = NodeProcess.start(node_id, **start)  # type: ignore[arg-type]
        for kill in range(kills):
            placed = _wait_settled(client, names, node_ids, ttl_ms / 1000)
            victim_id = node_ids[kill % NODES]
            victim = nodes[victim_id]
            orphaned = {name for name, h in placed.items() if h is not None and h[1] == victim_id}
            worker = victim.worker_pid
            time.sleep(random.uniform(0.05, 0.05 + ttl_ms / 5000))  # anywhere in the renewal cycle
            seconds, micros = client.time()  # Redis's clock just before the kill
            killed_ms = int(seconds) * 1000 + int(micros) // 1000
            killed_at = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            taken = []
            for name in sorted(orphaned):
                line = _first_leader_line(
                    {k: v for k, v in nodes.items() if k != victim_id}, killed_at, ttl_ms / 1000 * 3 + 10,
                    job=name,
                )  # fmt: skip
                taken.append((line.at - killed_at) * 1000)
                takeover.append(float(line.fields["takeover_ms"]))
                granted.append(_granted_ms(client, name, killed_ms, placed[name]) - killed_ms)  # type: ignore[arg-type]
            lead += taken
            worst.append(max(taken))
            release.append(float(victim.event("worker-died", timeout=10).fields["release_ms"]))
            status = victim.process.wait(10)
            if status != 128 + signal.SIGKILL:
                raise RuntimeError(f"{victim_id}: the parent exited {status}, not 137")
            nodes[victim_id] = NodeProcess.start(victim_id, **start)  # type: ignore[arg-type]
        _wait_settled(client, names, node_ids, ttl_ms / 1000)
        for node in nodes.values():
            node.stop()
        verified = [
            trio.run(verify_job, redis_url, name, sim.url, res, "0")
            for name, res in zip(names, BALANCED_RESOURCES, strict=True)
        ]
    finally:
        for node in nodes.values():
            node.stop()
        sim.stop()
        client.close()
    exactly_once = all(v.ok for v in verified)
    log(
        f"  worker SIGKILL, 6 jobs on 3 nodes at their share, ttl {ttl_ms} ms, {kills} kills: "
        f"the kill -> the grant (Redis's clock) p50 {percentile(granted, 50):.0f} / p99 "
        f"{percentile(granted, 99):.0f} ms; the kill -> the became-leader line p50 "
        f"{percentile(lead, 50):.0f} / p99 {percentile(lead, 99):.0f} / max {max(lead):.0f} ms; "
        f"release p99 {percentile(release, 99):.1f} ms, takeover (Redis clock) p99 "
        f"{percentile(takeover, 99):.0f} ms; exactly once: {exactly_once}"
    )
    return {
        "ttl_ms": ttl_ms,
        "kills": kills,
        "lead": _stats(lead),
        "worst_of_kill": _stats(worst),
        "release": _stats(release),
        "takeover": _stats(takeover),
        "granted": _stats(granted),
        "samples_ms": [round(v, 1) for v in lead],
        "granted_samples_ms": sorted(granted),
        "exactly_once": exactly_once,
        "records": sum(v.count for v in verified),
    }
