"""A loopback TCP proxy the tests control, to cut a node off from Redis (a partition).

Modes: ``forward`` (normal), ``blackhole`` (connections stay open but no byte moves either way,
like a partition that drops packets: calls time out), ``refuse`` (existing connections are reset and
new ones are closed at once, like a host that is down).
"""

from __future__ import annotations

import trio


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.mode = "forward"
        self._changed = trio.Event()
        self._scopes: set[trio.CancelScope] = set()

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
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream)
                        nursery.start_soon(self._pump, upstream, client)
                except OSError:
                    return
                finally:
                    self._scopes.discard(scope)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
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
            while self.mode == "blackhole":
                await self._changed.wait()
            if self.mode == "refuse":
                return
            try:
                await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
