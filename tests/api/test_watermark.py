"""The events API never claims a ledger its job's completeness watermark has not reached (issue
49): a job whose cursor went on past a history gap serves ``getHealth``'s and
``getLatestLedger``'s latest ledger, and ``getEvents``' window, only through its watermark; a job
without one (``apiv``, committed with none) keeps the projection's window. Real PostgreSQL."""

from __future__ import annotations

import orjson

from actors.lease_store import Committed
from actors.source import TermContext, Watermark
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.testing.api_events import records
from ingestion.testing.local_postgres import LocalPostgres
from tests.api.conftest import EVENTS, ledger_of

HELD = "history gap: ledgers 251-260 missing from the source"


async def ask(app: ApiApp, method: str, params: object = None) -> dict[str, object]:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return dict(orjson.loads(await app.answer(body)))


async def test_latest_ledger_stops_at_the_jobs_watermark(pg: LocalPostgres, view: str) -> None:
    sink = PostgresSink(pg.url, "wmk", call_timeout=5)
    await sink.open_term("a", 1)
    held = records([e for e in EVENTS if ledger_of(e.id) >= 200])
    done = await sink.commit("a", 1, None, held, str(Cursor.through(300)), Watermark(250, HELD))
    assert isinstance(done, Committed)
    sink.close()
    assert (await projector_action(pg.url, "ingestion", "wmk", run_seconds=0)(1, TermContext("p", 1)))["rows"]
    app, plain = (
        ApiApp(StoreReader(pg.url, "ingestion", "wmk")),
        ApiApp(StoreReader(pg.url, "ingestion", view)),
    )
    try:
        health = (await ask(app, "getHealth"))["result"]
        assert health == {"status": "healthy", "oldestLedger": 200, "latestLedger": 250,
                          "ledgerRetentionWindow": 51}  # fmt: skip
        assert (await ask(app, "getLatestLedger"))["result"]["sequence"] == 250  # type: ignore[index]
        page = (await ask(app, "getEvents", {"startLedger": 240, "pagination": {"limit": 10000}}))["result"]
        assert page["latestLedger"] == 250  # type: ignore[index]
        ledgers = {ledger_of(e["id"]) for e in page["events"]}  # type: ignore[index]
        assert ledgers and max(ledgers) == 250 and page["cursor"] == str(Cursor.through(250))  # type: ignore[index]
        refused = await ask(app, "getEvents", {"startLedger": 260})
        assert refused["error"] == {
            "code": -32600,
            "message": "startLedger must be within the ledger range: 200 - 250",
        }
        assert (await ask(plain, "getHealth"))["result"]["latestLedger"] == 300  # type: ignore[index]
    finally:
        app.reader.close()
        plain.reader.close()
