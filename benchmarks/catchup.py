"""Catch-up throughput (and a node's memory while catching up), side by side with two references.

One simulator process serves a history of ``count`` operations, warmed first so that every measured
pass is served from its cache. Then, in each round: a bare paged fetch (the practical ceiling), the
official SDK's streaming client, and a real node process ingesting into a fresh Redis job with fenced
commits, timed from its ``became-leader`` line until the events stream holds ``count`` entries.
The node's memory is its worker process's (peak and idle RSS), which runs the job; the parent
hosts none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from actors.lease_store import job_keys
from benchmarks.procs import memory_kib, wait_for_entries
from ingestion.testing.processes import NodeProcess, Simulator

OPS_PER_LEDGER = 100
ROOT = Path(__file__).resolve().parent.parent


def _reference(kind: str, url: str, count: int, limit: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.references", kind, url, str(count), str(limit)],
        capture_output=True,
        cwd=ROOT,
        timeout=limit + 60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"reference {kind} failed: {out.stderr.decode()[-2000:]}")
    result = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return {"records": result["records"], "seconds": result["seconds"], "cpu_seconds": result["cpu_seconds"]}


def _node_run(sim_url: str, redis_url: str, count: int, job: str, limit: float) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    events = job_keys(job)["events"]
    node = NodeProcess.start(f"catchup-{job}", redis_url=redis_url, horizon=sim_url, ttl_ms=5000, job=job)
    try:
        leader = node.event("became-leader", timeout=30)
        n, done = wait_for_entries(client, events, count, leader.at + limit)
        pid = node.worker_pid  # the process that runs the job; the parent hosts none
        peak = memory_kib(pid)["VmHWM"]
        time.sleep(2.0)  # caught up: following the (idle) stream
        idle = memory_kib(pid)["VmRSS"]
        return {
            "records": n,
            "seconds": done - leader.at,
            "peak_rss_kib": peak,
            "idle_rss_kib": idle,
        }
    finally:
        node.stop()
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease")))
        client.close()


def run(redis_url: str, *, count: int, rounds: int, log: Any = print) -> dict[str, Any]:
    ledgers = -(-count // OPS_PER_LEDGER)
    sim = Simulator.start(
        history_ledgers=ledgers,
        ops_per_ledger=OPS_PER_LEDGER,
        cache_records=count * 4 + 10_000,  # ~3.4 records of all kinds per operation
    )
    limit = max(60.0, count / 1000)
    try:
        started = time.monotonic()
        _reference("paged", sim.url, count, limit)
        _reference("sse-warm", sim.url, count, limit)
        log(f"  simulator warmed in {time.monotonic() - started:.1f}s")
        runs: dict[str, list[dict[str, Any]]] = {"paged": [], "sdk": [], "node": []}
        for r in range(rounds):
            runs["paged"].append(_reference("paged", sim.url, count, limit))
            runs["sdk"].append(_reference("sdk", sim.url, count, limit))
            runs["node"].append(_node_run(sim.url, redis_url, count, f"catchup{r}", limit))
            for kind, results in runs.items():
                res = results[-1]
                log(f"  round {r + 1} {kind}: {res['records'] / res['seconds']:,.0f} records/s")
    finally:
        sim.stop()
    out: dict[str, Any] = {"count": count, "rounds": rounds}
    for kind, results in runs.items():
        best = max(results, key=lambda x: x["records"] / x["seconds"])
        out[kind] = {**best, "rate": best["records"] / best["seconds"]}
    return out


def run_curve(
    redis_url: str, *, count: int = 20_000, delays: tuple[int, ...] = (0, 10, 50, 100, 200),
    log: Any = print,
) -> dict[str, Any]:  # fmt: skip
    """Catch-up of ``count`` operations at each response delay: the node (overlapped ranges,
    horizon.parallel_requests at its default) side by side with the two sequential references."""
    ledgers = -(-count // OPS_PER_LEDGER)
    out: dict[str, Any] = {"count": count, "points": []}
    for delay in delays:
        sim = Simulator.start(
            history_ledgers=ledgers, ops_per_ledger=OPS_PER_LEDGER, cache_records=count * 4 + 10_000,
            response_delay_ms=delay,
        )  # fmt: skip
        limit = max(60.0, count / 1000 * (1 + delay / 50))
        try:
            _reference("paged", sim.url, count, limit)  # warm every page
            paged = _reference("paged", sim.url, count, limit)
            sdk = _reference("sdk", sim.url, count, limit)
            node = _node_run(sim.url, redis_url, count, f"curve{delay}", limit)
        finally:
            sim.stop()
        point = {
            "delay_ms": delay,
            "node": node["records"] / node["seconds"],
            "paged": paged["records"] / paged["seconds"],
            "sdk": sdk["records"] / sdk["seconds"],
            "node_peak_rss_kib": node["peak_rss_kib"],
        }
        point["ratio_best_sequential"] = point["node"] / max(point["paged"], point["sdk"])
        out["points"].append(point)
        ratio = point["ratio_best_sequential"]
        log(f"  delay {delay} ms: node {point['node']:,.0f}/s, paged {point['paged']:,.0f}/s, "
            f"sdk {point['sdk']:,.0f}/s: {ratio:.2f}x the best sequential")  # fmt: skip
    return out
