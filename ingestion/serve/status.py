"""The node's live status over WebSocket (trio-websocket): its status, and every election event.

Every client gets, as JSON text messages:

- on connecting, one ``status`` message per job the node hosts;
- each election event as it happens (``event`` message), followed by fresh ``status`` messages;
- the ``status`` messages every ``interval`` seconds otherwise (so a silent node can be told from a
  dead one).

``status``::

    {"type": "status", "node": "a", "job": "horizon", "role": "leader",    # starting|standby|leader|stopped
     "leader": "a", "token": 7, "lease_ms_left": 812, "cursor": "123-1",
     "events_ingested": 1200, "commits": 40, "ingest_rate": 118.5, "lag_seconds": 1.2,
     "elections": 2, "losses": {"lease-expired": 1}, "fencing_rejections": 0,
     "redis_errors": 0, "leaderless_seconds": 0.8, "source_up": true,
     "source_ok_seconds_ago": 0.4, "complete_through": 51234567, "complete_held": "",
     "time": "2025-01-01T00:00:00.000Z"}

``event`` (the election event's name and fields as in the logs, docs/REFERENCE.md: a job that has
stopped is ``node-stopped``, as the log says, never ``stopped``)::

    {"type": "event", "event": "became-leader", "node": "a", "job": "horizon",
     "time": "...", "token": 7, "previous_node": "b", "takeover_ms": 812, ...}

The actors are never slowed down by a client: each connection has a small bounded queue, and a
client too slow to keep up is disconnected (it reconnects and starts from a fresh status).
"""

from __future__ import annotations

import functools
import json
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

if TYPE_CHECKING:
    from trio_websocket import WebSocketRequest

from actors.observe import NodeObserver, RateMeter

STATUS_INTERVAL = 1.0  # seconds between unprompted status messages
QUEUE_SIZE = 64  # events a connection may have pending before it is dropped as too slow
SEND_TIMEOUT = 5.0  # seconds one message may take to send before the client is dropped
HANDSHAKE_TIMEOUT = 5.0
# Observer events the log names otherwise: the socket uses the log's word (a job's elector has
# stopped: ``node-stopped``, as the node's last log line says; its status ``role`` is ``stopped``).
LOGGED_AS = {"stopped": "node-stopped"}


def wall_time(now: float | None = None) -> str:
    now = time.time() if now is None else now
    millis = int(now * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


@attrs.define
class StatusHub:
    """Builds status messages (one per job the node hosts) and fans the observers' election events
    out to connections."""

    observers: list[NodeObserver]
    meters: dict[str, RateMeter] = attrs.Factory(dict)
    queues: dict[int, tuple[trio.MemorySendChannel[dict[str, Any]], trio.CancelScope]] = (
        attrs.Factory(dict)
    )
    _next_id: int = 0

    def statuses(self) -> list[dict[str, Any]]:
        return [self.status(o) for o in self.observers]

    def status(self, observer: NodeObserver | None = None) -> dict[str, Any]:
        s = (observer or self.observers[0]).snapshot()
        now = trio.current_time()
        rate = self.meters.setdefault(s.job, RateMeter()).sample(now, s.events_ingested)
        left = None
        if s.ingest_deadline is not None:
            left = max(0, round((s.ingest_deadline - now) * 1000))
        return {
            "type": "status",
            "node": s.node,
            "job": s.job,
            "role": s.role,
            "leader": s.leader,
            "token": s.token,
            "lease_ms_left": left,
            "cursor": s.cursor,
            "events_ingested": s.events_ingested,
            "commits": s.commits,
            "ingest_rate": round(rate, 1) if s.role == "leader" else 0.0,
            "lag_seconds": (
                round(s.source_lag_seconds, 3) if s.source_lag_seconds is not None else None
            ),
            "elections": s.elections,
            "losses": s.losses,
            "fencing_rejections": s.fencing_rejections,
            "redis_errors": s.redis_errors,
            "leaderless_seconds": round(s.leaderless_seconds, 3),
            "source_up": s.source_up,
            "source_ok_seconds_ago": (
                round(now - s.source_last_ok, 3) if s.source_last_ok is not None else None
            ),
            # the completeness watermark this leader last committed (None: not leading, or its
            # source does not say), and why a known gap holds it ('' when none does)
            "complete_through": s.complete_through_ledger if s.role == "leader" else None,
            "complete_held": s.complete_held if s.role == "leader" else "",
            "time": wall_time(),
        }

    def on_event(self, observer: NodeObserver, event: str, fields: dict[str, Any]) -> None:
        """Observer listener: runs synchronously inside an actor, so it must never block."""
        if event == "committed":
            return  # folded into the periodic status (rate, cursor), not pushed one by one
        message = {
            "type": "event",
            "event": LOGGED_AS.get(event, event),
            "node": observer.node,
            "job": observer.job,
            "time": wall_time(),
            **{k: _jsonable(v) for k, v in fields.items() if k not in ("type", "event")},
        }
        for key, (queue, scope) in list(self.queues.items()):
            try:
                queue.send_nowait(message)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                scope.cancel("status client too slow")
                del self.queues[key]

    def add(
        self, queue: trio.MemorySendChannel[dict[str, Any]], scope: trio.CancelScope
    ) -> int:
        self._next_id += 1
        self.queues[self._next_id] = (queue, scope)
        return self._next_id

    def remove(self, key: int) -> None:
        self.queues.pop(key, None)


async def _send(ws: Any, message: dict[str, Any]) -> None:
    with trio.fail_after(SEND_TIMEOUT):
        await ws.send_message(json.dumps(message, separators=(",", ":")))


async def _serve_client(
    hub: StatusHub, request: WebSocketRequest, interval: float, log: Any
) -> None:
    # lazy: node start-up (trio_websocket, ~40 ms: see serve_status)
    from trio_websocket import ConnectionClosed

    ws = await request.accept()
    send, receive = trio.open_memory_channel[dict[str, Any]](QUEUE_SIZE)
    with trio.CancelScope() as scope:
        key = hub.add(send, scope)
        try:
            with send, receive:
                for status in hub.statuses():
                    await _send(ws, status)
                while True:
                    message: dict[str, Any] | None = None
                    with trio.move_on_after(interval):
                        message = await receive.receive()
                    # Sends stay outside the timed scope: a send cut off halfway would leave the
                    # connection in an unknown state.
                    if message is not None:
                        await _send(ws, message)
                    for status in hub.statuses():
                        await _send(ws, status)
        except (ConnectionClosed, trio.TooSlowError):
            pass
        finally:
            hub.remove(key)
    if scope.cancelled_caught:
        log.warning("status-client-dropped", reason="too slow")
    with trio.move_on_after(1, shield=True):
        await ws.aclose(code=1013, reason="too slow or shutting down")


async def serve_status(
    host: str,
    port: int,
    observer: NodeObserver | list[NodeObserver],
    log: Any,
    *,
    interval: float = STATUS_INTERVAL,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the status WebSocket on ``host:port`` (any path) until cancelled.

    ``port`` 0 picks a free port; ``task_status.started(port)`` reports the bound port once the
    listener is up.

    Raises:
        OSError: the address cannot be bound.
    """
    # Here, not at the top: every node imports this module (StatusHub), and trio_websocket costs
    # start-up time (~40 ms) to the nodes that serve no status port.
    from trio_websocket import serve_websocket  # lazy: start-up time (see above)

    observers = [observer] if isinstance(observer, NodeObserver) else list(observer)
    hub = StatusHub(observers)
    unsubscribers = [o.subscribe(functools.partial(hub.on_event, o)) for o in observers]

    async def handler(request: WebSocketRequest) -> None:
        await _serve_client(hub, request, interval, log)

    try:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                lambda *, task_status: serve_websocket(
                    handler,
                    host,
                    port,
                    ssl_context=None,
                    connect_timeout=HANDSHAKE_TIMEOUT,
                    disconnect_timeout=1.0,
                    task_status=task_status,
                )
            )
            bound_port = int(server.port)
            log.info("status-listening", host=host, port=bound_port)
            task_status.started(bound_port)
    finally:
        for unsubscribe in unsubscribers:
            unsubscribe()
