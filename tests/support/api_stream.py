"""The streaming half's test kit: RPC-shaped events committed through the real sink, the streams
served by hypercorn on loopback, and a subscriber that reads notifications over a real WebSocket."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio
from hypercorn.trio import serve
from stellar_sdk import scval
from trio_websocket import WebSocketConnection

from actors.lease_store import Committed
from actors.source import Record, TermContext
from ingestion.api.feed import LiveFeed
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import server_config
from ingestion.api.stream_reads import StreamReads
from ingestion.api.streaming import Streams, app
from ingestion.api.subscription import Limits
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor, RpcError

CONTRACTS = (
    "CAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABSC4",
    "CAAQCAIBAEAQCAIBAEAQCAIBAEAQCAIBAEAQCAIBAEAQCAIBAEAQC526",
)
TRANSFER = scval.to_symbol("transfer").to_xdr()
MINT = scval.to_symbol("mint").to_xdr()
VALUE = scval.to_int128(7).to_xdr()


def event_id(ledger: int, i: int = 0) -> str:
    return str(Cursor(ledger, 1, 0, i))


def event(ledger: int, i: int = 0, verb: str = TRANSFER, contract: int = 0, pad: int = 0) -> Record:
    """An RPC ``EventInfo`` record as the node commits it (``pad``: extra bytes in the value)."""
    eid = event_id(ledger, i)
    body: dict[str, Any] = {
        "type": "contract", "ledger": ledger, "ledgerClosedAt": "2026-01-01T00:00:00Z",
        "contractId": CONTRACTS[contract], "id": eid, "operationIndex": 0, "transactionIndex": 1,
        "txHash": "00" * 32, "inSuccessfulContractCall": True, "topic": [verb], "value": VALUE,
    }  # fmt: skip
    if pad:
        body["pad"] = "x" * pad
    return Record(eid, orjson.dumps(body).decode())


class Committer:
    """A job's leader stand-in: commits batches through the real sink, each continuing the last
    and scanned through its last event's ledger (the view is complete through it)."""

    def __init__(self, url: str, job: str) -> None:
        self.sink = PostgresSink(url, job, call_timeout=5)
        self.cursor: str | None = None
        self.opened = False

    async def commit(self, records: list[Record]) -> None:
        if not self.opened:
            assert await self.sink.open_term("a", 1)
            self.opened = True
        through = str(Cursor.through(Cursor.parse(records[-1].paging_token).ledger))  # as the RPC source
        done = await self.sink.commit("a", 1, self.cursor, records, through)
        assert isinstance(done, Committed), done
        self.cursor = through

    def close(self) -> None:
        self.sink.close()


@asynccontextmanager
async def served(
    url: str,
    job: str,
    limits: Limits | None = None,
    max_subscribers: int = 100,
    kind: type[Streams] = Streams,
    projector: bool = True,
) -> AsyncIterator[tuple[str, Streams]]:
    """The streams of view ``job`` served on a loopback port, its projector running:
    (``http://127.0.0.1:PORT``, streams); ``kind``: a subclass of :class:`Streams` (a test's hooks);
    ``projector`` False: the test runs it (or not) itself."""
    reader = StoreReader(url, "ingestion", job)
    reads = StreamReads(reader)
    feed = LiveFeed(reads, url)
    streams = kind(feed, reads, limits or Limits(), max_subscribers)
    config = server_config("127.0.0.1", 0)  # the API's own settings: its timeouts are under test
    config.errorlog = "-"
    async with trio.open_nursery() as nursery:
        if projector:
            nursery.start_soon(projecting, url, job)
        await nursery.start(feed.run)
        binds = await nursery.start(functools.partial(serve, app(streams), config, mode="asgi"))  # type: ignore[arg-type]
        try:
            yield str(binds[0]), streams
        finally:
            nursery.cancel_scope.cancel()
            reader.close()


async def projected(streams: Streams, event_id: str) -> None:
    """Until the store holds ``event_id`` (the projector has projected it)."""
    with trio.fail_after(10):
        while True:
            try:
                if await streams.reads.holds(event_id):
                    return
            except RpcError:
                pass  # the store's tables are not there before the projector's first step
            await trio.sleep(0.01)


async def projecting(url: str, view: str) -> None:
    """The view's projector, run after run (one term: no election in these tests)."""
    action = projector_action(url, "ingestion", view, run_seconds=30)
    run = 0
    while True:
        run += 1
        await action(run, TermContext("p", 1))


async def subscribe(ws: WebSocketConnection, params: dict[str, Any], rid: int = 1) -> str:
    """Send ``subscribeEvents`` and return the subscription id."""
    await ws.send_message(orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "subscribeEvents",
                                        "params": params}).decode())  # fmt: skip
    with trio.fail_after(5):
        answer = orjson.loads(await ws.get_message())
        while answer.get("method") == "events":  # another subscription's, on the same socket
            answer = orjson.loads(await ws.get_message())
    assert "result" in answer, answer
    return str(answer["result"]["subscription"])


async def notifications(ws: WebSocketConnection, until: int, got: list[dict[str, Any]]) -> str:
    """Read notifications into ``got`` (their params) until ``until`` events came in all; the
    last cursor."""
    cursor = ""
    with trio.fail_after(15):
        while sum(len(n["events"]) for n in got) < until:
            message = orjson.loads(await ws.get_message())
            assert message.get("method") == "events", message
            got.append(message["params"])
            cursor = message["params"]["cursor"]
    return cursor


def ids(got: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for n in got for e in n["events"]]
