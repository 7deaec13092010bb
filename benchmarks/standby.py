"""Standby cost: Redis commands per second and CPU per idle standby node, and its memory.

The harness itself plays the leader (it sets the lease key and renews it with PEXPIRE every
``ttl / 5``), so every other command Redis sees during the window comes from the standbys. Two
measures, per standby per second:

- **sent**: the commands a standby sends (a script call is one, ``INFO`` one, pipelined or not),
  from ``MONITOR``, the harness's own connections left out; this is what issue 27's goal counts.
  ``round_trips`` groups a connection's pipelined commands (within 2 ms) into one.
- **commandstats**: ``INFO commandstats`` deltas, which also count every command a script runs
  inside Redis (the harness's ``PEXPIRE``/``INFO``/``SET``/``MONITOR`` left out).

The standbys' Horizon is a simulator that answers (an idle standby's source probes succeed), unless
``horizon`` names another. CPU is each standby's own utime + stime from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import collections
import hashlib
import shlex
import threading
import time
from typing import Any

import redis

from actors.lease_store import job_keys, scripts
from benchmarks.procs import cpu_seconds, memory_kib
from ingestion.testing.processes import NodeProcess, Simulator

HARNESS_COMMANDS = ("pexpire", "info", "set", "monitor")


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


class _Monitor:
    """Top-level commands by name (scripts by name), from clients other than the harness's."""

    def __init__(self, url: str, scripts: dict[str, str], skip: set[str]) -> None:
        self._client = redis.Redis.from_url(url)
        self._scripts = scripts
        self._skip = skip
        self.counting = False
        self.sent: collections.Counter[str] = collections.Counter()
        self.round_trips = 0
        self._last: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        with self._client.monitor() as m:
            for line in m.listen():
                if self._stop:
                    return
                client, command = line.get("client_address", ""), line.get("command", "")
                if not self.counting or client in ("lua", "") or line.get("client_type") == "lua":
                    continue
                if f"{client}:{line.get('client_port')}" in self._skip:
                    continue
                words = shlex.split(command) if command else [""]
                name = words[0].lower()
                if name in ("evalsha", "eval") and len(words) > 1:
                    name = self._scripts.get(words[1], name)
                self.sent[name] += 1
                key = f"{client}:{line.get('client_port')}"
                t = float(line.get("time", 0))
                if t - self._last.get(key, -1.0) > 0.002:
                    self.round_trips += 1
                self._last[key] = t

    def stop(self) -> None:
        self._stop = True
        try:
            self._client.ping()
        finally:
            self._client.close()


def _script_names() -> dict[str, str]:
    out = {}
    for name in dir(scripts):
        text = getattr(scripts, name)
        if name.isupper() and isinstance(text, str) and name != "HELPERS":
            out[hashlib.sha1(text.encode()).hexdigest()] = name.lower()
    return out


def run(
    redis_url: str, *, standbys: int, seconds: float, ttl_ms: int = 5000, log: Any = print,
    horizon: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=1) if horizon is None else None
    client = redis.Redis.from_url(redis_url)
    job = "standby"
    lease = job_keys(job)["lease"]
    client.set(job_keys(job)["token"], 1)
    client.set(lease, "1|harness-leader", px=60_000)  # through start-up; ttl_ms once measuring
    nodes: list[NodeProcess] = []
    mon: _Monitor | None = None
    try:
        for i in range(standbys):
            node = NodeProcess.start(
                f"standby-{i}", redis_url=redis_url, horizon=horizon or sim.url,  # type: ignore[union-attr]
                ttl_ms=ttl_ms, job=job, start_cursor="now",
            )  # fmt: skip
            nodes.append(node)
        for node in nodes:
            node.event("standby", timeout=30)
        own = client.client_info()
        mon = _Monitor(redis_url, _script_names(), {own["addr"]})
        mon.start()
        time.sleep(1.0)  # past start-up
        before = _calls(client)
        cpu_before = [cpu_seconds(n.pid) + cpu_seconds(n.worker_pid) for n in nodes]
        mon.counting = True
        started = time.monotonic()
        k = 1
        while (now := time.monotonic()) < started + seconds:
            client.pexpire(lease, ttl_ms)
            time.sleep(max(0.0, min(started + k * ttl_ms / 5000, started + seconds) - now))
            k += 1
        mon.counting = False
        elapsed = time.monotonic() - started
        cpu_after = [cpu_seconds(n.pid) + cpu_seconds(n.worker_pid) for n in nodes]
        after = _calls(client)
        rss = [memory_kib(n.worker_pid)["VmRSS"] for n in nodes]
        assert all(n.process.poll() is None for n in nodes)
        assert client.get(lease) == b"1|harness-leader", "a standby took the lease"
    finally:
        if mon is not None:
            mon.stop()
        for node in nodes:
            node.stop()
        if sim is not None:
            sim.stop()
        client.delete(lease, job_keys(job)["token"], job_keys(job)["leader"])
        client.delete(job_keys(job)["health"])
        client.close()
    by_command = {
        name: after[name] - before.get(name, 0)
        for name in after
        if name not in HARNESS_COMMANDS and after[name] != before.get(name, 0)
    }
    total = sum(by_command.values())
    cpu = [(a - b) / elapsed for a, b in zip(cpu_after, cpu_before, strict=True)]
    per = elapsed * standbys
    out = {
        "standbys": standbys,
        "ttl_ms": ttl_ms,
        "seconds": elapsed,
        "sent_per_s_per_standby": sum(mon.sent.values()) / per,
        "sent": {name: round(n / per, 3) for name, n in sorted(mon.sent.items())},
        "round_trips_per_s_per_standby": mon.round_trips / per,
        "commands_per_s_per_standby": total / per,
        "by_command": by_command,
        "cpu_percent_per_standby": 100 * sum(cpu) / standbys,
        "rss_kib_per_standby": sum(rss) / standbys,
    }
    log(
        f"  {standbys} standbys, ttl {ttl_ms} ms: sent {out['sent_per_s_per_standby']:.2f} "
        f"commands/s each {out['sent']} ({out['round_trips_per_s_per_standby']:.2f} round trips/s); "
        f"commandstats {out['commands_per_s_per_standby']:.2f}/s each {by_command}, "
        f"CPU {out['cpu_percent_per_standby']:.2f}% of a core each, "
        f"RSS {out['rss_kib_per_standby'] / 1024:.0f} MiB each"
    )
    return out
