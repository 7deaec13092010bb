"""Prometheus metrics and a health probe for one node, served over HTTP with hypercorn on trio.

Each node has its own :class:`prometheus_client.CollectorRegistry` (never the global one), so that
several in-process nodes can be scraped side by side. Gauges and counters are read from the
:class:`~actors.observe.NodeObserver` at scrape time; only the commit-latency histogram keeps
state of its own, fed by the observer's ``committed`` notifications.

Endpoints (both GET):

- ``/metrics``: the Prometheus text exposition.
- ``/healthz``: ``200 {"status": "ok", ...}`` while the node process runs its election loop (leader
  or standby, Redis reachable or not: a node that cannot reach Redis is safely standing by and a
  restart would not help), ``503`` once the node has stopped.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.lease_store import RedisUnavailable, StreamInfo
from actors.observe import NodeObserver
from ingestion.asgi import Receive, Scope, Send, serve_lifespan

COMMIT_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, math.inf)



class _ObserverCollector(Collector):
    """Everything that can be read from the observer's snapshot when Prometheus scrapes."""

    def __init__(self, observer: NodeObserver, clock: Callable[[], float]) -> None:
        self._observer = observer
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        s = self._observer.snapshot()
        info = GaugeMetricFamily(
            "ingestion_node_info", "This node's id and job (always 1).", labels=["node", "job"]
        )
        info.add_metric([s.node, s.job], 1)
        yield info
        yield GaugeMetricFamily(
            "ingestion_leader", "1 while this node holds the lease, else 0.",
            value=1 if s.role == "leader" else 0,
        )  # fmt: skip
        if s.token is not None:
            yield GaugeMetricFamily(
                "ingestion_fencing_token",
                "Fencing token of this node's term (leader) or of the leader it last saw (standby).",
                value=s.token,
            )
        if s.ingest_deadline is not None:
            yield GaugeMetricFamily(
                "ingestion_lease_remaining_seconds",
                "Seconds until this leader's ingest deadline unless the lease is renewed.",
                value=max(0.0, s.ingest_deadline - self._clock()),
            )
        yield CounterMetricFamily(
            "ingestion_elections", "Terms this node has won.", value=s.elections
        )
        losses = CounterMetricFamily(
            "ingestion_leadership_losses", "Terms this node has lost, by reason.", labels=["reason"]
        )
        for reason, count in sorted(s.losses.items()):
            losses.add_metric([reason], count)
        yield losses
        yield CounterMetricFamily(
            "ingestion_fencing_rejections",
            "Commits refused because their fencing token was stale or the lease was lost.",
            value=s.fencing_rejections,
        )
        yield CounterMetricFamily(
            "ingestion_redis_unavailable",
            "Election attempts that failed because Redis could not be reached.",
            value=s.redis_errors,
        )
        yield CounterMetricFamily(
            "ingestion_events_ingested", "Records committed to the events stream by this node.",
            value=s.events_ingested,
        )  # fmt: skip
        yield CounterMetricFamily(
            "ingestion_commits", "Batches committed by this node.", value=s.commits
        )
        yield CounterMetricFamily(
            "ingestion_leaderless_seconds",
            "Seconds the job was leaderless before each of this node's takeovers (as measured by "
            "Redis); sum over the nodes for the job's total.",
            value=s.leaderless_seconds,
        )
        if s.source_lag_seconds is not None:
            yield GaugeMetricFamily(
                "ingestion_source_lag_seconds",
                "Leader only: age of the newest committed record (now - its created_at) at commit.",
                value=s.source_lag_seconds,
            )


class _StreamCollector(Collector):
    """The job's events stream as read from Redis at the last scrape (absent when unread)."""

    def __init__(self) -> None:
        self.info: StreamInfo | None = None

    def collect(self) -> Iterator[Metric]:
        info = self.info
        if info is None:
            return
        yield GaugeMetricFamily(
            "ingestion_events_stream_entries", "Entries in the job's events stream now.",
            value=info.length,
        )  # fmt: skip
        yield CounterMetricFamily(
            "ingestion_events_trimmed",
            "Entries removed from the events stream by retention (events.max_len), all nodes.",
            value=info.trimmed,
        )
        lag = GaugeMetricFamily(
            "ingestion_consumer_group_lag_entries",
            "Entries a consumer group on the events stream has not acknowledged yet (pending plus "
            "not yet delivered); trimming waits for the slowest group.",
            labels=["group"],
        )
        known = [(g.name, g.unacknowledged) for g in info.groups if g.unacknowledged is not None]
        for name, value in known:
            lag.add_metric([name], value)
        yield lag
        if known:
            yield GaugeMetricFamily(
                "ingestion_consumer_group_lag_max_entries",
                "The slowest consumer group's lag (ingestion_consumer_group_lag_entries).",
                value=max(v for _, v in known),
            )


class NodeMetrics:
    """The metrics of one node: a private registry fed by its observer, and by the events stream
    read from Redis at each scrape when ``stream_info`` is given."""

    def __init__(
        self,
        observer: NodeObserver,
        clock: Callable[[], float] = trio.current_time,
        stream_info: Callable[[], Awaitable[StreamInfo]] | None = None,
    ):
        self.observer = observer
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ObserverCollector(observer, clock))
        self._stream_info = stream_info
        self._stream = _StreamCollector()
        self.registry.register(self._stream)
        self.commit_latency = Histogram(
            "ingestion_commit_latency_seconds",
            "Time from sending a fenced commit to Redis until its answer.",
            buckets=COMMIT_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.close = observer.subscribe(self._on_event)

    def _on_event(self, event: str, fields: dict[str, Any]) -> None:
        if event == "committed":
            self.commit_latency.observe(float(fields["latency"]))

    async def refresh(self) -> None:
        """Read the events stream from Redis (one bounded call); on failure its metrics are left
        out of this scrape rather than shown stale."""
        if self._stream_info is None:
            return
        try:
            self._stream.info = await self._stream_info()
        except RedisUnavailable:
            self._stream.info = None

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(metrics: NodeMetrics) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A tiny ASGI app: ``/metrics`` and ``/healthz``, nothing else."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"method not allowed\n"
        elif path == "/metrics":
            await metrics.refresh()
            status, ctype, body = 200, CONTENT_TYPE_LATEST, metrics.exposition()
        elif path in ("/healthz", "/health"):
            snap = metrics.observer.snapshot()
            ok = snap.role != "stopped"
            doc = {"status": "ok" if ok else "stopped", "node": snap.node, "job": snap.job,
                   "role": snap.role}  # fmt: skip
            status, ctype, body = (200 if ok else 503), "application/json", json.dumps(doc).encode()
        else:
            status, ctype, body = 404, "text/plain", b"not found: try /metrics or /healthz\n"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype.encode()), (b"cache-control", b"no-store")],
            }
        )
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    return app


async def serve_metrics(
    host: str,
    port: int,
    observer: NodeObserver,
    log: Any,
    *,
    stream_info: Callable[[], Awaitable[StreamInfo]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics`` and ``/healthz`` on ``host:port`` until cancelled.

    ``port`` 0 picks a free port. Calls ``task_status.started(port)`` with the bound port once the
    socket listens. Every connection is bounded by hypercorn's keep-alive and read timeouts.

    Raises:
        OSError: the address cannot be bound.
    """
    metrics = NodeMetrics(observer, stream_info=stream_info)
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # our own log line below; hypercorn's would go to stderr unstructured
    config.keep_alive_timeout = 5
    config.read_timeout = 10
    config.graceful_timeout = 1

    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(serve, metrics_app(metrics), config, mode="asgi")  # type: ignore[arg-type]
            )
            bound_port = int(binds[0].rsplit(":", 1)[-1])
            log.info("metrics-listening", host=host, port=bound_port, paths=["/metrics", "/healthz"])
            task_status.started(bound_port)
    finally:
        metrics.close()
