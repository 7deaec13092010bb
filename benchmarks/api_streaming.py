"""The events API's subscriptions (docs/API.md, its streaming section, issue 48): committed -> subscriber, and
what 100 subscribers on the committing node cost its commits, side by side in one run.

A throwaway PostgreSQL (durable: ``fsync`` on). The "node" is this trio process: a sink commits one
ledger's events at a time (its through cursor), ``--interval`` apart; the projector
(:func:`projector_action`, woken by the commits' ``NOTIFY``) and the API with its streams
(:func:`serve_api`: ``/ws`` and the live feed) run beside it, as on a node with ``api.port``. The
subscribers are another process (``--clients N``, trio-websocket), so that their own work is not
counted as the node's; both read ``time.monotonic()``, one clock for the machine.

Three phases of ``--commits`` commits each: none subscribed, ``--subscribers`` subscribed (from
the newest event), none again. Commit latency is ``PostgresSink.commit``'s round trip (the
CursorWriter's own call), with 100 subscribers against none (both none phases pooled); committed ->
subscriber is from a commit's return to each subscriber's receipt of its last event. The node
settles its heap once it serves, as a node does (``ingestion/node/heap.py``); ``--unsettled``
leaves CPython's collector as it was before, for a side-by-side run.

    python -m benchmarks.api_streaming [--commits N] [--interval S] [--subscribers N] [--unsettled]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import structlog
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from actors.lease_store import Committed
from actors.source import TermContext
from benchmarks.procs import percentile
from ingestion.api.feed import LiveFeed
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.api.stream_reads import StreamReads
from ingestion.api.streaming import Streams
from ingestion.node.heap import settle
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.testing.api_events import make_events, records
from ingestion.testing.local_postgres import LocalPostgres

VIEW = "streamed"


# -- the subscribers' process ---------------------------------------------------------------------


async def subscribers(port: int, count: int, out: Path) -> None:
    """``count`` subscriptions from the newest event; each event id's receipt times written to
    ``out`` as JSON when SIGTERM comes. Prints ``ready`` once every subscription has caught up."""
    received: dict[str, list[float]] = {}
    closed: list[str] = []  # the server's closes before the harness's SIGTERM (none expected)
    caught_up = 0
    ready = trio.Event()
    pauses: list[float] = []  # this process's own full collections (the harness's, not the node's)

    async def one() -> None:
        nonlocal caught_up
        async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
            request = {"jsonrpc": "2.0", "id": 1, "method": "subscribeEvents", "params": {"startLedger": 1}}
            await ws.send_message(orjson.dumps(request).decode())
            first = True
            while True:
                message = orjson.loads(await ws.get_message())
                params = message.get("params")
                if params is None:
                    continue
                now = time.monotonic()
                for event in params["events"]:
                    received.setdefault(event["id"], []).append(now)
                if first and not params["events"]:  # the seam: history is done
                    first = False
                    caught_up += 1
                    if caught_up == count:
                        ready.set()

    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(_closes_noted, one, closed)
            await ready.wait()
            gc.callbacks.append(_full_collections(pauses))
            print("ready", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    await trio.Path(out).write_text(json.dumps({"received": received, "closed": closed, "pauses": pauses}))


async def _closes_noted(fn: Any, closed: list[str]) -> None:
    try:
        await fn()
    except ConnectionClosed as exc:
        why = exc.reason
        closed.append("no reason" if why is None else f"{why.code} {why.reason or ''}".strip())


# -- the node ------------------------------------------------------------------------------------


async def measure(
    url: str, commits: int, interval: float, count: int, settled: bool = True
) -> dict[str, Any]:
    events = make_events(1, 40 * 3 * commits)
    by_ledger: dict[int, list[Any]] = {}
    for e in events:
        by_ledger.setdefault(Cursor.parse(e.id).ledger, []).append(e)
    ledgers = sorted(by_ledger)
    sink = PostgresSink(url, VIEW, call_timeout=5)
    await sink.open_term("a", 1)
    cursor: str | None = None
    latency: dict[str, list[float]] = {"none": [], "subscribed": []}
    committed: dict[str, float] = {}
    reader = StoreReader(url, "ingestion", VIEW)
    reads = StreamReads(reader)
    streams = Streams(LiveFeed(reads, url), reads, max_subscribers=count + 10)
    app = ApiApp(reader, streams=streams)
    next_ledger = 0

    async def commit_phase(n: int, phase: str | None) -> None:
        nonlocal cursor, next_ledger
        for _ in range(n):
            ledger = ledgers[next_ledger]
            next_ledger += 1
            batch = by_ledger[ledger]
            started = time.monotonic()
            done = await sink.commit("a", 1, cursor, records(batch), str(Cursor.through(ledger)))
            returned = time.monotonic()
            assert isinstance(done, Committed), done
            cursor = done.cursor
            if phase is not None:
                latency[phase].append((returned - started) * 1000)
            if phase == "subscribed":
                committed[batch[-1].id] = returned
            await trio.sleep(interval)

    pauses: list[float] = []  # the node's full collections (generation 2) once it serves, ms each
    out = Path(f"/tmp/ingestion-bench-streaming-{os.getpid()}.json")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(projector_action(url, "ingestion", VIEW, run_seconds=3600), 1, TermContext("p", 1))
        port = await nursery.start(serve_api, app, "127.0.0.1", 0, structlog.get_logger())
        if settled:
            settle()  # as a node does once it serves (ingestion/node/heap.py)
        gc.callbacks.append(_full_collections(pauses))
        await commit_phase(20, None)  # warm-up: connections, the projector's first runs
        await commit_phase(commits, "none")
        clients = subprocess.Popen(  # noqa: ASYNC220 (its pipe is read in a thread)
            [sys.executable, "-m", "benchmarks.api_streaming", "--clients", str(count), "--port", str(port),
             "--out", str(out)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert clients.stdout is not None
            line = await trio.to_thread.run_sync(clients.stdout.readline)
            assert line.strip() == "ready", line
            await commit_phase(commits, "subscribed")
            await trio.sleep(1.0)  # the last commit's notifications on their way
        finally:
            clients.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(clients.wait, 30)
        await commit_phase(commits, "none")
        stats = streams.stats
        nursery.cancel_scope.cancel()
    sink.close()
    written = json.loads(await trio.Path(out).read_text())
    received: dict[str, list[float]] = written["received"]
    await trio.Path(out).unlink()
    lags = sorted((t - at) * 1000 for eid, at in committed.items() for t in received.get(eid, []))
    missing = sum(count - len(received.get(eid, [])) for eid in committed)
    short = [i for i, eid in enumerate(committed) if len(received.get(eid, [])) < count]
    none, subscribed = latency["none"], latency["subscribed"]
    return {
        "subscribers": count,
        "heap_settled": settled,
        "commits_per_phase": commits,
        "interval_s": interval,
        "committed_to_subscriber_ms": {"p50": percentile(lags, 50), "p99": percentile(lags, 99),
                                       "max": lags[-1], "deliveries": len(lags), "missing": missing,
                                       "first_commit_short": short[0] if short else None},
        "commit_ms_none": {"p50": percentile(none, 50), "p99": percentile(none, 99)},
        "commit_ms_subscribed": {"p50": percentile(subscribed, 50), "p99": percentile(subscribed, 99)},
        "commit_p50_ratio": percentile(subscribed, 50) / percentile(none, 50),
        "notifications_sent": stats.notifications,
        "node_full_collections": {"count": len(pauses), "max_ms": max(pauses, default=0.0)},
        "subscribers_full_collections": {"count": len(written["pauses"]),
                                         "max_ms": max(written["pauses"], default=0.0)},
        "closed_by_server": written["closed"],
        "cut": dict(stats.cut),
    }  # fmt: skip


def _full_collections(pauses: list[float]) -> Any:
    """A ``gc.callbacks`` entry that notes each full collection's pause (ms) in ``pauses``."""
    began = [0.0]

    def noted(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - began[0]) * 1000)

    return noted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_streaming")
    p.add_argument("--commits", type=int, default=200, help="commits per phase")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between commits")
    p.add_argument("--subscribers", type=int, default=100)
    p.add_argument("--no-fsync", dest="durable", action="store_false")
    p.add_argument(
        "--unsettled",
        dest="settled",
        action="store_false",
        help="leave the garbage collector as CPython sets it (no ingestion/node/heap.py)",
    )
    p.add_argument("--clients", type=int, help=argparse.SUPPRESS)  # the subscribers' process
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.clients:
        trio.run(subscribers, args.port, args.clients, args.out)
        return 0
    pg = LocalPostgres(durable=args.durable).start()
    try:
        result = trio.run(measure, pg.url, args.commits, args.interval, args.subscribers, args.settled)
    finally:
        pg.cleanup()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
