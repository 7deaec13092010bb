"""A subscription survives the loss of the node serving it: two real ``ingestion api`` processes
read the same PostgreSQL; the one serving a subscriber is SIGKILLed while commits go on, and the
subscriber resumes from its last cursor on the other, with nothing lost or repeated."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from typing import Any

import httpx
import orjson
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from ingestion.testing.launch import stop_process
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.wait import child_env
from tests.support.api_stream import Committer, event, event_id, projecting, subscribe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_process(pg: LocalPostgres, job: str, port: int) -> subprocess.Popen[bytes]:
    env = {**child_env(), "INGESTION_SINK_URL": pg.url, "INGESTION_OBSERVE_LISTEN_HOST": "127.0.0.1"}
    command = [sys.executable, "-m", "ingestion", "api", "--job", job, "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def answering(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "getNetwork"}
            return (await http.post(f"http://127.0.0.1:{port}/", json=body)).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow  # 8 to 12 s: two processes started, 49 commits paced 20 ms apart
async def test_a_subscriber_resumes_on_another_node_from_its_last_cursor_after_a_sigkill(
    pg: LocalPostgres,
) -> None:
    job = "stream-failover"
    committer = Committer(pg.url, job)
    await committer.commit([event(n) for n in range(2, 12)])
    ports = [free_port(), free_port()]
    nodes = [api_process(pg, job, port) for port in ports]
    got: list[str] = []
    last = 60
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(projecting, pg.url, job)
            for port in ports:
                for _ in range(300):  # 30 s at most
                    if await answering(port):
                        break
                    await trio.sleep(0.1)
                else:
                    raise AssertionError(f"ingestion api on {port} never answered")

            async def commit_on() -> None:  # a ledger every 20 ms while the subscriber moves
                for n in range(12, last + 1):
                    await committer.commit([event(n)])
                    await trio.sleep(0.02)

            cursor = ""
            killed: list[int] = []

            async def follow(port: int, params: dict[str, Any], until: int, kill_at: int = 0) -> None:
                nonlocal cursor
                async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
                    await subscribe(ws, params)
                    while len(got) < until:
                        if kill_at and len(got) >= kill_at and not killed:
                            nodes[0].send_signal(signal.SIGKILL)  # the node serving it, mid-stream
                            killed.append(len(got))
                        message = orjson.loads(await ws.get_message())
                        got.extend(e["id"] for e in message["params"]["events"])
                        cursor = message["params"]["cursor"]

            nursery.start_soon(commit_on)
            try:
                with trio.fail_after(30):
                    await follow(ports[0], {"startLedger": 2}, 10**6, kill_at=10 + 15)  # history, live
            except ConnectionClosed:
                assert killed, "the connection broke before the kill"
            resumed_at = len(got)
            with trio.fail_after(30):
                await follow(ports[1], {"cursor": cursor}, last - 1)  # ledgers 2..last
            nursery.cancel_scope.cancel()
    finally:
        for node in nodes:
            stop_process(node)
        committer.close()
    assert got == [event_id(n) for n in range(2, last + 1)], f"resumed after {resumed_at} events"
    assert 25 <= resumed_at < last - 1
