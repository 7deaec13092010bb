"""The events API reading a real PostgreSQL streaming replica (``api.read_url``): it answers what
the replica holds and never claims more than the replica has applied, whatever the primary has
committed meanwhile."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import structlog
import trio

from actors.lease_store import Committed
from actors.source import TermContext
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import serve_api
from ingestion.api.service import build_app
from ingestion.config import Settings
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.testing.api_events import make_events, records
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.pg_replica import StreamingReplica

VIEW = "apireplica"
EVENTS = make_events(1, 200)


def _ledger(event_id: str) -> int:
    return Cursor.parse(event_id).ledger


async def _commit_and_project(url: str, sink: PostgresSink, previous: str | None, through: int) -> str:
    """Commit the events of the ledgers after ``previous`` through ``through`` as the live job's
    next batch, then project them (one run of the view's projector on the primary)."""
    after = Cursor.parse(previous).ledger if previous else 0
    batch = records([e for e in EVENTS if after < _ledger(e.id) <= through])
    cursor = str(Cursor.through(through))
    assert isinstance(await sink.commit("a", 1, previous, batch, cursor), Committed)
    await projector_action(url, "ingestion", VIEW, run_seconds=0)(1, TermContext("p", 1))
    return cursor


async def _rpc(client: httpx.AsyncClient, url: str, method: str, params: Any = None) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    response = await client.post(
        url, content=orjson.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    return dict(orjson.loads(response.content))


async def test_the_api_on_a_replica_never_claims_more_than_the_replica_applied(
    pg: LocalPostgres, replica: StreamingReplica
) -> None:
    sink = PostgresSink(pg.url, VIEW, call_timeout=5)
    await sink.open_term("a", 1)
    cursor = await _commit_and_project(pg.url, sink, None, 100)
    await trio.to_thread.run_sync(replica.wait_replayed)
    settings = Settings.from_mapping(
        {"sink": {"url": pg.url}, "api": {"job": VIEW, "port": 1, "read_url": replica.url}}
    )
    app = build_app(settings, structlog.get_logger())
    assert app.reader.url == replica.url
    held = [e.id for e in EVENTS if _ledger(e.id) <= 100]
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=10) as client:
        port = await nursery.start(serve_api, app, "127.0.0.1", 0, structlog.get_logger())
        url = f"http://127.0.0.1:{port}/"
        latest = await _rpc(client, url, "getLatestLedger")
        assert latest["result"]["sequence"] == 100
        page = await _rpc(client, url, "getEvents", {"startLedger": 1, "pagination": {"limit": 1000}})
        assert [e["id"] for e in page["result"]["events"]] == held

        # the replica stops applying; the primary commits and projects ledgers 101-200
        await trio.to_thread.run_sync(replica.pause_replay)
        await _commit_and_project(pg.url, sink, cursor, 200)
        await trio.to_thread.run_sync(replica.wait_received)  # its WAL is on the replica, unapplied
        primary = StoreReader(pg.url, "ingestion", VIEW)
        window = await primary.window()
        primary.close()
        assert window is not None and window.latest == 200  # what the primary would advertise

        health = await _rpc(client, url, "getHealth")
        assert (health["result"]["oldestLedger"], health["result"]["latestLedger"]) == (1, 100)
        assert (await _rpc(client, url, "getLatestLedger"))["result"]["sequence"] == 100
        page = await _rpc(client, url, "getEvents", {"startLedger": 1, "pagination": {"limit": 1000}})
        assert [e["id"] for e in page["result"]["events"]] == held
        assert page["result"]["latestLedger"] == 100
        assert Cursor.parse(page["result"]["cursor"]) == Cursor.through(100)  # scanned through 100 only
        beyond = await _rpc(client, url, "getEvents", {"startLedger": 150})
        assert beyond["error"] == {
            "code": -32600,
            "message": "startLedger must be within the ledger range: 1 - 100",
        }

        # replay resumes: the API serves the rest as soon as the replica has applied it
        await trio.to_thread.run_sync(replica.resume_replay)
        await trio.to_thread.run_sync(replica.wait_replayed)
        assert (await _rpc(client, url, "getLatestLedger"))["result"]["sequence"] == 200
        page = await _rpc(client, url, "getEvents", {"startLedger": 150, "pagination": {"limit": 1000}})
        assert [e["id"] for e in page["result"]["events"]] == [e.id for e in EVENTS if _ledger(e.id) >= 150]
        nursery.cancel_scope.cancel()
    sink.close()
