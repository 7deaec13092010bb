"""The events API a node serves, on that node's console (issue 48, "Operable"): a real API app
answering real requests over a real PostgreSQL view, its own metrics shown on the console's
overview, its state JSON and its live feed; no Redis command for it."""

from __future__ import annotations

import json

import redis
import trio

from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from tests.api.conftest import build_view
from tests.support.console_http import console


def call(method: str, params: object = None) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


async def test_the_overview_shows_the_api_this_node_serves(
    pg: LocalPostgres, redis_server: LocalRedis
) -> None:
    await build_view(pg.url, "conapi")
    app = ApiApp(StoreReader(pg.url, "ingestion", "conapi"))
    try:
        for _ in range(3):
            assert b'"result"' in await app.answer(
                call("getEvents", {"startLedger": 10, "pagination": {"limit": 5}})
            )
        assert b'"result"' in await app.answer(call("getHealth"))
        assert b"-32602" in await app.answer(call("getEvents", {"startLedger": "x"}))
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        async with console(client, {}, api=app.console_view) as (_reader, http):
            page = (await http.get("/")).text
            assert "Events API on this node" in page and '<td data-col="job">conapi</td>' in page
            assert '<td data-col="oldest">1</td>' in page and '<td data-col="latest">300</td>' in page
            assert '<td data-col="subscribers">streaming off</td>' in page
            ok = '<tr data-method="getEvents" data-outcome="ok"><td>getEvents</td><td>ok</td>'
            assert ok + '<td data-col="count">3</td>' in page
            assert '<tr data-method="getEvents" data-outcome="-32602">' in page
            assert '<tr data-method="getHealth"><td>getHealth</td><td>1</td><td data-col="p50">≤ ' in page
            api = (await http.get("/console/state")).json()["api"]
            assert api["latency"]["getEvents"]["count"] == 4 and api["latency"]["getEvents"]["p99_ms"] > 0
            await app.answer(call("getLatestLedger"))
            async with http.stream("GET", "/console/events") as feed:  # the live page redraws it
                with trio.fail_after(5):
                    async for line in feed.aiter_lines():
                        if line.startswith("data: ") and '"state"' not in line and "api_html" in line:
                            doc = json.loads(line[len("data: ") :])
                            assert 'data-method="getLatestLedger"' in doc["api_html"]
                            assert doc["api"]["requests"][-1]["method"] == "getLatestLedger"
                            break
    finally:
        app.reader.close()
