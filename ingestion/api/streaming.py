"""Subscriptions to a job's events over WebSocket (``/ws``) and Server-Sent Events (``GET /events``),
as ASGI on the API's own port: the trio shell around :class:`~ingestion.api.subscription.Subscription`.

Why ASGI and not trio-websocket: the API is a hypercorn ASGI app on one port (``[api] port``);
hypercorn speaks WebSocket itself (wsproto) and hands the app a ``websocket`` scope, so ``/ws``
is one more route of the same app on the same socket. trio-websocket serves a listener of its own
(``ingestion/serve/status.py`` has the node's status port for it): it cannot share hypercorn's.

Each subscription is one task (:meth:`Streams._drive`): it registers with the node's
:class:`~ingestion.api.feed.LiveFeed` first, then reads history a page at a time as the client
takes it, then forwards what the feed publishes. Everything a connection sends goes through one
lock, one frame at a time. A send that does not finish within ``max_lag`` (the client stopped
reading and the socket's buffers are full) drops the connection; a client that reads but too
slowly is cut by the machine's bounds with close code 1008 and the reason, after the frames
already queued in the socket.

Protocol and errors: :mod:`ingestion.api.stream_protocol`; docs/API.md, its streaming section.
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson
import structlog
import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestion.api import stream_protocol as wire
from ingestion.api.feed import LiveFeed
from ingestion.api.stream_reads import HistoryPage, StoredEvent, StreamReads
from ingestion.api.subscription import Limits, ReadHistory, StreamEvent, Subscription
from ingestion.common.asgi import Receive, Scope, Send, respond, serve_lifespan
from ingestion.rpc.protocol import INVALID_REQUEST, RANGE_MESSAGE, Cursor, EventFilter, RpcError

log = structlog.get_logger("ingestion.api")

POLICY_VIOLATION = 1008  # the WebSocket close code of a cut client
RETRY = 1.0  # seconds between history reads while the store is out of reach
HELD_POLL = 0.005  # seconds: the first wait for the projector to hold the feed's position


@attrs.define
class StreamStats:
    """What the streaming half counts (``ingestion_api_*``, :class:`StreamCollector`)."""

    subscribers: int = 0
    notifications: int = 0
    events: int = 0
    refused: int = 0
    cut: dict[str, int] = attrs.Factory(lambda: {"outbox": 0, "lag": 0, "send-timeout": 0})


class StreamCollector(Collector):
    """The stream's metrics, read at scrape time from :class:`StreamStats`."""

    def __init__(self, stats: StreamStats) -> None:
        self.stats = stats

    def collect(self) -> list[Metric]:  # type: ignore[override]
        s = self.stats
        subscribers = GaugeMetricFamily(
            "ingestion_api_subscribers", "Event subscriptions this node serves now (WebSocket and SSE)."
        )
        subscribers.add_metric([], s.subscribers)
        sent = CounterMetricFamily(
            "ingestion_api_notifications_sent", "events notifications sent to subscribers."
        )
        sent.add_metric([], s.notifications)
        events = CounterMetricFamily("ingestion_api_subscription_events_sent", "Events sent to subscribers.")
        events.add_metric([], s.events)
        cut = CounterMetricFamily(
            "ingestion_api_subscribers_cut",
            "Subscribers cut as too slow: outbox (over api.stream_outbox events waiting), lag (a "
            "notification waiting over api.stream_max_lag_ms), send-timeout (a send blocked that long).",
            labels=["reason"],
        )
        for reason, n in sorted(s.cut.items()):
            cut.add_metric([reason], n)
        refused = CounterMetricFamily(
            "ingestion_api_subscriptions_refused", "Subscriptions refused at api.max_subscribers."
        )
        refused.add_metric([], s.refused)
        return [subscribers, sent, events, cut, refused]


class _Outlet:
    """Where a subscription's frames go: a WebSocket or an SSE response."""

    def __init__(self, send: Send, sse: bool) -> None:
        self._send = send
        self.sse = sse
        self.lock = trio.Lock()
        self.done = trio.Event()  # the connection is to end (cut or dropped)

    async def text(self, text: str, cursor: str | None = None) -> None:
        async with self.lock:
            if self.sse:
                head = f"id: {cursor}\nevent: events\n" if cursor else ""
                await self._send({"type": "http.response.body", "body": f"{head}data: {text}\n\n".encode(),
                                  "more_body": True})  # fmt: skip
            else:
                await self._send({"type": "websocket.send", "text": text})

    async def cut(self, reason: str, within: float) -> None:
        """Close with code 1008 and ``reason`` after what is queued (the client reads them
        first), giving up after ``within`` seconds: then the connection is dropped."""
        with trio.move_on_after(within):
            async with self.lock:
                if self.sse:
                    data = orjson.dumps({"code": POLICY_VIOLATION, "reason": reason}).decode()
                    body = f"event: close\ndata: {data}\n\n".encode()
                    await self._send({"type": "http.response.body", "body": body, "more_body": False})
                else:
                    await self._send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": reason})
        self.done.set()


@attrs.define
class Streams:
    """The node's subscriptions: WebSocket and SSE handlers over one live feed and the store's
    reads. ``max_subscribers``: how many at once (``api.max_subscribers``); over it a subscribe is
    refused with -32005."""

    feed: LiveFeed
    reads: StreamReads
    limits: Limits = attrs.Factory(Limits)
    max_subscribers: int = 1000
    stats: StreamStats = attrs.Factory(StreamStats)
    clock: Callable[[], float] = trio.current_time

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app of the two routes (``handles`` says which scopes are theirs)."""
        if scope["type"] == "websocket":
            await self.websocket(receive, send)
        else:
            await self.sse(scope, receive, send)

    @staticmethod
    def handles(scope: Scope) -> bool:
        if scope["type"] == "websocket":
            return bool(scope.get("path") == "/ws")
        return scope["type"] == "http" and scope.get("path") == "/events" and scope.get("method") == "GET"

    # -- WebSocket -----------------------------------------------------------------------------

    async def websocket(self, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        outlet = _Outlet(send, sse=False)
        mine: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when, outlet.done, nursery.cancel_scope)
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message["type"] == "websocket.receive":
                    frame = message.get("text") or message.get("bytes") or b""
                    await self._request(frame, outlet, nursery, mine)
            nursery.cancel_scope.cancel()

    async def _request(
        self, frame: str | bytes, outlet: _Outlet, nursery: trio.Nursery, mine: dict[str, trio.CancelScope]
    ) -> None:
        try:
            request = wire.parse_request(frame)
        except wire.FrameError as exc:
            await outlet.text(wire.error(exc.id, exc.code, exc.message))
            return
        if isinstance(request, wire.Unsubscribe):
            scope = mine.pop(request.subscription, None)
            if scope is not None:
                scope.cancel()
            await outlet.text(wire.result(request.id, scope is not None))
            return
        if self.stats.subscribers >= self.max_subscribers:
            self.stats.refused += 1
            await outlet.text(
                wire.error(request.id, wire.LIMIT_EXCEEDED, wire.too_many(self.max_subscribers))
            )
            return
        refusal = await self._refusal(request)
        if refusal is not None:
            await outlet.text(refusal)
            return
        sid = secrets.token_hex(8)
        await outlet.text(wire.result(request.id, {"subscription": sid}))
        mine[sid] = await nursery.start(self._drive, sid, request, outlet)

    # -- SSE -----------------------------------------------------------------------------------

    async def sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /events?filters=JSON&xdrFormat=F&startLedger=N|cursor=ID`` (``Last-Event-ID``, as
        an EventSource sends on reconnecting, is the cursor): one subscription as
        ``text/event-stream``, each notification an ``events`` event whose ``id`` is its cursor."""
        query = dict(urllib.parse.parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True))
        params: dict[str, Any] = {}
        try:
            if "filters" in query:
                params["filters"] = orjson.loads(query["filters"])
            if "startLedger" in query:
                params["startLedger"] = int(query["startLedger"])
        except (orjson.JSONDecodeError, ValueError) as exc:
            await _bad(send, wire.error(None, wire.INVALID_PARAMS, f"bad query parameter: {exc}"))
            return
        last = dict(scope.get("headers") or []).get(b"last-event-id")
        cursor = last.decode() if last else query.get("cursor")
        if cursor:
            params.pop("startLedger", None)
            params["cursor"] = cursor
        if "xdrFormat" in query:
            params["xdrFormat"] = query["xdrFormat"]
        try:
            request = wire.subscribe_params(None, params)
        except wire.FrameError as exc:
            await _bad(send, wire.error(None, exc.code, exc.message))
            return
        if self.stats.subscribers >= self.max_subscribers:
            self.stats.refused += 1
            await _bad(send, wire.error(None, wire.LIMIT_EXCEEDED, wire.too_many(self.max_subscribers)), 503)
            return
        refusal = await self._refusal(request)
        if refusal is not None:
            await _bad(send, refusal)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]})  # fmt: skip
        outlet = _Outlet(send, sse=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when, outlet.done, nursery.cancel_scope)
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            await nursery.start(self._drive, secrets.token_hex(8), request, outlet)

    # -- one subscription ----------------------------------------------------------------------

    async def _drive(
        self, sid: str, request: wire.Subscribe, outlet: _Outlet,
        *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:  # fmt: skip
        sub = Subscription(request.after, self.limits)
        filters, fmt = request.filters, request.xdr_format
        changed = trio.Event()

        def on_live(rows: list[StoredEvent]) -> None:
            now = self.clock()
            if sub.cut is not None:
                return
            sub.on_live([StreamEvent(r.id, r) for r in rows if r.matches(filters)], now)
            cut = sub.check(now)
            if cut is not None:  # counted now; the task closes the socket once its send is done
                self.stats.cut[cut.kind] += 1
                log.info("api-subscriber-cut", subscription=sid, reason=cut.reason)
            changed.set()

        with trio.CancelScope() as scope:
            key = self.feed.subscribe(on_live)  # before the first history read: the seam
            registered_at = self.feed.position
            self.stats.subscribers += 1
            task_status.started(scope)
            try:
                await self._until_held(registered_at)
                while True:
                    changed = trio.Event()
                    was_cut = sub.cut is not None
                    cut = sub.check(self.clock())
                    if cut is not None:
                        if not was_cut:
                            self.stats.cut[cut.kind] += 1
                            log.info("api-subscriber-cut", subscription=sid, reason=cut.reason)
                        await outlet.cut(cut.reason, self.limits.max_lag)
                        return
                    read = sub.next_read()
                    if read is not None:
                        page = await self._history(read, filters)
                        events = [StreamEvent(e.id, e) for e in page.events]
                        sub.on_history(read, events, page.exhausted, self.clock())
                        continue
                    note = sub.next_notification()
                    if note is None:
                        await changed.wait()
                        continue
                    rendered = [_rendered(e, fmt) for e in note.events]
                    with trio.move_on_after(self.limits.max_lag):
                        await outlet.text(wire.notification(sid, rendered, note.cursor), note.cursor)
                        sub.sent()
                        self.stats.notifications += 1
                        self.stats.events += len(rendered)
                        continue
                    self.stats.cut["send-timeout"] += 1
                    log.info("api-subscriber-dropped", subscription=sid, reason="send-timeout")
                    outlet.done.set()  # the socket is stuck: no close frame can pass
                    return
            finally:
                self.feed.unsubscribe(key)
                self.stats.subscribers -= 1

    async def _history(self, read: ReadHistory, filters: tuple[EventFilter, ...]) -> HistoryPage:
        """One history read, tried again every :data:`RETRY` while the store is out of reach."""
        while True:
            try:
                return await self.reads.history(read.after, filters, read.limit)
            except RpcError as exc:
                log.warning("api-history-unavailable", error=exc.message)
                await trio.sleep(RETRY)

    async def _until_held(self, event_id: str) -> None:
        """Until the store holds ``event_id`` (the feed's position when the subscription
        registered): history read from then on holds everything the feed published before."""
        delay = HELD_POLL
        while True:
            try:
                if await self.reads.holds(event_id):
                    return
            except RpcError as exc:
                log.warning("api-history-unavailable", error=exc.message)
                delay = RETRY
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY)

    async def _refusal(self, request: wire.Subscribe) -> str | None:
        """The error frame for a subscription that starts before the oldest ledger held (as
        ``getEvents`` refuses it), or that cannot be checked (the store out of reach); None when
        it may start (a start past the newest ledger waits for it)."""
        try:
            window = await self.reads.reader.window()
        except RpcError as exc:
            return wire.error(request.id, exc.code, exc.message)
        start = (
            Cursor.parse(request.after).successor().ledger
            if not request.start_ledger
            else request.start_ledger
        )
        if window is not None and start < window.oldest:
            message = RANGE_MESSAGE.format(oldest=window.oldest, latest=window.latest)
            return wire.error(request.id, INVALID_REQUEST, message)
        return None


def _rendered(event: StoredEvent, fmt: str) -> bytes:
    try:
        return event.render(fmt)
    except RpcError:
        return event.render("base64")  # a stored ScVal that does not decode: sent as it is


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _bad(send: Send, body: str, status: int = 400) -> None:
    await respond(send, status, b"application/json", body.encode())


def app(streams: Streams, fallback: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None) -> Any:
    """An ASGI app: the streams' two routes, everything else to ``fallback`` (404 without one)."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if streams.handles(scope):
            await streams(scope, receive, send)
        elif fallback is not None:
            await fallback(scope, receive, send)
        elif scope["type"] == "http":
            await respond(send, 404, b"text/plain", b"not found\n")
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif scope["type"] == "lifespan":
            await serve_lifespan(receive, send)

    return asgi
