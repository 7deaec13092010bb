"""Redis memory per ingested record, with and without retention (``events.max_len``).

One simulator process serves ``count`` operations of history. For each retention setting a real node
process ingests all of them into a fresh job, timed from ``became-leader`` until the stream has had
``count`` entries appended. Then the job's events stream is measured with ``MEMORY USAGE ... SAMPLES
0`` (every entry counted) and Redis's ``used_memory`` before and after. The mean record size (the
JSON as Horizon sent it) is read from the stream too, so the per-entry overhead of Redis's stream
encoding and our fields (``paging_token``, ``token``, ``node``) can be given apart from it: memory
for N records is about ``N * (record bytes + overhead)``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import redis

from actors.lease_store import job_keys
from ingestion.testing.processes import NodeProcess, Simulator, stop_process

OPS_PER_LEDGER = 100


def _ingest(
    sim_url: str, redis_url: str, count: int, job: str, max_len: int, limit: float, *, reader: bool = False
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    events = job_keys(job)["events"]
    before = int(client.info("memory")["used_memory"])
    tail = None
    if reader:
        # A consumer group that keeps up (``tail --group`` to /dev/null): the trim must then read
        # the group's position in every commit.
        client.xgroup_create(events, "reader", id="0", mkstream=True)
        tail = subprocess.Popen(
            [sys.executable, "-m", "ingestion", "tail", "--redis", redis_url, "--job", job,
             "--group", "reader"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    node = NodeProcess.start(
        f"memory-{job}", redis_url=redis_url, horizon=sim_url, ttl_ms=5000, job=job,
        extra=("--events-max-len", str(max_len)),
    )  # fmt: skip
    try:
        leader = node.event("became-leader", timeout=30)
        end = leader.at + limit
        added = 0
        while time.monotonic() < end:
            try:
                added = int(client.xinfo_stream(events)["entries-added"])
            except redis.ResponseError:
                added = 0
            if added >= count:
                break
            time.sleep(0.01)
        seconds = time.monotonic() - leader.at
    finally:
        node.stop()
        if tail is not None:
            stop_process(tail)
    try:
        length = int(client.xlen(events))
        stream_bytes = int(client.memory_usage(events, samples=0) or 0)
        after = int(client.info("memory")["used_memory"])
        sample = client.xrange(events, count=1000)
        record_bytes = sum(len(f["record"].encode()) for _, f in sample) / max(1, len(sample))
    finally:
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token",
                                                            "audit", "leader")))  # fmt: skip
        client.close()
    return {
        "max_len": max_len,
        "records": added,
        "seconds": seconds,
        "rate": added / seconds,
        "stream_entries": length,
        "stream_bytes": stream_bytes,
        "used_memory_delta": after - before,
        "bytes_per_entry": stream_bytes / max(1, length),
        "record_bytes": record_bytes,
        "overhead_per_entry": stream_bytes / max(1, length) - record_bytes,
    }


def run(redis_url: str, *, count: int, retained: int = 10_000, log: Any = print) -> dict[str, Any]:
    ledgers = -(-count // OPS_PER_LEDGER)
    sim = Simulator.start(
        history_ledgers=ledgers, ops_per_ledger=OPS_PER_LEDGER, cache_records=count * 4 + 10_000
    )
    limit = max(60.0, count / 1000)
    out: dict[str, Any] = {"count": count}
    try:
        # Warm the simulator's cache with a first pass, so both measured runs read from it.
        _ingest(sim.url, redis_url, count, "memory-warm", 1000, limit)
        for name, max_len, reader in (
            ("unbounded", 0, False),
            ("retained", retained, False),
            ("retained_reader", retained, True),
        ):
            res = _ingest(sim.url, redis_url, count, f"memory-{name}", max_len, limit, reader=reader)
            out[name] = res
            log(
                f"  {name} (max_len {max_len}): {res['stream_entries']:,} entries, "
                f"{res['stream_bytes'] / 2**20:.1f} MiB, {res['bytes_per_entry']:.0f} B/entry "
                f"(record {res['record_bytes']:.0f} B), {res['rate']:,.0f} records/s"
            )
    finally:
        sim.stop()
    out["rate_ratio"] = out["retained"]["rate"] / out["unbounded"]["rate"]
    out["reader_rate_ratio"] = out["retained_reader"]["rate"] / out["unbounded"]["rate"]
    return out
