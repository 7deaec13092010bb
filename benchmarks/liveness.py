"""Liveness under combined faults (issue 23, docs/FAILOVER.md "Liveness"), with real processes.

Three measurements, each on Redis's own clock (``TIME`` at the fault, audit-stream ids for the
release and the grant), so the harness's scheduling is not in the figures:

- **cut** (scenario 1): two nodes host the same two Horizon jobs, one each; n1 reaches the
  simulator through a TCP proxy. Each trial blackholes the proxy and measures the leaderless time
  of n1's job: the cut -> n2's grant (n2 is then at its balanced share, so this is the share over
  the *able* nodes at work). Then the proxy forwards again and the balancer hands one job back to
  n1 (one each) before the next trial.
- **root_only** (scenario 3): the same, with n1 behind an HTTP proxy that answers ``/`` but 503
  ``stale_history`` for everything else (``ingestion/testing/http_fault_proxy.py``).
- **handoff**: three nodes host the same four jobs (shares 2, 1, 1); each trial SIGTERMs a node
  that leads two jobs and measures, per job, its ``released`` entry -> the next ``became-leader``
  entry (the graceful handoff with many jobs: the released leases should go at once to the
  best-placed nodes free to take them, not after a rendezvous delay). The node is restarted and
  the shares settle before the next trial.

Settings: TTL 1500 ms, ``horizon.handover_after_ms`` 3000 ms, a ledger of 10 operations every
100 ms (the leader's requests succeed continuously until the fault).
"""

from __future__ import annotations

import signal
import statistics
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import trio

from actors.lease_store import job_keys, read_states
from benchmarks.procs import percentile
from ingestion.testing.cluster import Cluster, open_cluster
from ingestion.testing.http_fault_proxy import HttpFaultProxy
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until

TTL_MS = 1500
HANDOVER_MS = 3000
ENV = {"INGESTION_HORIZON_HANDOVER_AFTER_MS": str(HANDOVER_MS)}
RESOURCES = ("/operations", "/payments", "/effects", "/transactions")


def bound_ms(ttl_ms: int = TTL_MS, handover_ms: int = HANDOVER_MS) -> float:
    """B of docs/FAILOVER.md ("Liveness"), without the graceful handoff's tens of ms."""
    ttl = float(ttl_ms)
    return handover_ms + ttl / 2 + ttl / 2 + ttl + 2 * ttl / 4 + ttl + ttl / 2 + 500


def _holder(c: Cluster, job: str) -> str | None:
    return read_states(c.client, [job])[0].leader


def _redis_ms(c: Cluster) -> int:
    seconds, micros = c.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _audit_after(c: Cluster, job: str, after_ms: int) -> list[tuple[int, dict[str, str]]]:
    """The job's audit entries from ``after_ms`` (Redis time) on: (ms of the id, fields)."""
    entries = c.client.xrange(job_keys(job)["audit"], min=f"{after_ms}-0")
    return [(int(entry_id.split("-")[0]), fields) for entry_id, fields in entries]


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "trials": len(values),
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
        "mean_ms": statistics.fmean(values),
        "values_ms": [round(v) for v in values],
    }


async def _source_trials(kind: str, trials: int, log: Any) -> list[float]:
    """Scenario 1 (``cut``) or 3 (``root_only``): fault -> the other node's grant, per trial."""
    first = f"lv-{kind}"
    jobs = [first, f"{first}-b"]
    flags = ["--job", f"{jobs[1]}=/payments"]
    out: list[float] = []
    async with open_cluster(first, ttl_ms=TTL_MS) as c, trio.open_nursery() as nursery:
        proxy: TcpProxy | HttpFaultProxy
        if kind == "cut":
            proxy = await nursery.start(TcpProxy(urlsplit(c.horizon).port or 80).serve)
            fault, heal = "blackhole", "forward"
        else:
            proxy = await nursery.start(HttpFaultProxy(c.horizon).serve)
            fault, heal = "root-only", "forward"
        await c.start_node("n1", horizon=f"http://127.0.0.1:{proxy.port}", env=ENV, extra=flags)
        await c.start_node("n2", env=ENV, extra=flags)
        for trial in range(trials):
            await wait_until(lambda: {_holder(c, j) for j in jobs} == {"n1", "n2"}, 60, what="one job each",
                             every=0.01)  # fmt: skip
            await c.wait_for_progress(30)
            await trio.sleep(TTL_MS / 1000)  # n1's stream going, its last good answer is the fault
            victim = next(j for j in jobs if _holder(c, j) == "n1")
            fault_ms = _redis_ms(c)
            proxy.set_mode(fault)
            await wait_until(lambda: _holder(c, victim) == "n2", 30, what=f"n2 leads {victim}",  # noqa: B023
                             every=0.01)  # fmt: skip
            grants = [
                ms for ms, f in _audit_after(c, victim, fault_ms)
                if f.get("event") == "became-leader" and f.get("node") == "n2"
            ]  # fmt: skip
            released = [
                ms for ms, f in _audit_after(c, victim, fault_ms)
                if f.get("event") == "released" and f.get("node") == "n1"
            ]  # fmt: skip
            out.append(float(grants[0] - fault_ms))
            handoff = f", handoff {grants[0] - released[0]} ms" if released else ""
            log(f"  {kind} trial {trial + 1}: {victim} led by n2 {out[-1]:.0f} ms after the fault{handoff}")
            proxy.set_mode(heal)
        nursery.cancel_scope.cancel()
    return out


_NOISE = ("timestamp", "level", "node", "event")


def _handoff(entries: list[tuple[int, dict[str, str]]], job: str, victim: str) -> dict[str, Any]:
    """The victim's release of ``job`` -> the next grant, from the job's audit entries."""
    release = next(ms for ms, f in entries if f.get("event") == "released" and f.get("node") == victim)
    grant, to = next(
        (ms, f["node"]) for ms, f in entries if f.get("event") == "became-leader" and ms >= release
    )
    return {"job": job, "handoff_ms": float(grant - release), "to": to}


async def _handoff_trials(trials: int, log: Any, verbose: bool = False) -> list[dict[str, Any]]:
    """Three nodes, four jobs: SIGTERM a node leading two; per job, release -> grant."""
    first = "lv-many"
    jobs = [first] + [f"{first}-{i}" for i in range(1, len(RESOURCES))]
    flags = [f for i, job in enumerate(jobs[1:], 1) for f in ("--job", f"{job}={RESOURCES[i]}")]
    nodes = ["n1", "n2", "n3"]
    out: list[dict[str, Any]] = []

    def balanced() -> bool:
        holders = [_holder(c, j) for j in jobs]
        return None not in holders and all(holders.count(n) <= 2 for n in nodes)

    async with open_cluster(first, ttl_ms=TTL_MS) as c:
        for name in nodes:
            await c.start_node(name, env=ENV, extra=flags)
        for trial in range(trials):
            await wait_until(balanced, 60, what="every job led, none above its share", every=0.01)
            await trio.sleep(2 * TTL_MS / 1000)  # the views and health reports settle
            if not balanced():
                continue
            holders = {j: _holder(c, j) for j in jobs}
            victim = next(n for n in nodes if list(holders.values()).count(n) == 2)
            led = [j for j, n in holders.items() if n == victim]
            asked_ms = _redis_ms(c)
            asked = c.signal(victim, signal.SIGTERM)
            await c.exited(victim, within=15)
            await wait_until(lambda: all(_holder(c, j) not in (None, victim) for j in led), 30,  # noqa: B023
                             what=f"{led} led again", every=0.01)  # fmt: skip
            for job in led:
                sample = _handoff(_audit_after(c, job, asked_ms), job, victim)
                out.append(sample)
                if sample["handoff_ms"] >= 40 and verbose:
                    log(f"    {job}: {sample['handoff_ms']:.0f} ms; the others' log since the SIGTERM:")
                    for line in c.log.lines:
                        if line.at >= asked and line.node not in (victim, "simulator"):
                            fields = {k: v for k, v in line.fields.items() if k not in _NOISE}
                            log(f"      {line.at - asked:7.3f} {line.node} {line.event} {fields}")
            moved = ", ".join(f"{o['job']} -> {o['to']} {o['handoff_ms']:.0f} ms" for o in out[-len(led) :])
            log(f"  handoff trial {trial + 1}: SIGTERM {victim}: {moved}")
            await c.start_node(victim, env=ENV, extra=flags)
    return out


async def _measure(trials: int, handoffs: int, log: Any) -> dict[str, Any]:
    results: dict[str, Any] = {"ttl_ms": TTL_MS, "handover_after_ms": HANDOVER_MS, "bound_ms": bound_ms()}
    for kind in ("cut", "root_only"):
        results[kind] = _summary(await _source_trials(kind, trials, log))
        r = results[kind]
        log(f"  {kind}: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms "
            f"({r['trials']} trials; B {results['bound_ms']:.0f} ms)")  # fmt: skip
    samples = await _handoff_trials(handoffs, log)
    results["handoff"] = {
        **_summary([s["handoff_ms"] for s in samples]),
        "over_rank_step": sum(1 for s in samples if s["handoff_ms"] >= 40),
    }
    h = results["handoff"]
    log(
        f"  handoff, 4 jobs 3 nodes: p50 {h['p50_ms']:.0f} ms, p99 {h['p99_ms']:.0f} ms, "
        f"max {h['max_ms']:.0f} ms ({h['trials']} jobs; {h['over_rank_step']} of them >= 40 ms)"
    )
    return results


def run(*, trials: int = 20, handoffs: int = 10, log: Any = print) -> dict[str, Any]:
    return trio.run(_measure, trials, handoffs, log)


if __name__ == "__main__":  # a quick look at one part: python -m benchmarks.liveness [handoff]
    import sys

    if sys.argv[1:2] == ["handoff"]:
        print(trio.run(_handoff_trials, int(sys.argv[2]) if len(sys.argv) > 2 else 5, print, True))
    else:
        print(run(trials=3, handoffs=3))
