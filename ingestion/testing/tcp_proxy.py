"""A loopback TCP proxy the tests control, to cut a node off from Redis (a partition).

Modes: ``forward`` (normal), ``blackhole`` (connections stay open but no byte moves either way,
like a partition that drops packets: calls time out), ``refuse`` (existing connections are reset and
new ones are closed at once, like a host that is down).

A chunk that arrives in ``blackhole`` mode is held, not dropped, and goes on once the mode is
``forward`` again (a partition that heals before TCP gives up): ``held`` counts the chunks a client
sent that are held so far. ``blackhole_at(pattern)`` turns to ``blackhole`` as the first client
chunk that contains ``pattern`` arrives, and holds that chunk: a request certainly on its way, not
yet arrived (a blackhole set from outside may fall between a request and its answer instead).
``watch(pattern)`` counts the server's replies that contain ``pattern`` (``seen[pattern]``): what
the server answered, whoever reads it.

``target_port`` None makes it transparent: each connection goes on to where its client sent it
(``SO_ORIGINAL_DST``), for connections the packet filter redirected here
(:mod:`ingestion.testing.partition`).
"""

from __future__ import annotations

import socket
import struct

import trio

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h: where a redirected connection was headed


def original_destination(sock: trio.socket.SocketType) -> tuple[str, int]:
    """The address a connection redirected by the packet filter was sent to (IPv4)."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    (port,) = struct.unpack("!H", raw[2:4])
    return socket.inet_ntoa(raw[4:8]), port


class TcpProxy:
    def __init__(self, target_port: int | None) -> None:
        self.target_port = target_port
        self.port = 0
        self.mode = "forward"
        self._changed = trio.Event()
        self._scopes: set[trio.CancelScope] = set()
        self.held_chunks: list[bytes] = []  # their first bytes, for a failure message
        self.seen: dict[bytes, int] = {}
        self._blackhole_at: bytes | None = None

    @property
    def held(self) -> int:
        return len(self.held_chunks)

    def watch(self, pattern: bytes) -> None:
        self.seen.setdefault(pattern, 0)

    def blackhole_at(self, pattern: bytes) -> None:
        self._blackhole_at = pattern

    def set_mode(self, mode: str) -> None:
        assert mode in ("forward", "blackhole", "refuse")
        self.mode = mode
        if mode == "refuse":
            for scope in list(self._scopes):
                scope.cancel()
        self._changed.set()
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[TcpProxy] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.mode == "refuse":
                return
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    if self.target_port is None:
                        host, port = original_destination(client.socket)
                    else:
                        host, port = "127.0.0.1", self.target_port
                    upstream = await trio.open_tcp_stream(host, port)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream, True)
                        nursery.start_soon(self._pump, upstream, client, False)
                except OSError:
                    return
                finally:
                    self._scopes.discard(scope)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, from_client: bool) -> None:
        tail = b""  # the end of the previous chunk: a pattern may straddle two
        while True:
            try:
                data = await src.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                with trio.CancelScope(shield=True):
                    try:
                        await dst.send_eof()
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                return
            if from_client and self._blackhole_at is not None and self._blackhole_at in data:
                self._blackhole_at = None
                self.set_mode("blackhole")
            if from_client and self.mode == "blackhole":
                self.held_chunks.append(data[:40])
            while self.mode == "blackhole":
                await self._changed.wait()
            if not from_client and self.seen:
                for pattern in self.seen:
                    if pattern in tail + data and pattern not in tail:
                        self.seen[pattern] += 1
                tail = data[-64:]
            if self.mode == "refuse":
                return
            try:
                await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
