"""The status WebSocket, with a real trio-websocket client over loopback, against in-process nodes
on a real redis-server."""

from __future__ import annotations

import json
from typing import Any

import structlog
import trio
import trio.lowlevel
from trio_websocket import open_websocket_url

from actors.observe import NodeObserver
from actors.source import SyntheticSource
from ingestion.serve.status import QUEUE_SIZE, serve_status
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import Recorder, start_node

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)
LOG = structlog.get_logger()


async def next_message(ws: Any, kind: str, within: float = 5.0, **match: Any) -> dict[str, Any]:
    """The next message of type ``kind`` whose fields include ``match`` (bounded wait)."""
    with trio.fail_after(within):
        while True:
            msg = json.loads(await ws.get_message())
            if msg["type"] == kind and all(msg.get(k) == v for k, v in match.items()):
                return msg


async def test_status_is_pushed_on_connect_and_every_election_event_as_it_happens(
    redis_server: LocalRedis, job: str
) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", LIVE)
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE)
        await rec.wait_for("became-leader")
        await rec.wait_for("standby")
        leader, standby = (a, b) if rec.of("became-leader")[0].node == "a" else (b, a)
        port_l = await nursery.start(serve_status, "127.0.0.1", 0, leader.observer, LOG)
        port_s = await nursery.start(serve_status, "127.0.0.1", 0, standby.observer, LOG)
        async with (
            open_websocket_url(f"ws://127.0.0.1:{port_l}/", connect_timeout=2) as ws_l,
            open_websocket_url(f"ws://127.0.0.1:{port_s}/", connect_timeout=2) as ws_s,
        ):
            first = json.loads(await ws_l.get_message())
            assert first["type"] == "status"
            assert first["node"] == leader.spec.node and first["role"] == "leader"
            assert first["token"] == 1 and first["job"] == job
            assert 0 < first["lease_ms_left"] <= 1500
            assert set(first) >= {
                "cursor", "events_ingested", "ingest_rate", "lag_seconds", "elections",
                "losses", "fencing_rejections", "leader", "time", "complete_through", "complete_held",
            }  # fmt: skip
            s = await next_message(ws_s, "status")
            assert (s["role"], s["leader"], s["lease_ms_left"]) == ("standby", leader.spec.node, None)

            # A later status shows progress and a rate.
            later = await next_message(ws_l, "status", within=3)
            assert later["events_ingested"] > 0 and later["cursor"] is not None
            assert later["ingest_rate"] > 0

            await leader.shutdown()
            lost = await next_message(ws_l, "event", event="lost-leadership")
            assert (lost["node"], lost["token"], lost["reason"]) == (leader.spec.node, 1, "shutdown")
            won = await next_message(ws_s, "event", event="became-leader")
            assert won["token"] == 2 and won["previous_node"] == leader.spec.node
            assert isinstance(won["takeover_ms"], int)
            after = await next_message(ws_s, "status")
            assert after["role"] == "leader" and after["elections"] == 1
        await standby.shutdown()
        nursery.cancel_scope.cancel()


async def test_a_client_too_slow_to_read_is_dropped_without_blocking_the_node() -> None:
    observer = NodeObserver("n", "j")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_status, "127.0.0.1", 0, observer, LOG)
        async with open_websocket_url(
            f"ws://127.0.0.1:{port}/", connect_timeout=2, message_queue_size=1,
            receive_buffer_size=1024,
        ) as ws:  # fmt: skip
            await ws.get_message()
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(2):  # the producer side never blocks, however much it reports
                for i in range(QUEUE_SIZE * 50):
                    observer.election_event("standby", leader="x" * 2000, token=i)
                    if i % 50 == 0:
                        await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert not observer.listeners  # the server unsubscribed when it stopped


async def test_a_stopped_job_is_node_stopped_on_the_socket_as_in_the_log() -> None:
    """The log's last line says ``node-stopped``; the socket used to say ``stopped``."""
    observer = NodeObserver("n", "j")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_status, "127.0.0.1", 0, observer, LOG)
        async with open_websocket_url(f"ws://127.0.0.1:{port}/", connect_timeout=2) as ws:
            await next_message(ws, "status")
            observer.election_event("stopped")
            msg = await next_message(ws, "event")
            assert msg["event"] == "node-stopped"
            assert (await next_message(ws, "status"))["role"] == "stopped"
        nursery.cancel_scope.cancel()


async def test_several_clients_each_get_every_event() -> None:
    observer = NodeObserver("n", "j")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_status, "127.0.0.1", 0, observer, LOG)
        url = f"ws://127.0.0.1:{port}/status"
        async with (
            open_websocket_url(url, connect_timeout=2) as one,
            open_websocket_url(url, connect_timeout=2) as two,
        ):
            await next_message(one, "status")
            await next_message(two, "status")
            observer.election_event("became-leader", token=5, takeover_ms=None, cursor="7")
            for ws in (one, two):
                msg = await next_message(ws, "event")
                assert msg["event"] == "became-leader" and msg["token"] == 5
                assert msg["cursor"] == "7" and msg["takeover_ms"] is None
                assert (await next_message(ws, "status"))["role"] == "leader"
        nursery.cancel_scope.cancel()
