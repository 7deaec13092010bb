"""A loopback HTTP proxy in front of the simulator that answers ``/`` but can fail everything else.

Modes: ``forward`` (every request relayed), ``root-only`` (``GET /`` relayed; every other request
answered 503 with Horizon's ``stale_history`` problem, as a Horizon whose ingestion fell behind
does), ``no-stream`` (plain GETs relayed, pages included; an SSE request gets its 200 event-stream
head and then nothing, as from a proxy that buffers streams: held until the mode changes or the
client leaves, then closed; a stream open when the mode is set ends). One request per
connection (``Connection: close``), enough for the nodes' httpx clients.

``root_delay`` (seconds, any mode) holds each ``GET /`` that long before relaying it: a slow root,
as a loaded Horizon's; ``roots`` counts the ``GET /`` requests that have arrived.
"""

from __future__ import annotations

import httpx
import trio

STALE_HISTORY = (
    b'{"type":"https://stellar.org/horizon-errors/stale_history","title":"Historical DB Is Too Stale",'
    b'"status":503,"detail":"This horizon instance is configured to reject client requests when '
    b'its historical database is too far behind the connected Stellar Core."}'
)


class HttpFaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.mode = "forward"
        self.failed = 0  # requests answered 503 in root-only mode
        self.held = 0  # streams held silent in no-stream mode
        self.root_delay = 0.0
        self.roots = 0
        self._changed = trio.Event()

    def set_mode(self, mode: str) -> None:
        assert mode in ("forward", "root-only", "no-stream")
        self.mode = mode
        self._changed.set()
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[HttpFaultProxy] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
            self._client = client
            task_status.started(self)
            await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await self._serve_one(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, httpx.HTTPError, ValueError):
            pass  # the client went away, or the upstream did: the client sees a closed connection

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(30):
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    head += chunk
                method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                path = target.split("?", 1)[0]
                if path == "/":
                    self.roots += 1
                    await trio.sleep(self.root_delay)
                if self.mode == "root-only" and path != "/":
                    self.failed += 1
                    await self._answer(stream, 503, STALE_HISTORY)
                    return
                if "text/event-stream" in head.decode(errors="replace").lower():
                    if self.mode == "no-stream":
                        await self._hold_stream(stream)
                        return
                    await self._relay_stream(stream, target)
                    return
                response = await self._client.request(method, self.upstream + target)
                await self._answer(stream, response.status_code, response.content)

    async def _answer(self, stream: trio.SocketStream, status: int, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + body)

    async def _hold_stream(self, stream: trio.SocketStream) -> None:
        """The stream's head, then silence until the mode changes (the client may leave first)."""
        self.held += 1
        changed = self._changed
        await stream.send_all(
            b"HTTP/1.1 200 X\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        async with trio.open_nursery() as nursery:

            async def client_leaves() -> None:
                while await stream.receive_some(65536):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(client_leaves)
            await changed.wait()
            nursery.cancel_scope.cancel()

    async def _relay_stream(self, stream: trio.SocketStream, target: str) -> None:
        """An SSE request: relayed chunk by chunk until either side ends or the mode changes."""
        headers = {"Accept": "text/event-stream"}
        async with self._client.stream("GET", self.upstream + target, headers=headers,
                                       timeout=httpx.Timeout(10.0, read=None)) as response:  # fmt: skip
            await stream.send_all(
                f"HTTP/1.1 {response.status_code} X\r\nContent-Type: text/event-stream\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            async for chunk in response.aiter_raw():
                if self.mode != "forward":
                    return  # cut: the stream ends, the next request is answered 503
                await stream.send_all(chunk)
