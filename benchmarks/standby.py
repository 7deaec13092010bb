"""Standby cost: Redis commands per second and CPU per idle standby node, and its memory.

The harness itself plays the leader (it sets the lease key and renews it with PEXPIRE every
``ttl / 5``), so every other command Redis counts in ``INFO commandstats`` during the window comes
from the standbys. CPU is each standby's own utime + stime from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from benchmarks.procs import NodeProcess, cpu_seconds, memory_kib

HARNESS_COMMANDS = ("pexpire", "info", "set")


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def run(
    redis_url: str, *, standbys: int, seconds: float, ttl_ms: int = 5000, log: Any = print
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    job = "standby"
    lease = f"ingestion:{{{job}}}:lease"
    client.set(f"ingestion:{{{job}}}:token", 1)
    client.set(lease, "1|harness-leader", px=ttl_ms)
    nodes: list[NodeProcess] = []
    try:
        for i in range(standbys):
            node = NodeProcess.start(
                f"standby-{i}", redis_url=redis_url, horizon="http://127.0.0.1:9",
                ttl_ms=ttl_ms, job=job, start_cursor="now",
            )  # fmt: skip
            nodes.append(node)
        for node in nodes:
            node.event("standby", timeout=30)
        time.sleep(1.0)  # past start-up
        before = _calls(client)
        cpu_before = [cpu_seconds(n.pid) for n in nodes]
        started = time.monotonic()
        k = 1
        while (now := time.monotonic()) < started + seconds:
            client.pexpire(lease, ttl_ms)
            time.sleep(max(0.0, min(started + k * ttl_ms / 5000, started + seconds) - now))
            k += 1
        elapsed = time.monotonic() - started
        cpu_after = [cpu_seconds(n.pid) for n in nodes]
        after = _calls(client)
        rss = [memory_kib(n.pid)["VmRSS"] for n in nodes]
        assert all(n.process.poll() is None for n in nodes)
        assert client.get(lease) == b"1|harness-leader", "a standby took the lease"
    finally:
        for node in nodes:
            node.stop()
        client.delete(lease, f"ingestion:{{{job}}}:token", f"ingestion:{{{job}}}:leader")
        client.close()
    by_command = {
        name: after[name] - before.get(name, 0)
        for name in after
        if name not in HARNESS_COMMANDS and after[name] != before.get(name, 0)
    }
    total = sum(by_command.values())
    cpu = [(a - b) / elapsed for a, b in zip(cpu_after, cpu_before, strict=True)]
    out = {
        "standbys": standbys,
        "ttl_ms": ttl_ms,
        "seconds": elapsed,
        "commands_per_s_per_standby": total / elapsed / standbys,
        "by_command": by_command,
        "cpu_percent_per_standby": 100 * sum(cpu) / standbys,
        "rss_kib_per_standby": sum(rss) / standbys,
    }
    log(
        f"  {standbys} standbys, ttl {ttl_ms} ms: "
        f"{out['commands_per_s_per_standby']:.2f} commands/s each {by_command}, "
        f"CPU {out['cpu_percent_per_standby']:.2f}% of a core each, "
        f"RSS {out['rss_kib_per_standby'] / 1024:.0f} MiB each"
    )
    return out
