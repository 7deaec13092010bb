"""The events API over real HTTP: stellar-sdk's ``SorobanServer`` as the client, stellar-rpc's
errors for bad input (never a traceback or a 500), bounded bodies, the metrics, and PostgreSQL
stopped and started under it."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import structlog
import trio
from stellar_sdk import SorobanServer
from stellar_sdk.soroban_rpc import EventFilter as SdkFilter

from ingestion.api.core import ApiRules
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.rpc.protocol import Caps, Cursor
from ingestion.testing.api_events import CONTRACTS
from ingestion.testing.local_postgres import LocalPostgres
from tests.api.conftest import EVENTS

LOG = structlog.get_logger()


@asynccontextmanager
async def served(app: ApiApp) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_api, app, "127.0.0.1", 0, LOG)
        yield f"http://127.0.0.1:{port}/"
        nursery.cancel_scope.cancel()


async def post(url: str, body: bytes | dict[str, Any]) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, content=content, headers={"content-type": "application/json"})


def call(method: str, params: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


async def test_stellar_sdk_pages_through_the_whole_window(pg: LocalPostgres, view: str) -> None:
    app = ApiApp(StoreReader(pg.url, "ingestion", view))
    async with served(app) as url:

        def page_all() -> list[str]:
            server = SorobanServer(url)
            got = server.get_events(1, filters=[SdkFilter(contract_ids=[CONTRACTS[0]])], limit=50)
            ids = [e.id for e in got.events]
            while len(got.events) == 50:
                got = server.get_events(
                    filters=[SdkFilter(contract_ids=[CONTRACTS[0]])], cursor=got.cursor, limit=50
                )
                ids += [e.id for e in got.events]
            assert (
                got.cursor == str(Cursor.through(300)) and got.latest_ledger == 300 and got.oldest_ledger == 1
            )
            health = server.get_health()
            window = (health.oldest_ledger, health.latest_ledger, health.ledger_retention_window)
            assert window == (1, 300, 300)
            assert server.get_latest_ledger().sequence == 300
            assert server.get_network().passphrase == ApiRules().passphrase
            return ids

        ids = await trio.to_thread.run_sync(page_all)
    assert ids == [e.id for e in EVENTS if e.contract_id == CONTRACTS[0]]
    assert app.metrics.requests[("getEvents", "ok")] >= 2


BAD = [
    (b"{not json", -32700, "parse error"),
    (b"[1, 2]", -32600, "invalid request"),
    (orjson.dumps({"jsonrpc": "1.0", "id": 1, "method": "getHealth"}), -32600, "invalid request"),
    (orjson.dumps(call("getTransactions")), -32601, "method not found"),
    (orjson.dumps(call("getEvents", {"startLedger": 301})), -32600,
     "startLedger must be within the ledger range: 1 - 300"),
    (orjson.dumps(call("getEvents", {"pagination": {"cursor": "nope"}})), -32602, "invalid event id nope"),
    (orjson.dumps(call("getEvents", {"startLedger": 5, "pagination": {"cursor": str(Cursor(9))}})), -32602,
     "ledger ranges and cursor cannot both be set"),
    (orjson.dumps(call("getEvents", {"startLedger": 5, "pagination": {"limit": 10001}})), -32602,
     "limit must not exceed 10000"),
    (orjson.dumps(call("getEvents", {"startLedger": 5, "filters": [{}] * 6})), -32602,
     "maximum 5 filters per request"),
    (orjson.dumps(call("getEvents", {"startLedger": 5, "filters": [{"topics": [["**", "*"]]}]})), -32602,
     "filter 1 invalid: topic 1 invalid: segment 1 invalid: "
     "wildcard '**' is only allowed as the last segment"),
    (orjson.dumps(call("getEvents", {"startLedger": 5, "xdrFormat": "xml"})), -32602,
     "got 'xml': expected base64, json for optional 'xdrFormat'"),
]  # fmt: skip


async def test_bad_input_gets_stellar_rpcs_errors_never_a_500(pg: LocalPostgres, view: str) -> None:
    app = ApiApp(StoreReader(pg.url, "ingestion", view), body_limit=4096)
    async with served(app) as url:
        for body, code, message in BAD:
            answer = await post(url, body)
            assert answer.status_code == 200, body
            error = answer.json()["error"]
            assert (error["code"], error["message"].split(":")[0]) == (code, message.split(":")[0]), body
            if code != -32700:
                assert error["message"] == message
        huge = await post(
            url, call("getEvents", {"startLedger": 5, "filters": [{"contractIds": ["C" * 5000]}]})
        )
        assert huge.status_code == 413 and huge.json()["error"]["code"] == -32600
        async with httpx.AsyncClient() as client:
            assert (await client.get(url)).status_code == 405
            assert (await client.get(url + "nothing")).status_code == 404
    assert app.metrics.requests[("getEvents", "-32602")] >= 6
    assert app.metrics.requests[("", "too-large")] == 1


async def test_caps_can_be_raised_above_stellar_rpcs(pg: LocalPostgres, view: str) -> None:
    rules = ApiRules(Caps(filters=8, contract_ids=10, topics=5))
    app = ApiApp(StoreReader(pg.url, "ingestion", view), rules)
    filters = [{"contractIds": [CONTRACTS[i % 3]] * 10} for i in range(8)]
    async with served(app) as url:
        answer = (
            await post(
                url, call("getEvents", {"startLedger": 1, "filters": filters, "pagination": {"limit": 5}})
            )
        ).json()
    assert [e["id"] for e in answer["result"]["events"]] == [e.id for e in EVENTS if e.contract_id][:5]


async def test_json_format_sends_sep51_topics_and_value(pg: LocalPostgres, view: str) -> None:
    from stellar_sdk import xdr

    app = ApiApp(StoreReader(pg.url, "ingestion", view))
    async with served(app) as url:
        params = {"startLedger": 10, "xdrFormat": "json", "pagination": {"limit": 3}}
        answer = (await post(url, call("getEvents", params))).json()["result"]
    for got in answer["events"]:
        want = orjson.loads(next(e.text for e in EVENTS if e.id == got["id"]))
        assert "topic" not in got and "value" not in got
        assert got["topicJson"] == [xdr.SCVal.from_xdr(t).to_json_dict() for t in want["topic"]]
        assert got["valueJson"] == xdr.SCVal.from_xdr(want["value"]).to_json_dict()
        assert {k: v for k, v in got.items() if not k.endswith("Json")} == {
            k: v for k, v in want.items() if k not in ("topic", "value")
        }


async def test_postgres_down_is_a_clear_error_and_the_api_answers_within_a_second_of_its_return() -> None:
    own = LocalPostgres().start()
    try:
        await _outage(own)
    finally:
        own.cleanup()


async def _outage(own: LocalPostgres) -> None:
    from tests.api.conftest import build_view

    await build_view(own.url, "down")
    app = ApiApp(StoreReader(own.url, "ingestion", "down", statement_timeout=2.0, connect_timeout=1.0))
    async with served(app) as url:
        ask = functools.partial(post, url, call("getEvents", {"startLedger": 1, "pagination": {"limit": 1}}))

        async def at_once(n: int) -> list[dict[str, Any]]:
            answers: list[dict[str, Any]] = []

            async def one() -> None:
                answers.append((await ask()).json())

            async with trio.open_nursery() as nursery:
                for _ in range(n):
                    nursery.start_soon(one)
            return answers

        assert all("result" in a for a in await at_once(4))  # (the reader keeps several connections)
        await trio.to_thread.run_sync(own.stop)
        error = (await ask()).json()["error"]
        assert error["code"] == -32603 and error["message"].startswith("events store unavailable: ")
        await trio.to_thread.run_sync(own.start)
        back = trio.current_time()
        first = await ask()
        took = trio.current_time() - back
        assert "result" in first.json() and took < 1.0, f"answered {took:.2f} s after PostgreSQL's return"
        # every other kept connection is stale too: none of them may fail a request
        answers = await at_once(4)
        assert all("result" in a for a in answers), answers
