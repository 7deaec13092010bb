"""The API port's lean front (ingestion/api/front.py): ``POST /`` answered in one socket write per
answer, pipelined requests in order, and every other request handed to hypercorn on the same
connection, which answers it as it always did (``/metrics``, a chunked body, 404, 405, 413)."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import structlog
import trio

from ingestion.api.front import lean_request, serve_connection
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.testing.local_postgres import LocalPostgres
from tests.api.conftest import EVENTS

PAGE = orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": "getEvents",
                     "params": {"startLedger": 1, "pagination": {"limit": 5}}})  # fmt: skip


@asynccontextmanager
async def served(app: ApiApp) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve_api, app, "127.0.0.1", 0, structlog.get_logger())
        nursery.cancel_scope.cancel()


def post(body: bytes, *headers: bytes) -> bytes:
    head = [b"POST / HTTP/1.1", b"Host: api", b"Content-Type: application/json", *headers]
    if not any(h.lower().startswith(b"transfer-encoding") for h in headers):
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def exchange(port: int, data: bytes, answers: int) -> list[tuple[int, bytes]]:
    """``data`` sent at once on one connection, then ``answers`` responses read: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        stream = sock.makefile("rb")
        out = []
        for _ in range(answers):
            status = int(stream.readline().split()[1])
            headers = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            out.append((status, stream.read(int(headers[b"content-length"]))))
    return out


def test_only_the_plainest_post_takes_the_lean_path() -> None:
    base = [b"POST / HTTP/1.1", b"Host: a", b"Content-Length: 10"]
    assert lean_request(b"\r\n".join(base), 64) == (10, False)
    assert lean_request(b"\r\n".join([*base, b"Connection: keep-alive, Close"]), 64) == (10, True)
    refused: list[list[bytes]] = [
        [b"POST / HTTP/1.0", *base[1:]],
        [b"GET / HTTP/1.1", *base[1:]],
        [b"POST /x HTTP/1.1", *base[1:]],
        base[:1] + base[2:],  # no Host
        base[:2],  # no length
        [*base, b"Transfer-Encoding: chunked"],
        [*base, b"Expect: 100-continue"],
        [*base, b"Connection: Upgrade"],
        [*base, b"Content-Length: 10"],  # twice
        [*base, b" folded"],
        [*base, b"bad name: x"],
    ]
    for head in refused:
        assert lean_request(b"\r\n".join(head), 64) is None, head
    assert lean_request(b"\r\n".join(base), 9) is None  # over the body limit: hypercorn's 413


async def test_posts_go_out_in_one_write_each_and_the_rest_to_hypercorn(
    pg: LocalPostgres, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = ApiApp(StoreReader(pg.url, "ingestion", view), serve_metrics=True, body_limit=4096)
    writes: list[int] = []
    send_all = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: Any) -> None:
        writes.append(len(data))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    want = [e.id for e in EVENTS[:5]]
    async with served(app) as port:
        answers = await trio.to_thread.run_sync(exchange, port, post(PAGE) * 3, 3)  # pipelined
        assert [s for s, _ in answers] == [200] * 3
        assert all([e["id"] for e in orjson.loads(b)["result"]["events"]] == want for _, b in answers)
        assert len(writes) == 3, writes  # one write per answer: head and body together
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(PAGE), PAGE)
        mixed = b"".join([
            post(PAGE),
            b"GET /metrics HTTP/1.1\r\nHost: api\r\n\r\n",  # hypercorn's from here on
            post(chunked, b"Transfer-Encoding: chunked"),
            post(PAGE),
        ])  # fmt: skip
        answers = await trio.to_thread.run_sync(exchange, port, mixed, 4)
        assert [s for s, _ in answers] == [200] * 4
        assert b"ingestion_api_requests_total" in answers[1][1]
        for _, body in (answers[0], answers[2], answers[3]):
            assert [e["id"] for e in orjson.loads(body)["result"]["events"]] == want
        too_big = post(b"{" + b" " * 5000 + b"}")
        plain = b"GET / HTTP/1.1\r\nHost: api\r\n\r\n"
        assert [s for s, _ in await trio.to_thread.run_sync(exchange, port, too_big, 1)] == [413]
        assert [s for s, _ in await trio.to_thread.run_sync(exchange, port, plain, 1)] == [405]
        lost = b"GET /x HTTP/1.1\r\nHost: api\r\n\r\n"
        assert [s for s, _ in await trio.to_thread.run_sync(exchange, port, lost, 1)] == [404]
    assert app.metrics.requests[("getEvents", "ok")] == 6


class Faulty(ApiApp):
    async def answer(self, body: bytes) -> bytes:
        if body == b"boom":
            raise RuntimeError("a bug")
        return await super().answer(body)


async def test_a_fault_in_an_answer_costs_its_connection_not_the_port(pg: LocalPostgres, view: str) -> None:
    app = Faulty(StoreReader(pg.url, "ingestion", view))

    def faulty(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(post(b"boom"))
            return sock.recv(100)

    async with served(app) as port:
        assert await trio.to_thread.run_sync(faulty, port) == b""  # closed, unanswered
        answers = await trio.to_thread.run_sync(exchange, port, post(PAGE), 1)
        assert answers[0][0] == 200 and orjson.loads(answers[0][1])["result"]["events"]


async def test_a_lean_request_must_come_whole_within_its_bound() -> None:
    async def answer(body: bytes) -> bytes:
        return body

    async def handoff(stream: trio.abc.HalfCloseableStream) -> None:
        await stream.aclose()

    handler = functools.partial(
        serve_connection, answer=answer, handoff=handoff, body_limit=100, keep_alive=30, request_within=0.5
    )
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    def dribble() -> tuple[list[tuple[int, bytes]], bytes, float]:
        answered = exchange(port, post(b"[1]"), 1)  # a whole one is answered, as it is
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(post(b"0123456789")[:-7])  # the head, 3 of 10 bytes of body, then nothing
            began = time.monotonic()
            got = sock.recv(100)  # (until the server closes)
            return answered, got, time.monotonic() - began

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        answered, got, took = await trio.to_thread.run_sync(dribble)
        nursery.cancel_scope.cancel()
    assert answered == [(200, b"[1]")]
    assert got == b"" and took < 5, took  # closed at its bound (0.5 s), unanswered
