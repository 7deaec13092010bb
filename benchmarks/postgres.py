"""The PostgreSQL sink (docs/POSTGRES.md): what the fence costs against a bare ``COPY``, side by side.

A throwaway PostgreSQL (``ingestion/postgres/local.py``, durable: ``fsync`` on, as in production)
beside the benchmarks' redis-server. Three measurements, each against its reference in the same run:

- **Catch-up into PostgreSQL**: a real node process (``--sink``) ingests ``count`` operations from
  the simulator, timed from its ``became-leader`` line until the job's last ``seq`` reaches
  ``count``. The reference then writes *the same records in the same batches* (read back from the
  table: each commit is one transaction, so its rows share ``committed_at``) with ``COPY``, one
  transaction per batch, from memory: no Horizon, no fence, no continuity check. Those same
  batches then go through the commit path alone (``PostgresSink.commit`` from memory, no Horizon),
  interleaved batch by batch with the ``COPY`` (best of three rounds): the commit path's own ratio,
  which is what a backfill range's commits pay.
- **Commit latency by batch size** (1, 10, 200): ``PostgresSink.commit``, the CursorWriter's own
  call (one fenced ``commit_batch`` statement), one commit at a time continuing from the last
  cursor, interleaved round by round with a ``COPY`` transaction of the same batch.
- **Live**: a node following the simulator from ``now``; the harness closes a ledger and
  ``LISTEN``s on the commits' ``NOTIFY`` channel: ledger close -> all its records committed.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx
import psycopg
import trio

from actors.lease_store import Committed
from actors.source import Record
from benchmarks.catchup import _reference
from benchmarks.commit_cost import _records
from benchmarks.procs import percentile
from ingestion.postgres.connection import connect
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.processes import NodeProcess, Simulator

OPS_PER_LEDGER = 100
LIVE_OPS_PER_LEDGER = 20
SIZES = (1, 10, 200)

_COPY = "COPY public.copy_reference (job, seq, paging_token, record) FROM STDIN"
_COPY_TABLE = (
    "CREATE TABLE IF NOT EXISTS public.copy_reference (job text NOT NULL, seq bigint NOT NULL, "
    "paging_token text NOT NULL, record json NOT NULL, PRIMARY KEY (job, seq))"
)


def _last_seq(conn: psycopg.Connection[Any], job: str) -> int:
    row = conn.execute("SELECT coalesce(max(seq), 0) FROM ingestion.events WHERE job = %s", (job,)).fetchone()
    return int(row[0]) if row else 0


def catch_up(redis_url: str, pg: LocalPostgres, count: int, log: Any = print) -> dict[str, Any]:
    ledgers = -(-count // OPS_PER_LEDGER)
    sim = Simulator.start(history_ledgers=ledgers, ops_per_ledger=OPS_PER_LEDGER,
                          cache_records=count * 4 + 10_000)  # fmt: skip
    job = "pg-catchup"
    limit = max(60.0, count / 500)
    try:
        _reference("paged", sim.url, count, limit)  # warm every page
        node = NodeProcess.start("pg-catchup", redis_url=redis_url, horizon=sim.url, ttl_ms=5000,
                                 job=job, extra=["--sink", pg.url])  # fmt: skip
        try:
            leader = node.event("became-leader", timeout=30)
            with connect(pg.url, 5.0) as conn:
                end = leader.at + limit
                while time.monotonic() < end and _last_seq(conn, job) < count:
                    time.sleep(0.005)
                done = time.monotonic()
                written = _last_seq(conn, job)
        finally:
            node.stop()
    finally:
        sim.stop()
    with connect(pg.url, 30.0) as conn:
        rows = conn.execute(
            "SELECT seq, paging_token, record::text, committed_at FROM ingestion.events "
            "WHERE job = %s AND seq <= %s ORDER BY seq", (job, count),
        ).fetchall()  # fmt: skip
    batches: list[list[tuple[int, str, str]]] = []
    last_at = None
    for seq, token, record, at in rows:
        if at != last_at:
            batches.append([])
            last_at = at
        batches[-1].append((int(seq), str(token), str(record)))
    sides = trio.run(_replay, pg.url, job, batches, 3)
    node_rate = written / (done - leader.at)
    copy_rate = len(rows) / sides["copy"]
    sizes = sorted(len(b) for b in batches)
    out = {
        "count": count, "node_records": written, "node_seconds": done - leader.at,
        "node_rate": node_rate, "copy_rate": copy_rate, "ratio": node_rate / copy_rate,
        "batches": len(batches), "batch_p50": sizes[len(sizes) // 2], "batch_max": sizes[-1],
        "commit_rate": len(rows) / sides["sink"],
    }  # fmt: skip
    out["commit_ratio"] = out["commit_rate"] / copy_rate
    log(f"  catch-up of {written:,} ops into PostgreSQL: node {node_rate:,.0f} records/s, COPY of the "
        f"same {len(batches)} batches {copy_rate:,.0f} records/s: {out['ratio']:.2f}")  # fmt: skip
    log(f"  the same batches by the sink's commit alone: {out['commit_rate']:,.0f} records/s "
        f"({out['commit_ratio']:.2f} of COPY)")  # fmt: skip
    return out


async def _replay(
    url: str, job: str, batches: list[list[tuple[int, str, str]]], rounds: int
) -> dict[str, float]:
    """Seconds each writer took for ``batches``, the best of ``rounds`` rounds, the two writers
    interleaved batch by batch so that the disk's moods fall on both alike: ``sink``
    (``PostgresSink.commit``, the CursorWriter's call: fence, records, cursor, NOTIFY in one
    transaction) and ``copy`` (a bare ``COPY`` transaction per batch)."""
    best = {"sink": float("inf"), "copy": float("inf")}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_COPY_TABLE)
        for r in range(rounds):
            conn.execute("DELETE FROM public.copy_reference WHERE job = %s", (job,))
            sink = PostgresSink(url, f"{job}-replay{r}", call_timeout=30.0)
            await sink.open_term("bench", 1)
            cursor: str | None = None
            spent = dict.fromkeys(best, 0.0)
            for batch in batches:
                records = [Record(token, record) for _, token, record in batch]
                t0 = time.perf_counter()
                res = await sink.commit("bench", 1, cursor, records)
                spent["sink"] += time.perf_counter() - t0
                assert isinstance(res, Committed), res
                cursor = res.cursor
                t0 = time.perf_counter()
                with conn.transaction(), conn.cursor() as cur:
                    with cur.copy(_COPY) as cp:
                        for seq, token, record in batch:
                            cp.write_row((job, seq, token, record))
                spent["copy"] += time.perf_counter() - t0
            sink.close()
            best = {k: min(best[k], spent[k]) for k in best}
    return best


async def _commit_latency(url: str, seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size in SIZES:
        job = f"pg-commit{size}"
        sink = PostgresSink(url, job, call_timeout=10.0)
        await sink.open_term("bench", 1)
        node_lat: list[float] = []
        copy_lat: list[float] = []
        cursor: str | None = None
        i = 0
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_COPY_TABLE)
            end = time.monotonic() + 2 * seconds  # both sides, interleaved
            while time.monotonic() < end:
                batch = _records(i * size, size)
                t0 = time.perf_counter()
                res = await sink.commit("bench", 1, cursor, batch)
                node_lat.append(time.perf_counter() - t0)
                assert isinstance(res, Committed), res
                cursor = res.cursor
                t0 = time.perf_counter()
                with conn.transaction(), conn.cursor() as cur:
                    with cur.copy(_COPY) as cp:
                        for k, r in enumerate(batch):
                            cp.write_row((job, i * size + k + 1, r.paging_token, r.body))
                copy_lat.append(time.perf_counter() - t0)
                i += 1
        sink.close()
        results[str(size)] = {
            "commits": len(node_lat),
            "records_per_s": size * len(node_lat) / sum(node_lat),
            "copy_records_per_s": size * len(copy_lat) / sum(copy_lat),
            "p50_ms": percentile(node_lat, 50) * 1000, "p99_ms": percentile(node_lat, 99) * 1000,
            "copy_p50_ms": percentile(copy_lat, 50) * 1000, "copy_p99_ms": percentile(copy_lat, 99) * 1000,
        }  # fmt: skip
        r = results[str(size)]
        r["ratio"] = r["records_per_s"] / r["copy_records_per_s"]
    return results


def live(redis_url: str, pg: LocalPostgres, trials: int) -> dict[str, Any]:
    sim = Simulator.start(history_ledgers=10, ops_per_ledger=LIVE_OPS_PER_LEDGER)
    job = "pg-live"
    node = NodeProcess.start("pg-live", redis_url=redis_url, horizon=sim.url, ttl_ms=5000,
                             start_cursor="now", job=job, extra=["--sink", pg.url])  # fmt: skip
    last_ms: list[float] = []
    try:
        node.event("became-leader", timeout=30)
        with psycopg.connect(pg.url, autocommit=True) as conn, httpx.Client(timeout=10) as http:
            conn.execute("LISTEN ingestion_events")
            after = _last_seq(conn, job)
            for i in range(trials + 3):  # the first three warm the stream up
                time.sleep(random.uniform(0.02, 0.06))
                t0 = time.monotonic()
                ledger = sim.close_ledgers(http)
                seen = 0
                end = t0 + 15.0
                while seen < LIVE_OPS_PER_LEDGER:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"ledger {ledger} was not committed within 15 s")
                    for _ in conn.notifies(timeout=left, stop_after=1):
                        pass
                    now = time.monotonic()
                    rows = conn.execute(
                        "SELECT seq, paging_token FROM ingestion.events WHERE job = %s AND seq > %s "
                        "ORDER BY seq", (job, after),
                    ).fetchall()  # fmt: skip
                    for seq, token in rows:
                        after = int(seq)
                        seen += int(token) >> 32 == ledger
                if i >= 3:
                    last_ms.append((now - t0) * 1000)
    finally:
        node.stop()
        sim.stop()
    return {
        "trials": trials, "ops_per_ledger": LIVE_OPS_PER_LEDGER,
        "p50_ms": percentile(last_ms, 50), "p99_ms": percentile(last_ms, 99), "max_ms": max(last_ms),
    }  # fmt: skip


def run(redis_url: str, *, quick: bool, log: Any = print) -> dict[str, Any]:
    pg = LocalPostgres(durable=True).start()
    try:
        out: dict[str, Any] = {"server": _server_version(pg)}
        out["catch_up"] = catch_up(redis_url, pg, 5_000 if quick else 30_000, log)
        out["commit"] = trio.run(_commit_latency, pg.url, 1.0 if quick else 3.0)
        for size, r in out["commit"].items():
            log(f"  batch {size}: node {r['records_per_s']:,.0f} records/s, p50 {r['p50_ms']:.2f} ms, "
                f"p99 {r['p99_ms']:.2f} ms; COPY {r['copy_records_per_s']:,.0f} records/s, p50 "
                f"{r['copy_p50_ms']:.2f} ms, p99 {r['copy_p99_ms']:.2f} ms; "
                f"ratio {r['ratio']:.2f}")  # fmt: skip
        out["live"] = live(redis_url, pg, 20 if quick else 100)
        lv = out["live"]
        log(f"  live: ledger close -> all {LIVE_OPS_PER_LEDGER} records committed: p50 "
            f"{lv['p50_ms']:.1f} ms, p99 {lv['p99_ms']:.1f} ms, max {lv['max_ms']:.1f} ms")  # fmt: skip
    finally:
        pg.cleanup()
    return out


def _server_version(pg: LocalPostgres) -> str:
    with psycopg.connect(pg.url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {row[0] if row else '?'}"
