"""The audit's cost beside the backfill's (docs/BENCHMARKS.md, "Backfill in parallel ranges").

Run by :mod:`benchmarks.backfill` right after its one-node backfill, on the same lake and the
store that backfill wrote (the ranges' Redis streams): ``ingestion audit`` over every ledger of
it, as an operator runs it (its own process), first pinned to one core with one decode process
(the per-core rate, beside the backfill node's ledgers per CPU second), then on every core with a
decode process each. CPU is the command's whole tree (its decode workers reaped by it, counted in
this process's ``RUSAGE_CHILDREN``). Each run must find the store equal to the lake (exit 0): an
audit that finds something in a clean backfill is a failure, not a figure.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def audit_once(cfg: Path, redis_url: str, job: str, first: int, last: int, cores: set[int]) -> dict[str, Any]:
    """One ``ingestion audit`` of ``job``'s ledgers ``first..last`` on ``cores`` (one decode
    process each); its figures."""
    command = [sys.executable, "-m", "ingestion", "audit", job, "--config", str(cfg), "--redis", redis_url,
               "--from", str(first), "--to", str(last), "--processes", str(len(cores)), "--json"]  # fmt: skip
    cpu_before, started = _children_cpu(), time.monotonic()
    pinned = lambda: os.sched_setaffinity(0, cores)  # noqa: E731 (its decode workers inherit it)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=pinned)
    seconds, cpu = time.monotonic() - started, _children_cpu() - cpu_before
    if done.returncode != 0:
        what = f"{done.stdout}{done.stderr}"
        raise RuntimeError(f"the audit of the clean backfill exited {done.returncode}: {what}")
    report = json.loads(done.stdout)
    ledgers = last - first + 1
    return {
        "cores": len(cores), "ledgers": ledgers, "records": report["expected"], "seconds": seconds,
        "ledgers_per_s": ledgers / seconds, "cpu_s": cpu, "ledgers_per_cpu_s": ledgers / cpu,
        "inner_seconds": report["seconds"],
    }  # fmt: skip


def measure(cfg: Path, redis_url: str, job: str, first: int, last: int) -> dict[str, Any]:
    """The audit on one core, then on every core this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    return {
        "one": audit_once(cfg, redis_url, job, first, last, {cores[0]}),
        "all": audit_once(cfg, redis_url, job, first, last, set(cores)),
    }


def rows(bf: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    """The table's rows for the audit measured beside the backfill ``bf``."""
    a = bf.get("audit")
    if not a:
        return []
    one, every, node = a["one"], a["all"], bf["one"]
    return [
        (
            f"audit of the same {one['ledgers']:,} ledgers ({one['records']:,} records) against the 1-node "
            "backfill's Redis streams: 1 core (1 decode process) / every core, seconds (ledgers/s)",
            f"{one['seconds']:.1f} ({one['ledgers_per_s']:.1f}) / {every['seconds']:.1f} "
            f"({every['ledgers_per_s']:.1f}) on {every['cores']} cores",
            "", None,
        ),
        (
            "audit vs backfill: ledgers per CPU second (the per-core rate; the backfill's: its node's tree)",
            f"{one['ledgers_per_cpu_s']:.1f} vs {node['ledgers_per_cpu_s']:.1f} "
            f"({one['ledgers_per_cpu_s'] / node['ledgers_per_cpu_s']:.2f}x)",
            "", None,
        ),
    ]  # fmt: skip
