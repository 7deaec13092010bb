"""The API port's front: a lean HTTP/1.1 loop that answers JSON-RPC at ``POST /`` itself, one
socket write per answer and no task per request, and hands a connection to hypercorn (the ASGI
app: ``/ws``, ``GET /events``, ``/metrics``, the 404s, 405s and 413s) at its first request that is
anything else.

The lean path takes only the plainest request: ``POST / HTTP/1.1`` with a ``Host``, a
``Content-Length`` within the body limit, and no ``Transfer-Encoding``, ``Expect`` or ``Upgrade``;
header names must be tokens. Anything else (another method or path, HTTP/1.0, a chunked body, a
body over the limit, a head over :data:`MAX_HEAD` bytes, a malformed head) goes to hypercorn with
every byte read so far replayed (:class:`Replayed`), so it answers exactly as it always did.
Between requests a connection may idle ``keep_alive`` seconds; a request begun must come whole
within ``request_within`` (:data:`~ingestion.common.asgi.BODY_WITHIN`, as a body must for the
app behind hypercorn). Neither has a per-read timeout (a quiet subscriber sends nothing after its
request: hypercorn's connections have none either).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any

import trio
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.utils import wrap_app

MAX_HEAD = 16 * 1024  # request line and headers (hypercorn's h11_max_incomplete_size)
RECEIVE = 65536
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = b"POST / HTTP/1.1"

Answer = Callable[[bytes], Awaitable[bytes]]
Handoff = Callable[[trio.abc.HalfCloseableStream], Awaitable[None]]


def lean_request(head: bytes, body_limit: int) -> tuple[int, bool] | None:
    """A request head (without its blank line) the lean path answers: ``(content length, close
    after)``; None: hypercorn's."""
    lines = head.split(b"\r\n")
    if lines[0] != _REQUEST_LINE:
        return None
    length: int | None = None
    close = host = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return None
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"host":
            host = True
        elif name == b"connection":
            tokens = {t.strip(b" \t").lower() for t in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
    if length is None or length > body_limit or not host:
        return None
    return length, close


class _Date:
    """The ``date`` header's value, formatted once a second (wall clock: a header, no deadline)."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._value = second, formatdate(second, usegmt=True).encode()
        return self._value


_DATE = _Date()


def response(body: bytes) -> bytes:
    """A 200 answer with a JSON body, head and body in one buffer."""
    return (
        b"HTTP/1.1 200 \r\ncontent-type: application/json\r\ncontent-length: %d\r\ndate: %s\r\n\r\n"
        % (len(body), _DATE.now())
        + body
    )


class Replayed(trio.abc.HalfCloseableStream):
    """A socket stream whose first read returns ``prefix`` (what the lean loop already read):
    the stream hypercorn takes over. It has the socket's ``socket`` (hypercorn reads the peer's
    address there) and no ``do_handshake`` (hypercorn tells plain TCP from TLS by that)."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return bytes(await self.stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def serve_connection(
    stream: trio.SocketStream,
    answer: Answer | None,
    handoff: Handoff,
    body_limit: int,
    *,
    keep_alive: float = 30.0,
    request_within: float = 10.0,
) -> None:
    """One client connection: lean requests answered here (``answer`` None: none is), then
    hypercorn's (if any). Between requests it may idle ``keep_alive`` seconds; a request begun must
    come whole (head and body) within ``request_within`` seconds."""
    buffer = bytearray()
    deadline = math.inf  # when the request begun must be whole
    try:
        while True:
            end = buffer.find(b"\r\n\r\n")
            while end < 0:
                if len(buffer) > MAX_HEAD:
                    return await handoff(Replayed(stream, bytes(buffer)))
                if buffer:
                    deadline = min(deadline, trio.current_time() + request_within)
                data = await _receive(stream, deadline if buffer else trio.current_time() + keep_alive)
                if not data:
                    return
                buffer += data
                end = buffer.find(b"\r\n\r\n")
            lean = None if answer is None else lean_request(bytes(buffer[:end]), body_limit)
            if lean is None or answer is None:
                return await handoff(Replayed(stream, bytes(buffer)))
            length, close = lean
            need = end + 4 + length
            deadline = min(deadline, trio.current_time() + request_within)
            while len(buffer) < need:
                data = await _receive(stream, deadline)
                if not data:
                    return
                buffer += data
            body = bytes(buffer[end + 4 : need])
            del buffer[:need]
            deadline = math.inf
            try:
                answered = await answer(body)
            except Exception:  # (``answer`` answers every fault: a bug costs one connection, not the port)
                return
            await stream.send_all(response(answered))
            if close:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
        return
    finally:
        await stream.aclose()


async def _receive(stream: trio.SocketStream, deadline: float) -> bytes:
    with trio.fail_at(deadline):
        return bytes(await stream.receive_some(RECEIVE))


def hypercorn_handoff(app: Any, config: Any) -> Handoff:
    """What takes a connection over: hypercorn's own connection server (the one its ``serve``
    runs per connection) over ``app``."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)

    async def handoff(stream: trio.abc.HalfCloseableStream) -> None:
        await TCPServer(wrapped, config, context, {}, stream).run()  # type: ignore[arg-type]

    return handoff
