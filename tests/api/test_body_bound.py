"""The API's port has no per-read timeout (its subscribers are quiet for as long as they like), so a
request's body is bounded in time instead: a client that trickles its body, over real HTTP to the
API's own server settings, is cut and the server goes on answering others."""

from __future__ import annotations

import functools

import httpx
import trio
from hypercorn.trio import serve

from ingestion.api.server import server_config
from ingestion.common.asgi import Disconnected, Receive, Scope, Send, read_body, respond, serve_lifespan


async def test_a_body_that_does_not_come_whole_in_time_is_cut_and_others_are_answered() -> None:
    outcomes: list[str] = []
    first = trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        try:
            body = await read_body(receive, 1024, within=0.5)
        except Disconnected as gone:
            outcomes.append(str(gone))
            first.set()
            return
        outcomes.append("whole")
        await respond(send, 200, b"text/plain", body)

    async def trickle() -> None:  # a body declared 100 bytes long, one byte a second
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        with trio.move_on_after(5):
            for _ in range(100):
                await stream.send_all(b"x")
                await trio.sleep(1)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, app, server_config("127.0.0.1", 0), mode="asgi"))  # type: ignore[arg-type]
        port = int(binds[0].rsplit(":", 1)[-1])
        with trio.fail_after(10):
            nursery.start_soon(trickle)
            await first.wait()
            async with httpx.AsyncClient(timeout=5) as http:
                answer = await http.post(f"http://127.0.0.1:{port}/", content=b"hello")
        nursery.cancel_scope.cancel()
    assert outcomes[0] == "the request's body did not come whole within 0.5 s"
    assert answer.status_code == 200 and answer.content == b"hello" and outcomes[1] == "whole"
