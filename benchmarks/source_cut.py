"""Source cut -> ingestion resumed: the leader loses its route to Horizon (a TCP proxy that drops
every packet), Redis stays reachable; a standby that reaches Horizon takes over.

Two node processes (lease TTL ``ttl_ms``, ``horizon.handover_after_ms``): n1 reaches the simulator
through the proxy, n2 directly. Each trial: n1 leads and ingests; the proxy starts dropping; the
time to the first record committed by n2 is measured (from the events stream's writer field). Then
the proxy forwards again and leadership is handed back to n1 (SIGTERM n2, restart it).
"""

from __future__ import annotations

import signal
import statistics
from typing import Any
from urllib.parse import urlsplit

import trio

from benchmarks.procs import percentile
from ingestion.testing.cluster import Cluster, open_cluster
from ingestion.testing.tcp_proxy import TcpProxy


async def _first_commit_by(c: Cluster, node: str, after_entries: int, within: float) -> float:
    """Harness time at which ``node`` first appears as the writer of an entry after the first
    ``after_entries`` entries ever added."""
    key = c.keys["events"]
    with trio.fail_after(within):
        while True:
            entries = c.client.xrevrange(key, count=50)
            if any(f["node"] == node for _id, f in entries) and c.events_added() > after_entries:
                return trio.current_time()
            await trio.sleep(0.005)


async def _trials(ttl_ms: int, handover_ms: int, trials: int, log: Any) -> list[float]:
    env = {"INGESTION_HORIZON_HANDOVER_AFTER_MS": str(handover_ms)}
    resumed: list[float] = []
    async with open_cluster("bench-source-cut", ttl_ms=ttl_ms) as c, trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(urlsplit(c.horizon).port or 80).serve)
        via = f"http://127.0.0.1:{proxy.port}"
        await c.start_node("n1", horizon=via, env=env)
        await c.log.wait_for("became-leader", "n1")
        await c.start_node("n2", env=env)
        for trial in range(trials):
            await c.wait_for_progress(100)
            before = c.events_added()
            cut = trio.current_time()
            proxy.set_mode("blackhole")
            at = await _first_commit_by(c, "n2", before, within=handover_ms / 1000 + 20)
            resumed.append((at - cut) * 1000)
            log(f"  trial {trial + 1}: ingestion resumed on n2 {resumed[-1]:.0f} ms after the cut")
            proxy.set_mode("forward")
            healed = trio.current_time()
            await c.log.wait_for("source-available", "n1", since=healed, within=3 * ttl_ms / 1000 + 5)
            asked = c.signal("n2", signal.SIGTERM)
            await c.log.wait_for("became-leader", "n1", since=asked, within=10)
            await c.exited("n2")
            await c.start_node("n2", env=env)
        nursery.cancel_scope.cancel()
    return resumed


def run(*, trials: int = 12, ttl_ms: int = 1500, handover_ms: int = 3000, log: Any = print) -> dict[str, Any]:
    resumed = trio.run(_trials, ttl_ms, handover_ms, trials, log)
    return {
        "trials": trials,
        "ttl_ms": ttl_ms,
        "handover_after_ms": handover_ms,
        "p50_ms": percentile(resumed, 50),
        "p99_ms": percentile(resumed, 99),
        "max_ms": max(resumed),
        "mean_ms": statistics.fmean(resumed),
    }
