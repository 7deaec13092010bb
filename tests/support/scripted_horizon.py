"""A tiny scripted HTTP/1.1 server for Horizon source tests that the simulator cannot express.

``serve_script(handler)`` listens on 127.0.0.1 and, for each request, calls ``handler(request)``;
the handler returns a :class:`Reply` (status, headers, body) or an async iterator of raw byte
chunks for a streamed body (written as-is, then the connection closes). Every response closes its
connection, which keeps the server trivially correct.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

import attrs
import trio


@attrs.frozen
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@attrs.frozen
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = attrs.Factory(lambda: {"Content-Type": "application/hal+json"})


Handler = Callable[[Request], Awaitable[Reply | AsyncIterator[bytes]]]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def problem(status: int, title: str, detail: str, **extras: str) -> Reply:
    doc: dict[str, object] = {
        "type": f"https://stellar.org/horizon-errors/{title.lower().replace(' ', '_')}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if extras:
        doc["extras"] = extras
    return Reply(status, json.dumps(doc).encode(), {"Content-Type": "application/problem+json"})


def page_reply(records: list[dict[str, object]]) -> Reply:
    """A compact page, the way the simulator writes them."""
    doc = {"_links": {}, "_embedded": {"records": records}}
    return Reply(200, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())


def sse_frame(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    lines = []
    if event:
        lines.append(f"event: {event}")
    if id:
        lines.append(f"id: {id}")
    lines.append(f"data: {data}")
    return ("\n".join(lines) + "\n\n").encode()


async def _read_head(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b""
        data += chunk
    return data


_ROOT = b'{"history_elder_ledger": 1, "history_latest_ledger": 100, "core_latest_ledger": 100}'


async def _serve_one(stream: trio.SocketStream, handler: Handler) -> None:
    async with stream:
        head = await _read_head(stream)
        if not head:
            return
        lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        _method, target, _version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        parts = urlsplit(target)
        if parts.path == "/":
            # The root resource (read before resuming, for the history-gap check): a Horizon
            # that keeps all history.
            reply: Reply | AsyncIterator[bytes] = Reply(
                200, _ROOT, {"Content-Type": "application/hal+json; charset=utf-8"}
            )
        else:
            reply = await handler(Request(parts.path, dict(parse_qsl(parts.query)), headers))
        try:
            if isinstance(reply, Reply):
                out = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'X')}"]
                out += [f"{k}: {v}" for k, v in reply.headers.items()]
                out += [f"Content-Length: {len(reply.body)}", "Connection: close", "", ""]
                await stream.send_all("\r\n".join(out).encode() + reply.body)
            else:
                out = [
                    "HTTP/1.1 200 OK",
                    "Content-Type: text/event-stream; charset=utf-8",
                    "Connection: close",
                    "",
                    "",
                ]
                await stream.send_all("\r\n".join(out).encode())
                async for chunk in reply:
                    await stream.send_all(chunk)
        except trio.BrokenResourceError:
            pass


async def serve_script(
    handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``handler`` on 127.0.0.1; ``task_status.started`` gets the base URL."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def serve(stream: trio.SocketStream) -> None:
        await _serve_one(stream, handler)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve, listeners)
        task_status.started(f"http://127.0.0.1:{port}")
