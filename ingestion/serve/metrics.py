"""Prometheus metrics and the health probes of one node, served over HTTP with hypercorn on trio.

Each node has its own :class:`prometheus_client.CollectorRegistry` (never the global one), so that
several in-process nodes can be scraped side by side. Gauges and counters are read from the
:class:`~actors.observe.NodeObserver` at scrape time; only the commit-latency histogram keeps
state of its own, fed by the observer's ``committed`` notifications. The per-job label is
``ingestion_job``: ``job`` and ``instance`` are Prometheus's own target labels, and a metric label
of either name would be renamed ``exported_job`` at scrape.

Endpoints (all GET or HEAD):

- ``/metrics``: the Prometheus text exposition (and the process collector's ``process_*``).
- ``/livez``: ``200 {"status": "alive", "node"}`` whenever it answers: the handler runs on the
  node's one trio loop, so an answer proves the loop is not stuck. Restart the node when it fails.
- ``/readyz``: ``200 {"status": "ready", ...}`` while at least one job can be served: it has joined
  the election, has not stopped, its source is not known to be down, and Redis answered a read of
  its keys within the last lease TTL; ``503 {"status": "not-ready", "reasons": [...]}`` otherwise.
  Redis is read again (one bounded call per job) when its last answer is older than a quarter TTL.
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

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.lease_store import RedisUnavailable, StreamInfo
from actors.observe import NodeObserver, NodeStatus
from ingestion import __version__
from ingestion.common.asgi import Receive, Scope, Send, serve_lifespan
from ingestion.serve.console import ClusterReader, is_console_path, serve_console

COMMIT_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, math.inf)
JOB_LABEL = "ingestion_job"  # not "job": that is Prometheus's own target label
PATHS = ("/metrics", "/livez", "/readyz", "/healthz")


class _ObserverCollector(Collector):
    """Everything that can be read from the observers' snapshots when Prometheus scrapes: one
    sample per job for each metric (label ``ingestion_job``)."""

    def __init__(self, observers: Sequence[NodeObserver], clock: Callable[[], float]) -> None:
        self._observers = observers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        snaps = [o.snapshot() for o in self._observers]
        build = GaugeMetricFamily(
            "ingestion_build_info", "The running version of ingestion (always 1).", labels=["version"]
        )
        build.add_metric([__version__], 1)
        info = GaugeMetricFamily(
            "ingestion_node_info", "This node's id and jobs (always 1).", labels=["node", JOB_LABEL]
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
            labels=[JOB_LABEL, "reason"],
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
        complete = _gauge(
            "ingestion_complete_through_ledger",
            "Leader only: the job's completeness watermark it last committed: every record the source "
            "holds for ledgers up to this one is committed (held at a known gap for good).",
        )
        latest = _gauge(
            "ingestion_source_latest_ledger",
            "Leader only: the source's latest closed ledger, as the source last said with a commit.",
        )
        decode_errors = _counter(
            "ingestion_decode_errors",
            "Records that could not be decoded, handed on to be committed as sent with a decodeError member.",
        )
        for s in snaps:
            job = [s.job]
            info.add_metric([s.node, s.job], 1)
            decode_errors.add_metric(job, s.decode_errors)
            if s.role == "leader" and s.complete_through_ledger is not None:
                complete.add_metric(job, s.complete_through_ledger)
            if s.role == "leader" and s.source_latest_ledger is not None:
                latest.add_metric(job, s.source_latest_ledger)
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
        gaps = CounterMetricFamily(
            "ingestion_history_gaps",
            "Times the job's position was older than the source's retained history, by action "
            "(stop: the job stopped, skip: records were skipped on purpose, lake: read from the data lake).",
            labels=[JOB_LABEL, "action"],
        )
        for s in snaps:  # both present from the start, at 0: increase() sees the first gap
            for action in ("skip", "stop", "lake"):
                gaps.add_metric([s.job, action], s.history_gaps.get(action, 0))
        yield from (build, info, gaps, leader, token, remaining, elections, losses, rejections, redis_errors,
                    ingested, commits, leaderless, lag, source_up, complete, latest,
                    decode_errors)  # fmt: skip


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[JOB_LABEL])


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=[JOB_LABEL])


@attrs.define
class RedisAnswers:
    """When Redis last answered a read of each job's keys (trio time), and the last error."""

    ttl: float
    answered: dict[str, float] = attrs.Factory(dict)
    errors: dict[str, str] = attrs.Factory(dict)

    def ok(self, job: str, now: float) -> None:
        self.answered[job] = now
        self.errors.pop(job, None)

    def failed(self, job: str, error: str) -> None:
        self.errors[job] = error

    def up(self, job: str, now: float) -> bool:
        """Redis answered for ``job`` within the last TTL."""
        at = self.answered.get(job)
        return at is not None and now - at <= self.ttl

    def older_than(self, jobs: Sequence[str], age: float, now: float) -> bool:
        return any(now - self.answered.get(job, -math.inf) > age for job in jobs)


def job_readiness(snap: NodeStatus, redis: RedisAnswers | None, now: float) -> list[str]:
    """Why this node cannot serve ``snap.job`` now (empty: it can). ``redis`` None: not checked."""
    reasons = []
    if snap.role == "stopped":
        reasons.append("stopped")
    elif snap.role == "starting":
        held = f": held off, {snap.held_off}" if snap.held_off else ""
        reasons.append(f"not yet joined the election{held}")
    if redis is not None and not redis.up(snap.job, now):
        at = redis.answered.get(snap.job)
        since = "never" if at is None else f"not for {now - at:.1f} s"
        error = redis.errors.get(snap.job)
        reasons.append(f"Redis answered {since}" + (f" ({error})" if error else ""))
    if snap.source_up is False:
        reasons.append("its source is unreachable")
    return reasons


def readiness(
    snaps: Sequence[NodeStatus], redis: RedisAnswers | None, now: float
) -> tuple[bool, dict[str, Any]]:
    """``(ready, the /readyz document)``: ready while at least one job can be served."""
    jobs: dict[str, Any] = {}
    reasons: list[str] = []
    for snap in snaps:
        why = job_readiness(snap, redis, now)
        jobs[snap.job] = {
            "ready": not why,
            "role": snap.role,
            "redis_up": None if redis is None else redis.up(snap.job, now),
            "source_up": snap.source_up,
            "reasons": why,
        }
        reasons += [f"{snap.job}: {reason}" for reason in why]
    ready = any(doc["ready"] for doc in jobs.values())
    status = "ready" if ready else "not-ready"
    doc: dict[str, Any] = {"status": status, "node": snaps[0].node, "jobs": jobs}
    if not ready:
        doc["reasons"] = reasons
    return ready, doc


class _RedisCollector(Collector):
    """Whether Redis answers each job, and each job's events stream as read from Redis at the
    last scrape (absent when unread)."""

    def __init__(self, answers: RedisAnswers, jobs: Sequence[str], clock: Callable[[], float]) -> None:
        self.info: dict[str, StreamInfo] = {}
        self._answers = answers
        self._jobs = jobs
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        if self._jobs:
            up = _gauge(
                "ingestion_redis_up",
                "1 while Redis answered a read of the job's keys within the last lease TTL, else 0.",
            )
            now = self._clock()
            for job in self._jobs:
                up.add_metric([job], 1 if self._answers.up(job, now) else 0)
            yield up
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
            labels=[JOB_LABEL, "group"],
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
    their events streams read from Redis at each scrape (``stream_info``: job -> reader). The
    same reads tell whether Redis answers (``ingestion_redis_up``, ``/readyz``); ``ttl`` is the
    lease TTL in seconds, how old an answer may be."""

    def __init__(
        self,
        observers: NodeObserver | Sequence[NodeObserver],
        clock: Callable[[], float] = trio.current_time,
        stream_info: Mapping[str, StreamReader] | StreamReader | None = None,
        ttl: float = 5.0,
    ):
        self.observers = [observers] if isinstance(observers, NodeObserver) else list(observers)
        self.observer = self.observers[0]
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ObserverCollector(self.observers, clock))
        if stream_info is not None and not isinstance(stream_info, Mapping):
            stream_info = {self.observer.job: stream_info}
        self._stream_info = dict(stream_info or {})
        self.redis = RedisAnswers(ttl)
        self._refreshing = trio.Lock()
        self._stream = _RedisCollector(self.redis, list(self._stream_info), clock)
        self.registry.register(self._stream)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.commit_latency = Histogram(
            "ingestion_commit_latency_seconds",
            "Time from sending a fenced commit to Redis until its answer.",
            labelnames=[JOB_LABEL],
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

    async def refresh(self, *, older_than: float = 0.0) -> None:
        """Read each job's events stream from Redis (one bounded call each, side by side); a job
        whose stream cannot be read is left out of this scrape rather than shown stale. With
        ``older_than``, only when some job's last answer is older than that (seconds)."""
        async with self._refreshing:
            jobs = list(self._stream_info)
            if older_than and not self.redis.older_than(jobs, older_than, self.clock()):
                return
            fresh: dict[str, StreamInfo] = {}

            async def read(job: str, reader: StreamReader) -> None:
                try:
                    fresh[job] = await reader()
                except RedisUnavailable as exc:
                    self.redis.failed(job, str(exc))
                else:
                    self.redis.ok(job, self.clock())

            async with trio.open_nursery() as nursery:
                for job, reader in self._stream_info.items():
                    nursery.start_soon(read, job, reader)
            self._stream.info = fresh

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, document)`` for ``/readyz``, reading Redis again if its answer is old."""
        await self.refresh(older_than=self.redis.ttl / 4)
        snaps = [o.snapshot() for o in self.observers]
        return readiness(snaps, self.redis if self._stream_info else None, self.clock())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(
    metrics: NodeMetrics, console: ClusterReader | None = None
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A tiny ASGI app: ``/metrics``, ``/livez``, ``/readyz`` and ``/healthz``, and with a
    ``console`` the operator console (``/`` and ``/console/...``, ingestion/serve/console/)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if console is not None and is_console_path(path):
            await serve_console(console, scope, receive, send)
            return
        doc: dict[str, Any]
        if scope["method"] not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"method not allowed\n"
        elif path == "/metrics":
            await metrics.refresh()
            status, ctype, body = 200, CONTENT_TYPE_LATEST, metrics.exposition()
        elif path == "/livez":
            doc = {"status": "alive", "node": metrics.observer.node}
            status, ctype, body = 200, "application/json", json.dumps(doc).encode()
        elif path == "/readyz":
            ready, doc = await metrics.readiness()
            status, ctype, body = (200 if ready else 503), "application/json", json.dumps(doc).encode()
        elif path in ("/healthz", "/health"):
            snaps = [o.snapshot() for o in metrics.observers]
            ok = any(snap.role != "stopped" for snap in snaps)
            doc = {"status": "ok" if ok else "stopped", "node": snaps[0].node}
            if len(snaps) == 1:
                doc.update(job=snaps[0].job, role=snaps[0].role, source_up=snaps[0].source_up)
            else:
                doc["jobs"] = {snap.job: snap.role for snap in snaps}
                doc["source_up"] = {snap.job: snap.source_up for snap in snaps}
            status, ctype, body = (200 if ok else 503), "application/json", json.dumps(doc).encode()
        else:
            status, ctype, body = 404, "text/plain", f"not found: try {', '.join(PATHS)}\n".encode()
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
    ttl: float = 5.0,
    collectors: Sequence[Collector] = (),
    console: ClusterReader | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``/metrics``, ``/livez``, ``/readyz`` and ``/healthz`` on ``host:port`` until
    cancelled. ``stream_info`` reads each job's stream (and so tells whether Redis answers);
    ``ttl`` is the lease TTL in seconds; ``collectors`` add job kinds' own metrics (webhooks);
    ``console`` serves the operator console on the same port.

    ``port`` 0 picks a free port. Calls ``task_status.started(port)`` with the bound port once the
    socket listens. A connection is bounded by hypercorn's keep-alive timeout until its request is
    whole; the console's live view then streams for as long as the browser stays.

    Raises:
        OSError: the address cannot be bound.
    """
    metrics = NodeMetrics(observer, stream_info=stream_info, ttl=ttl)
    for collector in collectors:  # the jobs' own (the webhook jobs')
        metrics.registry.register(collector)
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # our own log line below; hypercorn's would go to stderr unstructured
    config.keep_alive_timeout = 5  # also bounds a connection that has not sent a whole request yet
    config.read_timeout = None  # the console's live view (SSE) is a request that sends nothing more
    config.graceful_timeout = 1

    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                functools.partial(serve, metrics_app(metrics, console), config, mode="asgi")  # type: ignore[arg-type]
            )
            bound_port = int(binds[0].rsplit(":", 1)[-1])
            paths = [*PATHS, "/", "/console/"] if console is not None else list(PATHS)
            log.info("metrics-listening", host=host, port=bound_port, paths=paths)
            task_status.started(bound_port)
    finally:
        metrics.close()
