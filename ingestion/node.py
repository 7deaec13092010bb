"""One node process: settings in, a running node out, until SIGINT/SIGTERM.

Builds the Redis lease store and the Horizon source from the settings, starts the supervisor (and
the metrics and status endpoints when configured), and turns the first SIGINT or SIGTERM into a
graceful shutdown: ingestion stops, the in-flight commit finishes, the lease is released so a
standby takes over at once, and the process exits 0. A second signal cancels at once (the lease is
still released, under a short shielded scope).
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import structlog
import trio

from actors.lease_store import (
    LeaseStore,
    NodeRegistry,
    is_sentinel_url,
    parse_sentinel_url,
    sentinel_services,
)
from actors.observe import NodeObserver
from actors.scheduled import ScheduledJob
from actors.source import Source, current_term
from actors.supervisor import JobRun, NodeSpec, run_jobs
from actors.token_memory import TokenMemory
from ingestion.config import ConfigError, JobSettings, Settings, load_action, redact_url
from ingestion.gaps import history_gap_listener
from ingestion.horizon.source import HorizonSource
from ingestion.logs import configure_logging, node_logger
from ingestion.sd_notify import notify


def build_source(
    settings: Settings, job: JobSettings | None = None, store: LeaseStore | None = None
) -> Source:
    """The source of ``job`` (default: the node's first job); ``store`` (the job's) lets the
    Horizon source write fenced audit entries (a skipped history gap).

    Raises:
        ValueError: the job's resource or action cannot be used.
    """
    job = job or settings.jobs[0]
    if job.kind == "scheduled":
        action = load_action(job.action)
        if action is None:
            raise ValueError(f"cannot import the action {job.action!r}")
        return ScheduledJob(action, period=job.period_ms / 1000)
    if job.kind == "rpc":
        from ingestion.rpc.source import RpcSource

        r = settings.rpc
        return RpcSource(
            urls=job.rpc_urls,
            filters=job.rpc_filters(),
            connect_timeout=r.connect_timeout_ms / 1000,
            request_timeout=r.request_timeout_ms / 1000,
            retry_base=r.retry_base_ms / 1000,
            retry_cap=r.retry_cap_ms / 1000,
            attempts_per_url=r.failover_after,
            page_limit=r.page_limit,
            on_history_gap=r.on_history_gap,
            reset_after=r.reset_after_ms / 1000,
            audit=None if store is None else audit_writer(store),
        )
    h = settings.horizon
    return HorizonSource(
        urls=job.horizon_urls,
        resource=job.resource,
        connect_timeout=h.connect_timeout_ms / 1000,
        read_timeout=h.read_timeout_ms / 1000,
        stream_idle_timeout=h.stream_idle_timeout_ms / 1000,
        retry_base=h.retry_base_ms / 1000,
        retry_cap=h.retry_cap_ms / 1000,
        attempts_per_url=h.failover_after,
        parallel_requests=h.parallel_requests,
        not_found_give_up=h.not_found_give_up_ms / 1000,
        stale_check_interval=h.stale_check_ms / 1000,
        stale_after_ledgers=h.stale_after_ledgers,
        on_history_gap=h.on_history_gap,
        audit=None if store is None else audit_writer(store),
    )


def _job_summary(job: JobSettings) -> dict[str, Any]:
    if job.kind == "horizon":
        return {"job": job.name, "kind": job.kind, "resource": job.resource or None}
    if job.kind == "rpc":
        return {
            "job": job.name, "kind": job.kind, "rpc": list(job.rpc_urls),
            "filters": [f.to_json() for f in job.rpc_filters()],
        }  # fmt: skip
    return {"job": job.name, "kind": job.kind, "action": job.action}


def audit_writer(store: LeaseStore) -> Callable[[str, dict[str, str]], Awaitable[bool]]:
    """``await audit(event, fields)``: a fenced audit entry under the calling term's token."""

    async def audit(event: str, fields: dict[str, str]) -> bool:
        term = current_term.get()
        return await store.fenced_audit(term.node, term.token, event, fields) is None

    return audit


def build_store(settings: Settings, job: str | None = None, client: redis.Redis | None = None) -> LeaseStore:
    """The lease store of ``job`` (default: the first), on ``client`` (default: a new one)."""
    return LeaseStore(
        client if client is not None else settings.redis.connect(),
        job or settings.node.job,
        min_replicas_acked=settings.redis.min_replicas_acked,
        events_max_len=settings.events.max_len,
    )


def preflight(settings: Settings) -> None:
    """Checks that need more than the settings' text, before the node starts.

    Raises:
        ConfigError: the token memory in node.state_dir is unusable, or every sentinel that
            answered says it does not monitor the URL's service. Sentinels that do not answer
            are an outage, not a configuration error: the node starts, logs
            ``redis-unavailable`` and waits for them.
    """
    for job in settings.node.jobs:
        try:
            TokenMemory(job, settings.node.state_dir or None)
        except (OSError, ValueError) as exc:
            raise ConfigError([f"node.state_dir: {exc}"]) from exc
    url = settings.redis.url
    if not is_sentinel_url(url):
        return
    target = parse_sentinel_url(url)
    _unreachable, known = sentinel_services(target, settings.redis.timeout_ms / 1000)
    if known and not any(target.service in services for services in known.values()):
        monitored = sorted({s for services in known.values() for s in services})
        raise ConfigError([
            f"redis.url: no sentinel at {','.join(known)} monitors a service named "
            f"{target.service!r} (they monitor: {', '.join(monitored) or 'nothing'})"
        ])


def _tell_service_manager(log: Any, state: str) -> None:
    """``READY=1`` once serving, ``STOPPING=1`` on shutdown: for a systemd ``Type=notify`` unit."""
    try:
        notify(state)
    except OSError as exc:
        log.warning("sd-notify-failed", state=state, error=str(exc))


def _count_history_gap(observers: dict[str, NodeObserver], action: str, fields: Any) -> None:
    """A job's source met a history gap: the job is bound in the calling task's log context."""
    job = structlog.contextvars.get_contextvars().get("job")
    if job in observers:
        observers[job].history_gap(action, **fields)


def node_spec(settings: Settings, job: JobSettings | None = None) -> NodeSpec:
    job = job or settings.jobs[0]
    return NodeSpec(
        node=settings.node.id,
        job=job.name,
        ttl_ms=settings.lease.ttl_ms,
        timing=settings.lease.timing,
        jitter=settings.lease.standby_jitter_ms / 1000,
        start_cursor=job.start_cursor,
        state_dir=settings.node.state_dir or None,
        handover_after=settings.horizon.handover_after_ms / 1000,
    )


async def run_node_process(settings: Settings) -> int:
    """Host every configured job under one nursery until SIGINT/SIGTERM (exit 0) or until no job
    is left because each stopped fatally (exit 1). A job that fails fatally stops alone."""
    configure_logging(settings.log.level, settings.log.format)
    # Bound in the context too, so that every task's log lines carry the node (and, inside a
    # job's tasks, the job: bound there).
    structlog.contextvars.bind_contextvars(node=settings.node.id)
    log = node_logger(settings.node.id, ",".join(settings.node.jobs))
    log.info(
        "node-starting",
        redis=redact_url(settings.redis.url),
        jobs=[_job_summary(j) for j in settings.jobs],
        horizon=list(settings.horizon.urls),
        resource=settings.horizon.resource,
        lease_ttl_ms=settings.lease.ttl_ms,
        renew_interval_ms=settings.lease.renew_interval_ms,
        safety_margin_ms=settings.lease.safety_margin_ms,
        redis_timeout_ms=settings.redis.timeout_ms,
        min_replicas_acked=settings.redis.min_replicas_acked,
        events_max_len=settings.events.max_len,
        state_dir=settings.node.state_dir or None,
        clock=getattr(trio.lowlevel.current_clock(), "name", type(trio.lowlevel.current_clock()).__name__),
    )
    client = settings.redis.connect()
    stores = {j.name: build_store(settings, j.name, client) for j in settings.jobs}
    observers = {j.name: NodeObserver(settings.node.id, j.name) for j in settings.jobs}
    history_gap_listener.set(functools.partial(_count_history_gap, observers))
    fatal: dict[str, str] = {}
    signalled = False
    runs = [
        JobRun(
            stores[j.name],
            build_source(settings, j, stores[j.name]),
            node_spec(settings, j),
            node_logger(settings.node.id, j.name),
            observers[j.name],
        )
        for j in settings.jobs
    ]

    def on_fatal(job: str, error: str) -> None:
        fatal[job] = error
        node_logger(settings.node.id, job).error("job-stopped", reason="ingestion-fatal", error=error)

    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def jobs_then_stop(*, task_status: trio.TaskStatus[Any]) -> None:
                    try:
                        await run_jobs(
                            runs, log, registry=NodeRegistry(client), on_fatal=on_fatal,
                            task_status=task_status,
                        )  # fmt: skip
                    finally:
                        nursery.cancel_scope.cancel()

                handle = await nursery.start(jobs_then_stop)
                _tell_service_manager(log, "READY=1")
                await _start_endpoints(nursery, settings, list(observers.values()), log, stores)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signalled:
                        log.warning("shutdown-forced", signal=name)
                        nursery.cancel_scope.cancel()
                        break
                    signalled = True
                    log.info("shutdown-requested", signal=name)
                    _tell_service_manager(log, "STOPPING=1")
                    await handle.shutdown(name)
    finally:
        client.close()
    if fatal and not signalled:
        log.error("node-stopped", reason="ingestion-fatal", error="; ".join(
            f"{job}: {error}" for job, error in fatal.items()
        ))
        return 1
    log.info("node-stopped", reason="shutdown")
    return 0


async def _start_endpoints(
    nursery: trio.Nursery,
    settings: Settings,
    observers: list[NodeObserver],
    log: Any,
    stores: dict[str, LeaseStore],
) -> None:
    """Start the metrics and status endpoints when configured (see ingestion.metrics/status)."""
    o = settings.observe
    if o.metrics_port:
        from ingestion.metrics import serve_metrics

        readers = {job: store.events_info for job, store in stores.items()}
        await nursery.start(
            functools.partial(serve_metrics, stream_info=readers, ttl=settings.lease.ttl_ms / 1000),
            o.listen_host, o.metrics_port, observers, log,
        )  # fmt: skip
    if o.status_port:
        from ingestion.status import serve_status

        await nursery.start(serve_status, o.listen_host, o.status_port, observers, log)
