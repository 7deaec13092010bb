"""The data lake: decoding real pubnet ledgers on 1 and 2 processes, and an RPC job's backfill.

Decode. The four busy pubnet ledgers of ``../shared/data/lake`` (``wallet-backend_ledger-*``:
541, 264, 228 and 236 transactions, TransactionMeta V4; read where :mod:`ingestion.testing.recorded` finds
them, never copied) are each made a one-ledger lake object (zstd of a ``LedgerCloseMetaBatch``,
as Galexie writes them) in memory; ``objects`` of them, cycled, go through
:func:`~ingestion.lake.decoding.open_decoders` as the lake source drives it: ``read_ahead``
objects in flight, results taken in order. Figures: ledgers/s and events/s at 0 (a thread of this
process, the node before issue 28's speed work), 1 and 2 worker processes, side by side in one
run, and the speed-up of 2 over 1. Each run also reports the load average before it (another
process on the machine takes a core from the 2-process run) and its workers' CPU seconds. The
pool's start (spawning, importing stellar-sdk, compiling the XDR walks: about a second) is inside
the time: a term pays it once; 400 ledgers (80 quick) keep it small beside the decode, which
reads only what events need (about 25 ledgers per CPU second). Then, in one process, the same
ledgers read the partial way and with stellar-sdk's whole decode, alternating (``partial_vs_full``:
ledgers per CPU second of each, and the two results compared).

Backfill. A simulator process with ``--lake-dir`` writes its whole chain (``ledgers`` ledgers)
to a lake and serves RPC with a 100-ledger window; a node follows an RPC job from ``0`` with
``rpc.on_history_gap = "lake"``: it records the gap, reads the lake up to RPC's window, then goes
on on RPC. Figures: from ``became-leader`` to the cursor at the latest ledger (s, ledgers/s,
events/s), and the handover: the Redis time of the last lake commit (the cursor stream's entry
id of the last lake batch) to the first RPC commit.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
import trio
import zstandard
from stellar_sdk import xdr

from actors.lease_store import job_keys
from benchmarks.procs import memory_kib
from benchmarks.rpc import RpcSimulator, _cursor, _page_everything
from ingestion.lake import events
from ingestion.lake.decoding import open_decoders
from ingestion.rpc.protocol import Cursor
from ingestion.testing import recorded
from ingestion.testing.processes import NodeProcess

PUBNET = (
    "wallet-backend_ledger-51000294.xdr.gz",
    "wallet-backend_ledger-57500008.xdr.gz",
    "wallet-backend_ledger-63092988.xdr.gz",
    "wallet-backend_ledger-63092990.xdr.gz",
)


def pubnet_objects() -> list[bytes] | None:
    """The real ledgers as one-ledger lake objects; None when the recordings are absent."""
    if not recorded.LAKE.is_dir():
        return None
    out = []
    for name in PUBNET:
        meta = xdr.LedgerCloseMeta.from_xdr_bytes(gzip.decompress((recorded.LAKE / name).read_bytes()))
        body = meta.v0 or meta.v1 or meta.v2
        seq = xdr.Uint32(body.ledger_header.header.ledger_seq.uint32)
        batch = xdr.LedgerCloseMetaBatch(seq, seq, [meta])
        out.append(zstandard.ZstdCompressor().compress(batch.to_xdr_bytes()))
    return out


async def _decode_all(
    objects: list[bytes], count: int, processes: int, read_ahead: int
) -> tuple[int, float]:
    """Decode ``count`` objects (cycling ``objects``) with ``read_ahead`` in flight, in order;
    the number of events and when (``perf_counter``) the first object's ledgers arrived (the
    pool started: spawned, stellar-sdk imported, the walks compiled)."""
    events = 0
    first_at = 0.0
    async with open_decoders(processes) as decoders, trio.open_nursery() as nursery:
        slots_send, slots = trio.open_memory_channel[trio.MemoryReceiveChannel[Any]](read_ahead - 1)

        async def one(data: bytes, slot: trio.MemorySendChannel[Any]) -> None:
            with slot:
                await slot.send(await decoders.decode(data))

        async def feed() -> None:
            with slots_send:
                for i in range(count):
                    send, receive = trio.open_memory_channel[Any](1)
                    await slots_send.send(receive)  # blocks while read_ahead are in flight
                    nursery.start_soon(one, objects[i % len(objects)], send)

        nursery.start_soon(feed)
        with slots:
            async for slot in slots:
                with slot:
                    ledgers = await slot.receive()
                first_at = first_at or time.perf_counter()
                events += sum(len(le.events) for le in ledgers)
    return events, first_at


def decode(objects: list[bytes], count: int, processes: int, read_ahead: int = 4) -> dict[str, Any]:
    load = os.getloadavg()[0]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    started = time.perf_counter()
    events, first_at = trio.run(_decode_all, objects, count, processes, read_ahead)
    ended = time.perf_counter()
    elapsed = ended - started
    workers_cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu  # reaped on exit
    return {
        "processes": processes,
        "load_before": round(load, 2),
        "workers_cpu_s": round(workers_cpu, 2),
        "ledgers": count,
        "seconds": round(elapsed, 2),
        "ledgers_per_s": round(count / elapsed, 2),
        # once the pool has started (a term pays its start once): after the first object's ledgers
        "first_result_s": round(first_at - started, 2),
        "steady_ledgers_per_s": round((count - 1) / (ended - first_at), 2),
        "events_per_s": round(events / elapsed),
        # what a worker decodes per CPU second: equal at 1 and 2 workers means the parent does not
        # serialize them, and the speed-up is bounded only by free cores
        "ledgers_per_worker_cpu_s": round(count / workers_cpu, 2) if workers_cpu > 0 else None,
    }


def partial_vs_full(objects: list[bytes], rounds: int) -> dict[str, Any]:
    """In this process, no pool: each object read the partial way (``object_events``) and the
    whole way (stellar-sdk's decode, then the events), alternating, ``rounds`` times over the
    same objects; the two results compared. CPU seconds (``process_time``: what another process
    on the machine takes is not counted) and wall seconds of each."""
    events.compile_walks()
    load = os.getloadavg()[0]
    cpu = {"full": 0.0, "partial": 0.0}
    wall = dict(cpu)
    count = 0
    for _ in range(rounds):
        for data in objects:
            got = {}
            for way in ("full", "partial"):
                started_cpu, started = time.process_time(), time.perf_counter()
                if way == "full":
                    metas = events.read_batch(events.decompress(data))[2]
                    got[way] = [events.ledger_events(m) for m in metas]
                else:
                    got[way] = events.object_events(data)
                cpu[way] += time.process_time() - started_cpu
                wall[way] += time.perf_counter() - started
            if got["full"] != got["partial"]:
                raise AssertionError("the partial decode differs from the full one")
            count += 1
    return {
        "ledgers": count,
        "load_before": round(load, 2),
        "full_ledgers_per_cpu_s": round(count / cpu["full"], 2),
        "partial_ledgers_per_cpu_s": round(count / cpu["partial"], 2),
        "full_ledgers_per_s": round(count / wall["full"], 2),
        "partial_ledgers_per_s": round(count / wall["partial"], 2),
        "partial_over_full_cpu": round(cpu["full"] / cpu["partial"], 2),
    }


def run_decode(count: int, rounds: int = 3) -> dict[str, Any]:
    objects = pubnet_objects()
    if objects is None:
        return {"skipped": f"no recordings at {recorded.LAKE}"}
    runs = {p: decode(objects, count, p) for p in (0, 1, 2)}
    return {
        "runs": list(runs.values()),
        "speedup_2_over_1": round(runs[2]["ledgers_per_s"] / runs[1]["ledgers_per_s"], 2),
        "steady_speedup_2_over_1": round(
            runs[2]["steady_ledgers_per_s"] / runs[1]["steady_ledgers_per_s"], 2
        ),
        "cores": os.cpu_count(),
        "partial_vs_full": partial_vs_full(objects, rounds),
    }


def _first_and_last_by_ledger(client: redis.Redis, key: str, through: int) -> tuple[int, int]:
    """Redis times (ms, from the stream's entry ids) of the last event at or before ledger
    ``through`` (the lake's last commit) and of the first one after it (RPC's first)."""
    last_lake = first_rpc = None
    start = "-"
    while first_rpc is None:
        entries = client.xrange(key, min=start, count=5000)
        if not entries:
            break
        for entry_id, fields in entries:
            ms = int(entry_id.decode().split("-")[0])
            if json.loads(fields[b"record"])["ledger"] <= through:
                last_lake = ms
            else:
                first_rpc = ms
                break
        start = "(" + entries[-1][0].decode()
    if last_lake is None or first_rpc is None:
        raise RuntimeError(f"no events on both sides of ledger {through}")
    return last_lake, first_rpc


def backfill(
    redis_url: str, *, ledgers: int, processes: tuple[int, ...], log: Any, retention: int = 100
) -> dict[str, Any]:
    """An RPC job from the chain's first ledger, ``ledgers - retention`` of them only in the lake
    (see the module docstring), once per number of decode processes."""
    lake_dir = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    client = redis.Redis.from_url(redis_url)
    written = time.monotonic()
    sim = RpcSimulator.start(
        "--history-ledgers", str(ledgers), "--retention-ledgers", str(retention),
        "--ops-per-ledger", "20", "--ledger-interval", "0", "--lake-dir", str(lake_dir / "lake"),
    )  # fmt: skip
    out: dict[str, Any] = {"ledgers": ledgers, "retention": retention, "runs": []}
    try:
        with httpx.Client(timeout=300) as http:
            latest = int(sim.call(http, "getLatestLedger")["sequence"])
            out["simulator_start_s"] = round(time.monotonic() - written, 1)
            first = latest - ledgers + 1
            # the simulator derives its events on first use: pay that before the first run, not in it
            _page_everything(sim, http, latest - retention + 1, 10_000)
            done = str(Cursor.through(latest))
            for count in processes:
                job = f"bench-lake-{count}"
                keys = [job_keys(job)[k] for k in ("events", "cursor", "lease", "token", "audit")]
                client.delete(*keys)
                node = NodeProcess.start(
                    f"lake-{count}", redis_url=redis_url, horizon=None, ttl_ms=5000, job=job,
                    start_cursor=str(first), extra=["--source", "rpc", "--rpc", sim.rpc],
                    env={
                        "INGESTION_RPC_ON_HISTORY_GAP": "lake", "INGESTION_RPC_LAKE": str(lake_dir / "lake"),
                        "INGESTION_LAKE_DECODE_PROCESSES": str(count),
                    },
                )  # fmt: skip
                try:
                    node.event("became-leader", timeout=60)
                    began = time.monotonic()
                    while _cursor(client, job) != done:
                        if time.monotonic() > began + 900:
                            raise TimeoutError(f"{count} decode processes: not caught up in 900 s")
                        time.sleep(0.01)
                    seconds = time.monotonic() - began
                    handover = node.event("rpc-lake-handover", timeout=10)
                    peak = memory_kib(node.worker_pid)["VmHWM"]
                finally:
                    node.stop()
                through = int(handover.fields["through_ledger"])
                last_lake, first_rpc = _first_and_last_by_ledger(client, keys[0], through)
                events = client.xlen(keys[0])
                run = {
                    "decode_processes": count, "seconds": round(seconds, 2),
                    "ledgers_per_s": round(ledgers / seconds), "events": events,
                    "events_per_s": round(events / seconds), "lake_ledgers": through - first + 1,
                    "lake_s": handover.fields["lake_s"], "handover_ms": first_rpc - last_lake,
                    "peak_rss_kib": peak,
                }  # fmt: skip
                out["runs"].append(run)
                client.delete(*keys)
                log(
                    f"  backfill, {count} decode processes: {ledgers:,} ledgers in {seconds:.1f} s "
                    f"({run['ledgers_per_s']:,} ledgers/s, {run['events_per_s']:,} events/s; "
                    f"{run['lake_ledgers']:,} from the lake in {run['lake_s']} s); lake -> RPC "
                    f"handover {run['handover_ms']} ms on Redis's clock"
                )
    finally:
        sim.stop()
        client.close()
        shutil.rmtree(lake_dir, ignore_errors=True)
    return out


def run(redis_url: str, *, quick: bool, log: Any = print) -> dict[str, Any]:
    """The section: pubnet decode on 0, 1 and 2 processes, and the backfill."""
    result: dict[str, Any] = {"decode": run_decode(80 if quick else 400, 1 if quick else 3)}
    for r in result["decode"].get("runs", ()):
        log(
            f"  pubnet decode, {r['processes']} processes: {r['ledgers_per_s']} ledgers/s "
            f"({r['events_per_s']:,} events/s; load {r['load_before']} before; "
            f"{r['ledgers_per_worker_cpu_s']} ledgers per worker CPU second)"
        )
    if "speedup_2_over_1" in result["decode"]:
        log(f"  2 processes over 1: {result['decode']['speedup_2_over_1']}x "
            f"(once started: {result['decode']['steady_speedup_2_over_1']}x)")
        pf = result["decode"]["partial_vs_full"]
        log(
            f"  one process, same ledgers: partial {pf['partial_ledgers_per_cpu_s']} vs full "
            f"{pf['full_ledgers_per_cpu_s']} ledgers per CPU second ({pf['partial_over_full_cpu']}x)"
        )
    result["backfill"] = backfill(
        redis_url, ledgers=2_000 if quick else 10_000, processes=(1,) if quick else (0, 1, 2), log=log
    )
    return result
