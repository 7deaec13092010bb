"""Per-record cost: how close a node's catch-up comes to the fetch itself, and what a standby costs.

Side by side in one run, so that the ratios hold on a loaded machine:

- Horizon, warm cache, no response delay: a bare paged fetch (httpx, ``limit=200``, one
  ``json.loads`` per page, nothing kept) against a node process catching up the same records
  (validated, compacted, committed through the fenced script). Rounds alternate the two; the best
  of each counts.
- Stellar RPC, no delay: a plain ``getEvents`` cursor chain (limit 10,000, warm) against a node
  catching up the same retention window. Rounds alternate the two too; the best of each counts.
- The node against the best sequential client at 100 ms per response (overlapped ranges must keep
  it >= 4.5x), and the node's peak RSS there and in the no-delay run (its worker process's, which
  runs the job; the parent hosts none).
- Idle standbys' Redis commands per second at TTL 2 s and 5 s (``benchmarks/standby.py``).

CPU accounting, every timed run (``benchmarks.procs.cpu_usage``): the CPU seconds each process used
in the timed window (``/proc/<pid>/stat``: the node's worker and parent, the simulator, the
redis-server, py-spy when profiling; the bare fetch measures its own process, the plain RPC client
is the harness's thread), as microseconds per record and as cores (CPU per wall second), the cores
all of them used together, and what bounds the run: ``one-core`` when the node (or the reference)
ran at ~1 core, its one thread's limit; ``machine`` when together they kept every core busy;
``neither`` when each waited on another (a sequential fetch: client and server take turns).

With ``profile`` set, py-spy samples each node while it catches up (``py-spy record --format raw``)
and the heaviest frames (own samples and with callees) are returned with the figures.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from actors.lease_store import job_keys
from benchmarks import catchup, rpc, standby
from benchmarks.procs import cpu_line, cpu_snapshot, cpu_usage, memory_kib, redis_pid, wait_for_entries
from ingestion.testing.processes import NodeProcess, Simulator

ROOT = Path(__file__).resolve().parent.parent
PY_SPY = ROOT / ".venv" / "bin" / "py-spy"


def _py_spy() -> str | None:
    return str(PY_SPY) if PY_SPY.exists() else shutil.which("py-spy")


def profile_top(raw: str, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The heaviest frames of a py-spy ``raw`` (collapsed stacks) profile: (frame, share of all
    samples) by own samples (``self``) and with callees (``total``)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for f in set(frames[1:] if frames[0].startswith("process ") else frames):
            total[f] += count
    if not samples:
        return {"self": [], "total": []}
    return {
        "self": [(f, n / samples) for f, n in own.most_common(top)],
        "total": [(f, n / samples) for f, n in total.most_common(top)],
    }


def _frame(text: str) -> str:
    """``fn (path/to/file.py:123)`` as ``fn (file.py)``: lines apart are the same function."""
    name, _, where = text.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(file.split('/')[-2:])})" if file else name


class _Profiler:
    """py-spy attached to a process until stopped; the collapsed stacks it wrote."""

    def __init__(self, pid: int, out: Path) -> None:
        spy = _py_spy()
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        if spy is not None:
            self.proc = subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
                 "--output", str(out), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def stop(self) -> dict[str, list[tuple[str, float]]] | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return profile_top(self.out.read_text()) if self.out.exists() else None


def _horizon_node(
    sim: Simulator, redis_url: str, count: int, job: str, limit: float, profile: Path | None
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    rpid = redis_pid(client)
    events = job_keys(job)["events"]
    client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
    node = NodeProcess.start(f"per-record-{job}", redis_url=redis_url, horizon=sim.url, ttl_ms=5000, job=job)
    spy = None
    try:
        pid = node.worker_pid  # profiled and measured: the worker runs the job
        leader = node.event("became-leader", timeout=30)
        spy = _Profiler(pid, profile) if profile is not None else None
        pids = {"node": pid, "node parent": node.pid, "simulator": sim.process.pid, "redis": rpid}
        if spy is not None and spy.proc is not None:
            pids["py-spy"] = spy.proc.pid
        cpu_before, cpu_at = cpu_snapshot(pids), time.monotonic()
        n, done = wait_for_entries(client, events, count, leader.at + limit)
        cpu = cpu_usage(cpu_before, cpu_snapshot(pids), wall=done - cpu_at, records=n, bound_by="node")
        top = spy.stop() if spy is not None else None
        return {
            "records": n, "seconds": done - leader.at, "rate": n / (done - leader.at),
            "peak_rss_kib": memory_kib(pid)["VmHWM"], "profile": top, "cpu": cpu,
        }  # fmt: skip
    finally:
        if spy is not None and spy.proc is not None and spy.proc.poll() is None:
            spy.proc.kill()
            spy.proc.wait()
        node.stop()
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
        client.close()


def horizon(
    redis_url: str, *, count: int, rounds: int, profile_dir: Path | None, log: Any = print
) -> dict[str, Any]:
    ledgers = -(-count // catchup.OPS_PER_LEDGER)
    sim = Simulator.start(
        history_ledgers=ledgers, ops_per_ledger=catchup.OPS_PER_LEDGER, cache_records=count * 4 + 10_000
    )
    limit = max(60.0, count / 1000)
    paged: list[float] = []
    paged_cpu: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    with redis.Redis.from_url(redis_url) as client:
        pids = {"simulator": sim.process.pid, "redis": redis_pid(client)}
    try:
        catchup._reference("paged", sim.url, count, limit)  # builds and caches every page
        for r in range(rounds):
            before = cpu_snapshot(pids)
            ref = catchup._reference("paged", sim.url, count, limit)
            # the simulator and Redis are idle around the fetch: their CPU over the reference
            # process's life is theirs in its timed part; the fetch's own CPU it measures itself
            after = cpu_snapshot(pids)
            before["bare fetch"], after["bare fetch"] = 0.0, ref["cpu_seconds"]
            paged_cpu.append(
                cpu_usage(
                    before, after, wall=ref["seconds"], records=int(ref["records"]), bound_by="bare fetch"
                )
            )
            paged.append(ref["records"] / ref["seconds"])
            profile = profile_dir / f"horizon-{r}.txt" if profile_dir is not None and r == 0 else None
            nodes.append(_horizon_node(sim, redis_url, count, f"per-record-{r}", limit, profile))
            log(f"  horizon round {r + 1}: node {nodes[-1]['rate']:,.0f} records/s, bare paged "
                f"{paged[-1]:,.0f} records/s ({nodes[-1]['rate'] / paged[-1]:.2f})")  # fmt: skip
            log(f"    node: {cpu_line(nodes[-1]['cpu'])}")
            log(f"    bare paged: {cpu_line(paged_cpu[-1])}")
    finally:
        sim.stop()
    best = max(nodes, key=lambda x: x["rate"])
    best_paged = max(range(len(paged)), key=paged.__getitem__)
    return {
        "count": count, "rounds": rounds, "node_rate": best["rate"], "paged_rate": max(paged),
        "ratio": best["rate"] / max(paged), "node_peak_rss_kib": max(n["peak_rss_kib"] for n in nodes),
        "profile": nodes[0]["profile"],
        # CPU in each timed window, every round (the best runs' first)
        "node_cpu": best["cpu"], "paged_cpu": paged_cpu[best_paged],
        "rounds_cpu": [{"node": n["cpu"], "paged": p} for n, p in zip(nodes, paged_cpu, strict=True)],
    }  # fmt: skip


def rpc_catch_up(
    redis_url: str, *, ledgers: int, rounds: int, profile_dir: Path | None, log: Any = print
) -> dict[str, Any]:
    hooks: dict[str, Any] = {}
    if profile_dir is not None:
        hooks["profile"] = lambda pid: _Profiler(pid, profile_dir / "rpc.txt")
    out = rpc.catch_up(redis_url, ledgers=ledgers, limits=(10_000,), log=log, rounds=rounds, **hooks)
    run_ = out["runs"][0]
    return {
        "ledgers": ledgers, "events": out["events"], "node_eps": run_["eps"],
        "plain_eps": out["bare_warm_eps"], "ratio": run_["ratio_bare_warm"],
        "node_peak_rss_kib": run_.get("peak_rss_kib"), "profile": run_.get("profile"),
        "node_cpu": run_["cpu"], "plain_cpu": out["plain_cpu"], "rounds": rounds,
        "rounds_eps": run_["rounds_eps"],
    }  # fmt: skip


def run(redis_url: str, *, quick: bool, profile_dir: Path | None = None, log: Any = print) -> dict[str, Any]:
    out: dict[str, Any] = {
        "horizon": horizon(
            redis_url, count=20_000 if quick else 100_000, rounds=1 if quick else 5,
            profile_dir=profile_dir, log=log,
        ),
        "rpc": rpc_catch_up(
            redis_url, ledgers=2_000 if quick else 20_000, rounds=1 if quick else 5,
            profile_dir=profile_dir, log=log,
        ),
    }  # fmt: skip
    if not quick:
        # Six pages are mostly a fresh process's first pages (slow on a VM that hands out memory
        # slowly: docs/BENCHMARKS.md); a backfill of millions of events runs at the steady rate.
        out["rpc_long"] = rpc_catch_up(redis_url, ledgers=60_000, rounds=3, profile_dir=None, log=log)
    curve = catchup.run_curve(redis_url, count=5_000 if quick else 20_000, delays=(100,), log=log)
    point = curve["points"][0]
    out["latency_100ms"] = {
        "count": curve["count"], "node": point["node"], "best_sequential": max(point["paged"], point["sdk"]),
        "ratio": point["ratio_best_sequential"], "node_peak_rss_kib": point["node_peak_rss_kib"],
    }  # fmt: skip
    out["standby"] = {
        str(ttl): standby.run(redis_url, standbys=3, seconds=10.0 if quick else 30.0, ttl_ms=ttl, log=log)
        for ttl in (2000, 5000)
    }
    return out
