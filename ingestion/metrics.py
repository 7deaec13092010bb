"""Prometheus metrics and a health probe for one node, served over HTTP with hypercorn on trio.

Each node has its own :class:`prometheus_client.CollectorRegistry` (never the global one), so that
several in-process nodes can be scraped side by side. Gauges and counters are read from the
:class:`~actors.observe.NodeObserver` at scrape time; only the commit-latency histogram keeps
state of its own, fed by the observer's ``committed`` notifications.

Endpoints (both GET):

- ``/metrics``: the Prometheus text exposition.
- ``/healthz``: ``200 {"status": "ok", ...}`` while the node process runs its election loop (leader
  or standby, Redis reachable or not: a node that cannot reach Redis is safely standing by and a
  restart would not help), ``503`` once the node has stopped. ``source_up`` says whether the
  node's Horizon answered within two lease TTLs (null until first checked).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
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
    """Everything that can be read from the observers' snapshots when Prometheus scrapes: one
    sample per job for each metric (label ``job``)."""

    def __init__(self, observers: Sequence[NodeObserver], clock: Callable[[], float]) -> None:
        self._observers = observers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        snaps = [o.snapshot() for o in self._observers]
        info = GaugeMetricFamily(
            "ingestion_node_info", "This node's id and jobs (always 1).", labels=["node", "job"]
        )
        leader = _gauge("ingestion_leader", "1 while this node holds the job's lease, else 0.")
        token = _gauge(
            "ingestion_fencing_token",
            "Fencing token of this node's term (leader) or of the leader it last saw (standby).",
        )
        remaining = _gauge(
            "ingestion_lease_remaining_seconds",
            "Seconds until this leader's ingest deadline unless the lease is renewed.",
        )
        elections = _counter("ingestion_elections", "Terms this node has won.")
        losses = CounterMetricFamily(
            "ingestion_leadership_losses", "Terms this node has lost, by reason.",
            labels=["job", "reason"],
        )  # fmt: skip
        rejections = _counter(
            "ingestion_fencing_rejections",
            "Commits refused because their fencing token was stale or the lease was lost.",
        )
        redis_errors = _counter(
            "ingestion_redis_unavailable",
            "Election attempts that failed because Redis could not be reached.",
        )
        ingested = _counter(
            "ingestion_events_ingested", "Records committed to the events stream by this node."
        )
        commits = _counter("ingestion_commits", "Batches committed by this node.")
        leaderless = _counter(
            "ingestion_leaderless_seconds",
            "Seconds the job was leaderless before each of this node's takeovers (as measured by "
            "Redis); sum over the nodes for the job's total.",
        )
        lag = _gauge(
            "ingestion_source_lag_seconds",
            "Leader only: age of the newest committed record (now - its created_at) at commit.",
        )
        source_up = _gauge(
            "ingestion_source_up",
            "1 while this node's source (Horizon) answered within two lease TTLs, else 0.",
        )
        for s in snaps:
            job = [s.job]
            info.add_metric([s.node, s.job], 1)
            leader.add_metric(job, 1 if s.role == "leader" else 0)
            if s.token is not None:
                token.add_metric(job, s.token)
            if s.ingest_deadline is not None:
                remaining.add_metric(job, max(0.0, s.ingest_deadline - self._clock()))
            elections.add_metric(job, s.elections)
            for reason, count in sorted(s.losses.items()):
                losses.add_metric([s.job, reason], count)
            rejections.add_metric(job, s.fencing_rejections)
            redis_errors.add_metric(job, s.redis_errors)
            ingested.add_metric(job, s.events_ingested)
            commits.add_metric(job, s.commits)
            leaderless.add_metric(job, s.leaderless_seconds)
            if s.source_lag_seconds is not None:
                lag.add_metric(job, s.source_lag_seconds)
            if s.source_up is not None:
                source_up.add_metric(job, 1 if s.source_up else 0)
        yield from (info, leader, token, remaining, elections, losses, rejections, redis_errors,
                    ingested, commits, leaderless, lag, source_up)  # fmt: skip


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["job"])


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=["job"])


class _StreamCollector(Collector):
    """Each job's events stream as read from Redis at the last scrape (absent when unread)."""

    def __init__(self) -> None:
        self.info: dict[str, StreamInfo] = {}

    def collect(self) -> Iterator[Metric]:
        if not self.info:
            return
        entries = _gauge("ingestion_events_stream_entries", "Entries in the job's events stream now.")
        trimmed = _counter(
            "ingestion_events_trimmed",
            "Entries removed from the events stream by retention (events.max_len), all nodes.",
        )
        lag = GaugeMetricFamily(
            "ingestion_consumer_group_lag_entries",
            "Entries a consumer group on the events stream has not acknowledged yet (pending plus "
            "not yet delivered); trimming waits for the slowest group.",
            labels=["job", "group"],
        )
        slowest = _gauge(
            "ingestion_consumer_group_lag_max_entries",
            "The slowest consumer group's lag (ingestion_consumer_group_lag_entries).",
        )
        for job, info in sorted(self.info.items()):
            entries.add_metric([job], info.length)
            trimmed.add_metric([job], info.trimmed)
            known = [(g.name, g.unacknowledged) for g in info.groups if g.unacknowledged is not None]
            for name, value in known:
                lag.add_metric([job, name], value)
            if known:
                slowest.add_metric([job], max(v for _, v in known))
        yield from (entries, trimmed, lag, slowest)


StreamReader = Callable[[], Awaitable[StreamInfo]]


class NodeMetrics:
    """The metrics of one node process: a private registry fed by its jobs' observers, and by
    their events streams read from Redis at each scrape (``stream_info``: job -> reader)."""

    def __init__(
        self,
        observers: NodeObserver | Sequence[NodeObserver],
        clock: Callable[[], float] = trio.current_time,
        stream_info: Mapping[str, StreamReader] | StreamReader | None = None,
    ):
        self.observers = [observers] if isinstance(observers, NodeObserver) else list(observers)
        self.observer = self.observers[0]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ObserverCollector(self.observers, clock))
        if stream_info is not None and not isinstance(stream_info, Mapping):
            stream_info = {self.observer.job: stream_info}
        self._stream_info = dict(stream_info or {})
        self._stream = _StreamCollector()
        self.registry.register(self._stream)
        self.commit_latency = Histogram(
            "ingestion_commit_latency_seconds",
            "Time from sending a fenced commit to Redis until its answer.",
            labelnames=["job"],
            buckets=COMMIT_LATENCY_BUCKETS,
            registry=self.registry,
        )
        closers = []
        for observer in self.observers:
            closers.append(observer.subscribe(functools.partial(self._on_event, observer.job)))
            self.commit_latency.labels(observer.job)  # present from the start, at 0
        self.close = lambda: [close() for close in closers]

    def _on_event(self, job: str, event: str, fields: dict[str, Any]) -> None:
        if event == "committed":
            self.commit_latency.labels(job).observe(float(fields["latency"]))

    async def refresh(self) -> None:
        """Read each job's events stream from Redis (one bounded call each, side by side); a job
        whose stream cannot be read is left out of this scrape rather than shown stale."""
        fresh: dict[str, StreamInfo] = {}

        async def read(job: str, reader: StreamReader) -> None:
            try:
                fresh[job] = await reader()
            except RedisUnavailable:
                pass

        async with trio.open_nursery() as nursery:
            for job, reader in self._stream_info.items():
                nursery.start_soon(read, job, reader)
        self._stream.info = fresh

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
            snaps = [o.snapshot() for o in metrics.observers]
            ok = any(snap.role != "stopped" for snap in snaps)
            doc: dict[str, Any] = {"status": "ok" if ok else "stopped", "node": snaps[0].node}
            if len(snaps) == 1:
                doc.update(job=snaps[0].job, role=snaps[0].role, source_up=snaps[0].source_up)
            else:
                doc["jobs"] = {snap.job: snap.role for snap in snaps}
                doc["source_up"] = {snap.job: snap.source_up for snap in snaps}
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
    observer: NodeObserver | Sequence[NodeObserver],
    log: Any,
    *,
    stream_info: Mapping[str, StreamReader] | StreamReader | None = None,
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
