"""Live latency: from a ledger closing in the simulator to its records being committed in Redis.

The simulator's records carry deterministic ``created_at`` stamps, so the clock is the harness's:
it closes a ledger with ``POST /_simulator/ledgers {"count": 1}`` at a known monotonic time and
watches the events stream (``XREAD BLOCK``) for that ledger's records, noting when the first and
when the last of them arrive. The node follows the simulator's SSE stream from ``now``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import redis

from actors.lease_store import job_keys
from benchmarks.procs import percentile
from ingestion.testing.processes import NodeProcess, Simulator

OPS_PER_LEDGER = 20


def _ledger_of(token: bytes) -> int:
    return int(token) >> 32


def _wait_ledger(
    client: redis.Redis, events: str, last_id: bytes, seq: int, timeout: float
) -> tuple[float, float, bytes]:
    """(first seen, last seen, last entry id) for ledger ``seq``'s records."""
    first: float | None = None
    seen = 0
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        reply = client.xread({events: last_id}, count=1000, block=200)
        now = time.monotonic()
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                last_id = entry_id
                ledger = _ledger_of(fields[b"paging_token"])
                if ledger == seq:
                    first = now if first is None else first
                    seen += 1
                    if seen == OPS_PER_LEDGER:  # the simulator puts exactly this many in each
                        return first, now, last_id
    raise TimeoutError(f"ledger {seq} was not committed within {timeout}s")


def run(redis_url: str, *, trials: int, log: Any = print) -> dict[str, Any]:
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=OPS_PER_LEDGER)
    client = redis.Redis.from_url(redis_url)
    job = "latency"
    events = job_keys(job)["events"]
    node = NodeProcess.start(
        "latency-node", redis_url=redis_url, horizon=sim.url, ttl_ms=5000,
        start_cursor="now", job=job,
    )  # fmt: skip
    first_ms: list[float] = []
    last_ms: list[float] = []
    try:
        node.event("became-leader", timeout=30)
        with httpx.Client(timeout=10) as http:
            last_id = b"0-0"
            # Warm-up: the stream is open once a closed ledger's records show up.
            for i in range(trials + 3):
                time.sleep(random.uniform(0.02, 0.06))
                t0 = time.monotonic()
                seq = sim.close_ledgers(http)
                first, last, last_id = _wait_ledger(client, events, last_id, seq, 15.0)
                if i >= 3:
                    first_ms.append((first - t0) * 1000)
                    last_ms.append((last - t0) * 1000)
    finally:
        node.stop()
        sim.stop()
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease")))
        client.close()
    out = {
        "trials": trials,
        "ops_per_ledger": OPS_PER_LEDGER,
        "first_p50_ms": percentile(first_ms, 50),
        "first_p99_ms": percentile(first_ms, 99),
        "last_p50_ms": percentile(last_ms, 50),
        "last_p99_ms": percentile(last_ms, 99),
    }
    log(
        f"  ledger close -> all {OPS_PER_LEDGER} records committed: p50 {out['last_p50_ms']:.1f} ms,"
        f" p99 {out['last_p99_ms']:.1f} ms (first record p50 {out['first_p50_ms']:.1f} ms)"
    )
    return out
