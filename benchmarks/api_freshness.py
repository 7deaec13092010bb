"""The events API's freshness: committed -> visible to ``getEvents`` (docs/API.md, issue 48).

A throwaway PostgreSQL (durable: ``fsync`` on). A sink commits one event at a time (a ledger
each, its through cursor), ``--interval`` apart; the projector (:func:`projector_action`, woken by
the commits' ``NOTIFY``) runs beside it, and a client polls ``getEvents`` over HTTP from its last
cursor as fast as it is answered. Each event's latency is from its commit's return to the first
answer that holds it (the client's own poll time included: a few ms). All in one trio process,
one clock.

    python -m benchmarks.api_freshness [--events N] [--interval S]
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx
import structlog
import trio

from actors.lease_store import Committed
from actors.source import TermContext
from benchmarks.procs import percentile
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.testing.api_events import make_events, records
from ingestion.testing.local_postgres import LocalPostgres

VIEW = "fresh"


async def measure(url: str, count: int, interval: float) -> dict[str, float]:
    events = make_events(1, 20 * count)
    by_ledger: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        by_ledger.setdefault(Cursor.parse(e.id).ledger, []).append(i)
    ledgers = [ledger for ledger in sorted(by_ledger) if by_ledger[ledger]][: count + 1]
    sink = PostgresSink(url, VIEW, call_timeout=5)
    await sink.open_term("a", 1)
    first = [events[i] for i in by_ledger[ledgers[0]]]
    done = await sink.commit("a", 1, None, records(first), str(Cursor.through(ledgers[0])))
    assert isinstance(done, Committed)
    cursor = done.cursor
    committed: dict[str, float] = {}
    seen: dict[str, float] = {}
    action = projector_action(url, "ingestion", VIEW, run_seconds=3600)
    app = ApiApp(StoreReader(url, "ingestion", VIEW))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(action, 1, TermContext("p", 1))
        port = await nursery.start(serve_api, app, "127.0.0.1", 0, structlog.get_logger())
        all_seen = trio.Event()

        async def poll() -> None:
            after = str(Cursor.through(ledgers[0]))
            async with httpx.AsyncClient(timeout=5) as client:
                while not all(i in seen for i in committed) or len(committed) < count:
                    body = {"jsonrpc": "2.0", "id": 1, "method": "getEvents",
                            "params": {"pagination": {"cursor": after, "limit": 1000}}}  # fmt: skip
                    answer = (await client.post(f"http://127.0.0.1:{port}/", json=body)).json()
                    now = trio.current_time()
                    if "result" not in answer:
                        await trio.sleep(0.01)  # the first ledger not projected yet
                        continue
                    for event in answer["result"]["events"]:
                        seen.setdefault(event["id"], now)
                    after = answer["result"]["cursor"]
            all_seen.set()

        nursery.start_soon(poll)
        for ledger in ledgers[1:]:
            batch = [events[i] for i in by_ledger[ledger]]
            done = await sink.commit("a", 1, cursor, records(batch), str(Cursor.through(ledger)))
            assert isinstance(done, Committed)
            now = trio.current_time()
            cursor = done.cursor
            committed[batch[-1].id] = now
            await trio.sleep(interval)
        with trio.fail_after(30):
            await all_seen.wait()
        nursery.cancel_scope.cancel()
    sink.close()
    lags = sorted((seen[i] - t) * 1000 for i, t in committed.items())
    return {"events": len(lags), "p50_ms": percentile(lags, 50), "p99_ms": percentile(lags, 99),
            "max_ms": lags[-1]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_freshness")
    p.add_argument("--events", type=int, default=300)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--no-fsync", dest="durable", action="store_false")
    args = p.parse_args(argv)
    pg = LocalPostgres(durable=args.durable).start()
    try:
        result = trio.run(measure, pg.url, args.events, args.interval)
    finally:
        pg.cleanup()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
