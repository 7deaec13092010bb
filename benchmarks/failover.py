"""Failover: from the leader's death to the new leader's first commit, with real node processes.

Per lease TTL, three nodes follow a simulator that closes a small ledger every ``LEDGER_INTERVAL``
seconds, so a leader always has something to commit. Each trial waits a random fraction of the
renew interval (so the kill lands anywhere in the renewal cycle), notes the last events-stream
entry, sends SIGKILL or SIGTERM to the leader, and watches the events stream (``XREAD BLOCK``) for
the first entry carrying a newer fencing token. The dead node is then restarted under the same id
and the next trial starts once it has logged ``standby``.

The measured time includes waiting for the next ledger (at most ``LEDGER_INTERVAL``) and one page
fetch: it is what a consumer of the events stream would see.
"""

from __future__ import annotations

import random
import signal
import time
from typing import Any

import redis

from actors.lease_store import job_keys
from benchmarks.procs import percentile
from ingestion.testing.processes import NodeProcess, Simulator

LEDGER_INTERVAL = 0.01
NODES = 3


def _leader(client: redis.Redis, job: str) -> tuple[int, str] | None:
    value = client.get(job_keys(job)["lease"])
    if value is None:
        return None
    token, _, node = value.decode().partition("|")
    return int(token), node


def _first_commit_after(
    client: redis.Redis, events: str, last_id: bytes, token: int, timeout: float
) -> tuple[float, int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        reply = client.xread({events: last_id}, count=1000, block=100)
        now = time.monotonic()
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                last_id = entry_id
                if int(fields[b"token"]) > token:
                    return now, int(fields[b"token"])
    raise TimeoutError(f"no commit with a token above {token} within {timeout}s")


def _wait_leader_committing(client: redis.Redis, job: str, timeout: float) -> tuple[int, str]:
    """The current leader, once it holds the lease and has committed under its token."""
    events = job_keys(job)["events"]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lead = _leader(client, job)
        if lead is not None:
            last = client.xrevrange(events, count=1)
            if last and int(last[0][1][b"token"]) == lead[0]:
                return lead
        time.sleep(0.01)
    raise TimeoutError("no committing leader")


def _trials(
    client: redis.Redis,
    sim_url: str,
    redis_url: str,
    ttl_ms: int,
    sig: signal.Signals,
    trials: int,
    nodes: dict[str, NodeProcess],
    job: str,
    log: Any,
    failures: list[str],
) -> list[float]:
    events = job_keys(job)["events"]
    ttl = ttl_ms / 1000
    renew = ttl / 5
    out: list[float] = []
    for _ in range(trials):
        try:
            token, leader_id = _wait_leader_committing(client, job, ttl * 3 + 10)
        except TimeoutError:
            # Report, and go on with the next trial: the others still measure something.
            log(f"  no committing leader; lease {_leader(client, job)}; last log lines:")
            for node in nodes.values():
                for line in node.lines[-5:]:
                    log(f"    {node.node_id}: {line.fields}")
            failures.append(sig.name)
            continue
        # Everyone else standing by (a restarted node logs `standby` once it has seen the lease).
        time.sleep(random.uniform(0.05, 0.05 + renew))
        last = client.xrevrange(events, count=1)
        last_id = last[0][0] if last else b"0-0"
        killed_at = nodes[leader_id].kill(sig)
        seen_at, _new_token = _first_commit_after(client, events, last_id, token, ttl * 3 + 10)
        out.append((seen_at - killed_at) * 1000)
        old = nodes[leader_id]
        try:
            old.process.wait(10)
        except Exception:
            old.process.kill()
            old.process.wait()
        restarted = NodeProcess.start(leader_id, redis_url=redis_url, horizon=sim_url, ttl_ms=ttl_ms, job=job)
        nodes[leader_id] = restarted
        try:
            restarted.event("standby", timeout=30)
        except TimeoutError as exc:
            log(f"  {exc}; its last log lines:")
            for line in restarted.lines[-8:]:
                log(f"    {line.fields}")
            failures.append(f"restart of {leader_id}")
    log(
        f"  {sig.name} ttl {ttl_ms} ms: p50 {percentile(out, 50):.0f} ms, "
        f"p99 {percentile(out, 99):.0f} ms, max {max(out):.0f} ms ({trials} trials)"
    )
    return out


def run(redis_url: str, *, ttls_ms: tuple[int, ...], trials: int, log: Any = print) -> dict[str, Any]:
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=5, ledger_interval=LEDGER_INTERVAL)
    client = redis.Redis.from_url(redis_url)
    results: dict[str, Any] = {}
    try:
        for ttl_ms in ttls_ms:
            job = f"failover{ttl_ms}"
            nodes: dict[str, NodeProcess] = {}
            try:
                for i in range(NODES):
                    node_id = f"node-{ttl_ms}-{i}"
                    nodes[node_id] = NodeProcess.start(
                        node_id, redis_url=redis_url, horizon=sim.url, ttl_ms=ttl_ms,
                        job=job, start_cursor="now",
                    )  # fmt: skip
                for sig in (signal.SIGKILL, signal.SIGTERM):
                    failures: list[str] = []
                    times = _trials(
                        client, sim.url, redis_url, ttl_ms, sig, trials, nodes, job, log, failures
                    )
                    results[f"{sig.name}-{ttl_ms}"] = {
                        "ttl_ms": ttl_ms,
                        "signal": sig.name,
                        "trials": len(times),
                        "failed_trials": len(failures),
                        "p50_ms": percentile(times, 50),
                        "p99_ms": percentile(times, 99),
                        "max_ms": max(times),
                    }
            finally:
                for node in nodes.values():
                    node.stop()
                client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease")))
    finally:
        sim.stop()
        client.close()
    return results
