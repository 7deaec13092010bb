"""What the project's small ASGI apps (the simulator, the metrics endpoint) share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer the server's lifespan protocol: nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class Disconnected(Exception):
    """The client went away before its request's body was whole (``http.disconnect``)."""


class BodyTooLarge(Exception):
    """A request's body is longer than the app takes (answer 413 without reading the rest)."""


BODY_WITHIN = 10.0
"""Seconds a request's body may take to come whole (servers without a per-read timeout rely on it)."""


async def read_body(receive: Receive, limit: int | None = None, within: float = BODY_WITHIN) -> bytes:
    """A request's whole body, however many ``http.request`` messages it came in.

    Raises:
        Disconnected: the client left mid-request, or its body did not come whole within
            ``within`` seconds: what came is not the body it sent.
        BodyTooLarge: more than ``limit`` bytes came (None: no limit); the rest is not read.
    """
    body = b""
    with trio.move_on_after(within):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected("the client went away before its request was whole")
            body += message.get("body", b"")
            if limit is not None and len(body) > limit:
                raise BodyTooLarge(f"a body over {limit} bytes")
            if not message.get("more_body"):
                return body
    raise Disconnected(f"the request's body did not come whole within {within:g} s")


async def respond(
    send: Send,
    status: int,
    content_type: bytes,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole response: status, content type and length, extra headers, body."""
    all_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *(headers or ()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})
