"""The events API's HTTP shell: an ASGI app (JSON-RPC at ``POST /``), its metrics, and
:func:`serve_api`, which a node (``[api] port``) and ``ingestion api`` both run: ``POST /`` answered
by a lean loop (:mod:`ingestion.api.front`), every other request by hypercorn on trio.

What a request may cost is bounded whatever it asks: its body (``[api] max_body_bytes``: more is
answered 413 unread), its work on the server (the reader's ``statement_timeout``: -32001), the
reads at once (the reader's connections; the rest wait their turn), a page's size (``max_limit``).
A fault of ours answers -32603 with what failed, never a traceback or a 500.

Metrics (a :class:`~prometheus_client.registry.Collector`, registered with the node's metrics or
served at ``GET /metrics`` on the API's own port by ``ingestion api``):
``ingestion_api_requests_total{method,outcome}`` (outcome ``ok`` or the JSON-RPC error code),
``ingestion_api_request_seconds{method}`` (a histogram), ``ingestion_api_oldest_ledger`` and
``ingestion_api_latest_ledger`` (the window last served).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestion.api.core import (
    ApiRules,
    CallRefused,
    error_body,
    health_result,
    latest_ledger_result,
    network_result,
    parse_call,
    result_body,
)
from ingestion.api.front import MAX_HEAD, hypercorn_handoff, serve_connection
from ingestion.api.query import Plan, Window, events_result, plan
from ingestion.api.reader import StoreReader
from ingestion.api.streaming import StreamCollector, Streams
from ingestion.common.asgi import (
    BODY_WITHIN,
    BodyTooLarge,
    Disconnected,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    serve_lifespan,
)
from ingestion.rpc.protocol import INTERNAL_ERROR, GetEventsRequest, RpcError

JSON = b"application/json"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)
DEFAULT_BODY_LIMIT = 64 * 1024


class ApiMetrics(Collector):
    """The API's counters, latency histogram and window gauges."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.latency = Histogram(
            "ingestion_api_request_seconds",
            "events API requests by method: seconds from the whole body to the answer",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.oldest: int | None = None
        self.latest: int | None = None
        self.streams: Collector | None = None  # the subscriptions' (StreamCollector), when served
        self.buckets: dict[str, list[int]] = {}  # method -> requests per LATENCY_BUCKETS (the console's)

    def observe(self, method: str, outcome: str, seconds: float) -> None:
        self.requests[(method, outcome)] += 1
        self.latency.labels(method=method).observe(seconds)
        counts = self.buckets.setdefault(method, [0] * len(LATENCY_BUCKETS))
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def snapshot(self) -> dict[str, Any]:
        """What the console shows of these (no I/O): requests by method and outcome, each method's
        p50 and p99 as the histogram's bucket bound they fall under, the window last served."""
        latency = {
            method: {"count": sum(c), "p50_ms": _bound_ms(c, 0.5), "p99_ms": _bound_ms(c, 0.99)}
            for method, c in sorted(self.buckets.items())
        }
        requests = [{"method": m, "outcome": o, "count": n} for (m, o), n in sorted(self.requests.items())]
        return {"requests": requests, "latency": latency, "oldest_ledger": self.oldest,
                "latest_ledger": self.latest}  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "ingestion_api_requests",
            "events API requests by method and outcome (ok, or the JSON-RPC error code)",
            labels=["method", "outcome"],
        )
        for (method, outcome), n in sorted(self.requests.items()):
            total.add_metric([method, outcome], n)
        yield total
        yield from self.latency.collect()
        if self.streams is not None:
            yield from self.streams.collect()
        for name, value, text in (
            ("ingestion_api_oldest_ledger", self.oldest, "the oldest ledger the events API serves"),
            ("ingestion_api_latest_ledger", self.latest, "the latest ledger the events API serves"),
        ):
            if value is not None:
                gauge = GaugeMetricFamily(name, text)
                gauge.add_metric([], value)
                yield gauge


def _bound_ms(counts: list[int], q: float) -> float | None:
    """The bucket bound (ms) under which the ``q`` quantile of ``counts`` falls (None: no request,
    or it falls in the last, unbounded bucket)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for bound, n in zip(LATENCY_BUCKETS, counts, strict=True):
        seen += n
        if seen >= q * total:
            return None if math.isinf(bound) else round(bound * 1000, 3)
    return None


class ApiApp:
    """The ASGI callable of the API port."""

    def __init__(
        self,
        reader: StoreReader,
        rules: ApiRules | None = None,
        *,
        metrics: ApiMetrics | None = None,
        body_limit: int = DEFAULT_BODY_LIMIT,
        serve_metrics: bool = False,
        log: Any = None,
        streams: Streams | None = None,
    ) -> None:
        self.reader = reader
        self.streams = streams
        self.rules = rules or ApiRules()
        self.metrics = metrics or ApiMetrics()
        self.body_limit = body_limit
        if streams is not None:
            self.metrics.streams = StreamCollector(streams.stats)
        self.log = log
        self._registry: CollectorRegistry | None = None
        if serve_metrics:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self.metrics)

    def console_view(self) -> dict[str, Any]:
        """The API this node serves, for its console (no I/O): the job, the metrics' snapshot and
        the subscriptions served now (None when streaming is off)."""
        streams = self.streams.stats.subscribers if self.streams is not None else None
        return {"job": self.reader.view, **self.metrics.snapshot(), "subscribers": streams}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if self.streams is not None and self.streams.handles(scope):
            await self.streams(scope, receive, send)  # /ws and GET /events (ingestion/api/streaming.py)
            return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and self._registry is not None and scope["method"] == "GET":
            await respond(send, 200, CONTENT_TYPE_LATEST.encode(), generate_latest(self._registry))
            return
        if scope["path"] != "/":
            await respond(send, 404, b"text/plain; charset=utf-8", b"not found: JSON-RPC is at POST /\n")
            return
        if scope["method"] != "POST":
            await respond(send, 405, b"text/plain; charset=utf-8", b"405 method not allowed: POST /\n")
            return
        try:
            body = await read_body(receive, self.body_limit)
        except Disconnected:
            return
        except BodyTooLarge:
            self.metrics.observe("", "too-large", 0.0)
            refusal = error_body(None, -32600, f"request body over {self.body_limit} bytes")
            await respond(send, 413, JSON, refusal)
            return
        await respond(send, 200, JSON, await self.answer(body))

    async def answer(self, body: bytes) -> bytes:
        """The JSON-RPC response to one request body (never raises but for cancellation)."""
        started = trio.current_time()
        try:
            call = parse_call(body)
        except CallRefused as refused:
            self.metrics.observe("", str(refused.code), trio.current_time() - started)
            return refused.body
        try:
            result = await self._dispatch(call.method, call.params)
        except RpcError as error:
            self.metrics.observe(call.method, str(error.code), trio.current_time() - started)
            return error_body(call.id, error.code, error.message)
        except Exception as exc:  # a fault of ours: a clear error, never a traceback
            if self.log is not None:
                self.log.error("api-request-failed", method=call.method, error=repr(exc))
            self.metrics.observe(call.method, str(INTERNAL_ERROR), trio.current_time() - started)
            return error_body(call.id, INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
        self.metrics.observe(call.method, "ok", trio.current_time() - started)
        return result_body(call.id, result)

    async def _dispatch(self, method: str, params: Any) -> bytes:
        if method == "getNetwork":
            return network_result(self.rules)
        if method == "getEvents":
            rules = self.rules
            request = GetEventsRequest.from_params(params, rules.max_limit, rules.caps)
            reader = self.reader

            def make_plan(window: Window | None) -> Plan:
                if window is None:
                    raise RpcError(-32600, "startLedger must be within the ledger range: 0 - 0")
                return plan(request, window, reader.schema, reader.view, rules.default_limit)

            window, p, page = await reader.page(make_plan)
            self.metrics.oldest, self.metrics.latest = window.oldest, window.latest
            return events_result(p, page, window)
        window = await self._window()
        if method == "getHealth":
            return health_result(window)
        return latest_ledger_result(window, self.rules)

    async def _window(self) -> Any:
        window = await self.reader.window()
        if window is not None:
            self.metrics.oldest, self.metrics.latest = window.oldest, window.latest
        return window


def server_config(host: str, port: int) -> HypercornConfig:
    """hypercorn's settings for the API's port.

    No per-read timeout (hypercorn's ``read_timeout``): a subscriber over ``/ws`` or ``GET /events``
    sends nothing after its request, so any bound on the wait for its next bytes cuts every quiet
    subscriber at that bound (10 s, as it was, cut every subscription 10 s after it began). What a
    read timeout guarded is bounded otherwise: a connection that has not sent a whole request line
    and headers is closed after ``keep_alive_timeout`` (hypercorn's idle timer runs until a request
    begins), and a request's body must come whole within :data:`~ingestion.common.asgi.BODY_WITHIN`.
    """
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 30
    config.read_timeout = None
    config.graceful_timeout = 1
    config.h11_max_incomplete_size = MAX_HEAD  # request line and headers
    return config


async def serve_api(
    app: Any,
    host: str,
    port: int,
    log: Any,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled (``port`` 0: a free one); calls
    ``task_status.started(port)`` with the bound port once the socket listens. ``POST /`` is
    answered by the lean loop of :mod:`ingestion.api.front`, every other request by hypercorn
    (bound as hypercorn binds: its config's sockets).

    Raises:
        OSError: the address cannot be bound.
    """
    config = server_config(host, port)
    async with trio.open_nursery() as nursery:
        streams = getattr(app, "streams", None)
        if streams is not None:
            await nursery.start(streams.feed.run)  # subscriptions' live feed, before the port opens
        sockets = config.create_sockets().insecure_sockets
        listeners = []
        for sock in sockets:
            sock.listen(config.backlog)
            listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        bound_port = int(sockets[0].getsockname()[1])
        lean = isinstance(app, ApiApp)  # (any other ASGI app: hypercorn's whole)
        handler = functools.partial(
            serve_connection,
            answer=app.answer if lean else None,
            handoff=hypercorn_handoff(app, config),
            body_limit=app.body_limit if lean else -1,
            keep_alive=config.keep_alive_timeout,
            request_within=BODY_WITHIN,
        )
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        log.info("api-listening", host=host, port=bound_port, view=getattr(app.reader, "view", None))
        task_status.started(bound_port)
