"""Subscriptions over a real WebSocket (trio-websocket's client) to the streams served by hypercorn
on loopback, against a real PostgreSQL whose rows the real sink commits: history then live events
without gap or duplicate, with commits racing the seam; bad input answered with error frames; the
subscriber limit."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from trio_websocket import ConnectionClosed, open_websocket_url, wrap_client_stream

from ingestion.api import store
from ingestion.api.stream_reads import HistoryPage
from ingestion.api.streaming import StreamCollector, Streams
from ingestion.api.subscription import Limits, ReadHistory
from ingestion.postgres.connection import connect
from ingestion.rpc.protocol import Cursor, EventFilter
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.wait import wait_until
from tests.support.api_stream import (
    MINT,
    Committer,
    event,
    event_id,
    ids,
    notifications,
    projected,
    projecting,
    served,
    subscribe,
)


class RacingStreams(Streams):
    """Commits a live batch while each of the first two history reads is in flight: after the
    first read's snapshot (its rows come again in the next read: not to be sent twice) and after
    the exhausted read's (only the live feed has them: not to be lost)."""

    committer: Committer
    batches: list[list[Any]]

    async def _history(self, read: ReadHistory, filters: tuple[EventFilter, ...]) -> HistoryPage:
        page = await super()._history(read, filters)
        if (
            self.batches
            and (read.generation, len(self.batches)) in ((0, 2), (0, 1))
            and (len(self.batches) == 2 or page.exhausted)
        ):
            await self.committer.commit(self.batches.pop(0))
            last = self.committer.cursor
            await wait_until(lambda: self._published(last), 5, what="the feed published the racing commit")
        return page

    def _published(self, last: str | None) -> bool:
        return bool(self.seen and last and Cursor.parse(self.seen[-1]).ledger == Cursor.parse(last).ledger)

    seen: list[str]


async def test_a_subscriber_gets_history_then_live_events_once_each_across_commits_racing_the_seam(
    pg: LocalPostgres,
) -> None:
    job = "stream-seam"
    committer = Committer(pg.url, job)
    await committer.commit([event(n) for n in range(2, 12)])  # history: ledgers 2..11
    RacingStreams.committer = committer
    RacingStreams.batches = [[event(n) for n in range(12, 15)], [event(n) for n in range(15, 18)]]
    RacingStreams.seen = []
    async with served(pg.url, job, Limits(page=4), kind=RacingStreams) as (base, streams):
        streams.feed.subscribe(lambda rows: RacingStreams.seen.extend(r.id for r in rows))
        async with open_websocket_url(base.replace("http", "ws") + "/ws") as ws:
            await subscribe(ws, {"startLedger": 3, "xdrFormat": "base64"})
            got: list[dict[str, Any]] = []
            await notifications(ws, 15, got)  # ledgers 3..17
            assert not RacingStreams.batches  # both races ran
            await committer.commit([event(n) for n in range(18, 20)])
            cursor = await notifications(ws, 17, got)
    committer.close()
    assert ids(got) == [event_id(n) for n in range(3, 20)]
    assert cursor == event_id(19)


def scrape(streams: Streams) -> str:
    registry = CollectorRegistry()
    registry.register(StreamCollector(streams.stats))
    return generate_latest(registry).decode()


async def test_events_committed_but_not_projected_when_a_subscription_starts_come_once_in_order(
    pg: LocalPostgres,
) -> None:
    """The feed reads commits before the projector has projected them; a subscription that
    starts then must still get them as history (it waits until the store holds the feed's
    position), not lose them between the two halves."""
    job = "stream-unprojected"
    committer = Committer(pg.url, job)
    await committer.commit([event(n) for n in range(2, 6)])  # not projected: no projector yet
    with connect(pg.url, 5) as conn:  # the store there and empty: a history read answers nothing
        for statement in store.create_statements("ingestion"):
            conn.execute(statement)  # type: ignore[arg-type]
    async with served(pg.url, job, projector=False) as (base, streams), trio.open_nursery() as nursery:
        assert streams.feed.position == event_id(5)
        async with open_websocket_url(base.replace("http", "ws") + "/ws") as ws:
            await subscribe(ws, {"startLedger": 2})
            await wait_until(lambda: streams.stats.subscribers == 1, 5, what="subscribed")
            nursery.start_soon(projecting, pg.url, job)  # the projector catches up only now
            await committer.commit([event(6), event(7)])
            got: list[dict[str, Any]] = []
            await notifications(ws, 6, got)
        nursery.cancel_scope.cancel()
    committer.close()
    assert ids(got) == [event_id(n) for n in range(2, 8)]


async def answer(ws: Any, frame: str | bytes) -> dict[str, Any]:
    await ws.send_message(frame)
    with trio.fail_after(5):
        return dict(orjson.loads(await ws.get_message()))


@pytest.mark.parametrize(
    ("frame", "code", "says"),
    [
        ("{not json", -32700, "parse error"),
        ("[1, 2]", -32600, "invalid request"),
        ('{"jsonrpc": "2.0", "id": 3, "method": "getEvents", "params": {}}', -32601, "method not found"),
        (
            '{"jsonrpc": "2.0", "id": 4, "method": "subscribeEvents", "params": {"cursor": "12-x"}}',
            -32602,
            "invalid event id 12-x",
        ),
        (
            '{"jsonrpc": "2.0", "id": 5, "method": "subscribeEvents", "params": {}}',
            -32602,
            "startLedger must be positive",
        ),
        (
            '{"jsonrpc": "2.0", "id": 6, "method": "subscribeEvents", "params": {"startLedger": 2, '
            '"filters": [{"type": "nope"}]}}',
            -32602,
            "filter 1 invalid: filter type invalid",
        ),
        (
            '{"jsonrpc": "2.0", "id": 7, "method": "subscribeEvents", "params": {"startLedger": 2, '
            '"xdrFormat": "hex"}}',
            -32602,
            "expected base64, json",
        ),
        ('{"jsonrpc": "2.0", "id": 8, "method": "unsubscribeEvents", "params": {}}', -32602, "subscription"),
        (
            '{"jsonrpc": "2.0", "id": 10, "method": "subscribeEvents", "params": {"startLedger": 1}}',
            -32600,
            "startLedger must be within the ledger range: 2 - ",
        ),
    ],
)
async def test_bad_frames_get_json_rpc_error_frames_and_the_socket_serves_on(
    pg: LocalPostgres, frame: str, code: int, says: str
) -> None:
    job = f"stream-bad-{abs(hash(frame))}"
    committer = Committer(pg.url, job)
    await committer.commit([event(2)])
    async with (
        served(pg.url, job) as (base, streams),
        open_websocket_url(base.replace("http", "ws") + "/ws") as ws,
    ):
        await projected(streams, event_id(2))
        reply = await answer(ws, frame)
        assert reply["error"]["code"] == code and says in reply["error"]["message"], reply
        assert reply["id"] == orjson.loads(frame)["id"] if frame.startswith('{"') else reply["id"] is None
        await subscribe(ws, {"startLedger": 2}, rid=9)  # the connection still serves
        got: list[dict[str, Any]] = []
        await notifications(ws, 1, got)
        assert ids(got) == [event_id(2)]
    committer.close()


async def test_subscriptions_over_the_node_limit_are_refused_and_a_freed_slot_serves_again(
    pg: LocalPostgres,
) -> None:
    job = "stream-limit"
    committer = Committer(pg.url, job)
    await committer.commit([event(2), event(3, verb=MINT)])
    async with served(pg.url, job, max_subscribers=2) as (base, streams):
        url = base.replace("http", "ws") + "/ws"
        async with open_websocket_url(url) as one, open_websocket_url(url) as two:
            first = await subscribe(one, {"startLedger": 2})
            await subscribe(one, {"startLedger": 2}, rid=2)
            refused = await answer(two, orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": "subscribeEvents",
                                                      "params": {"startLedger": 2}}).decode())  # fmt: skip
            assert refused["error"]["code"] == -32005
            assert "serves 2 subscriptions, its limit (api.max_subscribers)" in refused["error"]["message"]
            assert streams.stats.refused == 1
            assert "ingestion_api_subscriptions_refused_total 1.0" in scrape(streams)
            assert "ingestion_api_subscribers 2.0" in scrape(streams)
            await one.send_message(orjson.dumps({"jsonrpc": "2.0", "id": 4, "method": "unsubscribeEvents",
                                                 "params": {"subscription": first}}).decode())  # fmt: skip
            await wait_until(lambda: streams.stats.subscribers == 1, 5, what="the unsubscribed slot freed")
            only_mints = {"startLedger": 2, "filters": [{"topics": [[MINT]]}], "xdrFormat": "json"}
            await subscribe(two, only_mints, rid=5)
            got: list[dict[str, Any]] = []
            await notifications(two, 1, got)
            assert ids(got) == [event_id(3)]
            (mint,) = [e for n in got for e in n["events"]]
            assert mint["topicJson"] == [{"symbol": "mint"}] and "topic" not in mint
    committer.close()


async def test_a_client_that_stops_reading_is_cut_with_the_close_reason_after_what_was_queued(
    pg: LocalPostgres,
) -> None:
    job = "stream-slow"
    committer = Committer(pg.url, job)
    await committer.commit([event(2)])
    limits = Limits(page=10, outbox=40, max_lag=30.0)
    async with served(pg.url, job, limits) as (base, streams), trio.open_nursery() as nursery:
        host, port = base.removeprefix("http://").split(":")
        sock = trio.socket.socket()
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)  # a small window
        await sock.connect((host, int(port)))
        ws = await wrap_client_stream(nursery, trio.SocketStream(sock), host, "/ws", message_queue_size=1)
        await subscribe(ws, {"startLedger": 2})
        received: list[str] = []
        with trio.fail_after(10):  # until the seam: history done, the subscription live
            while (message := orjson.loads(await ws.get_message()))["params"]["events"]:
                received += [e["id"] for e in message["params"]["events"]]
        ledger = 3
        while not streams.stats.cut["outbox"] and ledger < 2000:  # the client reads nothing meanwhile
            await committer.commit([event(n, pad=2000) for n in range(ledger, ledger + 10)])
            ledger += 10
            last = event_id(ledger - 1)
            await wait_until(lambda: streams.feed.position >= last, 10, what="projected")  # noqa: B023
        assert streams.stats.cut["outbox"] == 1, "never cut"
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(30):
            while True:
                message = orjson.loads(await ws.get_message())
                received += [e["id"] for e in message.get("params", {}).get("events", [])]
        assert closed.value.reason.code == 1008
        assert re.fullmatch(
            r"slow client: \d+ events waiting, over the limit of 40; resume from your last cursor",
            closed.value.reason.reason or "",
        ), closed.value.reason
        assert received == [event_id(n) for n in range(2, 2 + len(received))]  # in order, none lost before
        assert len(received) < ledger - 2  # it was cut: not everything came
        await wait_until(lambda: streams.stats.subscribers == 0, 5, what="the cut subscription gone")
        metrics = scrape(streams)
        assert 'ingestion_api_subscribers_cut_total{reason="outbox"} 1.0' in metrics
        assert "ingestion_api_subscribers 0.0" in metrics
        sent = re.search(r"^ingestion_api_notifications_sent_total (\S+)$", metrics, re.M)
        assert sent and float(sent.group(1)) == streams.stats.notifications > 0
        nursery.cancel_scope.cancel()
    committer.close()


async def test_the_sse_twin_streams_history_then_live_with_each_cursor_as_the_event_id(
    pg: LocalPostgres,
) -> None:
    job = "stream-sse"
    committer = Committer(pg.url, job)
    await committer.commit([event(2), event(3, verb=MINT)])
    async with served(pg.url, job) as (base, streams), httpx.AsyncClient(timeout=10) as http:
        await projected(streams, event_id(3))
        bad = await http.get(f"{base}/events", params={"startLedger": "2", "xdrFormat": "hex"})
        assert bad.status_code == 400 and "expected base64, json" in bad.json()["error"]["message"]
        got: list[tuple[str, list[str]]] = []

        async def live() -> None:  # after the seam's notification went out
            await wait_until(lambda: streams.stats.notifications >= 2, 10, what="the seam sent")
            await committer.commit([event(4)])

        with trio.fail_after(10):
            async with (
                trio.open_nursery() as nursery,
                http.stream("GET", f"{base}/events", params={"startLedger": "2"}) as response,
            ):
                nursery.start_soon(live)
                assert response.headers["content-type"] == "text/event-stream"
                buffered = b""
                async for chunk in response.aiter_raw():  # (aiter_lines holds a line back)
                    buffered += chunk
                    *whole, buffered = buffered.split(b"\n\n")
                    for block in whole:
                        fields = dict(line.split(": ", 1) for line in block.decode().split("\n"))
                        params = orjson.loads(fields["data"])["params"]
                        assert fields["event"] == "events" and fields["id"] == params["cursor"]
                        got.append((fields["id"], [e["id"] for e in params["events"]]))
                    if got and got[-1][1] == [event_id(4)]:
                        break
    committer.close()
    assert [i for _, ids_ in got for i in ids_] == [event_id(2), event_id(3), event_id(4)]


@pytest.mark.slow
async def test_quiet_subscribers_over_ws_and_sse_are_still_served_after_twelve_seconds(
    pg: LocalPostgres,
) -> None:
    """A subscriber sends nothing after its request. The API's server once bounded each read from a
    client by 10 s, so every subscription was closed 10 s after it began (100 subscribers received
    nothing after their 10th second: found by ``benchmarks.api_streaming`` at 200 commits)."""
    job = "stream-quiet"
    committer = Committer(pg.url, job)
    await committer.commit([event(2)])
    async with served(pg.url, job) as (base, streams), httpx.AsyncClient(timeout=30) as http:
        await projected(streams, event_id(2))
        ws_got: list[dict[str, Any]] = []
        sse_ids: list[str] = []

        async def over_sse() -> None:
            async with http.stream("GET", f"{base}/events", params={"startLedger": "2"}) as response:
                buffered = b""
                async for chunk in response.aiter_raw():
                    buffered += chunk
                    *whole, buffered = buffered.split(b"\n\n")
                    for block in whole:
                        lines = [line for line in block.decode().split("\n") if ": " in line]
                        fields = dict(line.split(": ", 1) for line in lines)
                        if fields.get("event") == "events":
                            sse_ids.extend(e["id"] for e in orjson.loads(fields["data"])["params"]["events"])
                    if event_id(3) in sse_ids:
                        return

        with trio.fail_after(25):
            async with (
                open_websocket_url(base.replace("http://", "ws://") + "/ws") as ws,
                trio.open_nursery() as nursery,
            ):
                await subscribe(ws, {"startLedger": 2})
                nursery.start_soon(over_sse)
                await notifications(ws, 1, ws_got)
                await wait_until(lambda: sse_ids == [event_id(2)], 10, what="the SSE client got history")
                await trio.sleep(12)  # quiet, both: longer than the old 10 s bound
                await committer.commit([event(3)])
                await notifications(ws, 2, ws_got)
    committer.close()
    assert ids(ws_got) == [event_id(2), event_id(3)]
    assert sse_ids == [event_id(2), event_id(3)]
