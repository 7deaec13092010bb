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

import structlog
import trio

from actors.elector import IngestionFatal
from actors.lease_store import (
    LeaseStore,
    connect,
    is_sentinel_url,
    parse_sentinel_url,
    sentinel_services,
)
from actors.observe import NodeObserver
from actors.source import current_term
from actors.supervisor import NodeSpec, run_node
from actors.token_memory import TokenMemory
from ingestion.config import ConfigError, Settings, redact_url
from ingestion.horizon import HorizonSource
from ingestion.logs import configure_logging, node_logger


def build_source(settings: Settings, store: LeaseStore | None = None) -> HorizonSource:
    h = settings.horizon
    return HorizonSource(
        urls=h.urls,
        resource=h.resource,
        connect_timeout=h.connect_timeout_ms / 1000,
        read_timeout=h.read_timeout_ms / 1000,
        stream_idle_timeout=h.stream_idle_timeout_ms / 1000,
        retry_base=h.retry_base_ms / 1000,
        retry_cap=h.retry_cap_ms / 1000,
        attempts_per_url=h.failover_after,
        not_found_give_up=h.not_found_give_up_ms / 1000,
        stale_check_interval=h.stale_check_ms / 1000,
        stale_after_ledgers=h.stale_after_ledgers,
        on_history_gap=h.on_history_gap,
        audit=None if store is None else audit_writer(store),
    )


def audit_writer(store: LeaseStore) -> Callable[[str, dict[str, str]], Awaitable[bool]]:
    """``await audit(event, fields)``: a fenced audit entry under the calling term's token."""

    async def audit(event: str, fields: dict[str, str]) -> bool:
        term = current_term.get()
        return await store.fenced_audit(term.node, term.token, event, fields) is None

    return audit


def build_store(settings: Settings) -> LeaseStore:
    r = settings.redis
    client = connect(
        r.url,
        timeout=r.timeout_ms / 1000,
        tls_ca_file=r.tls_ca_file or None,
        tls_cert_file=r.tls_cert_file or None,
        tls_key_file=r.tls_key_file or None,
    )
    return LeaseStore(
        client,
        settings.node.job,
        min_replicas_acked=r.min_replicas_acked,
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
    try:
        TokenMemory(settings.node.job, settings.node.state_dir or None)
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


def node_spec(settings: Settings) -> NodeSpec:
    return NodeSpec(
        node=settings.node.id,
        job=settings.node.job,
        ttl_ms=settings.lease.ttl_ms,
        timing=settings.lease.timing,
        jitter=settings.lease.standby_jitter_ms / 1000,
        start_cursor=settings.horizon.start_cursor,
        state_dir=settings.node.state_dir or None,
    )


async def run_node_process(settings: Settings) -> int:
    configure_logging(settings.log.level, settings.log.format)
    # Bound in the context too, so that every task's log lines (the Horizon source's included)
    # carry the node and the job.
    structlog.contextvars.bind_contextvars(node=settings.node.id, job=settings.node.job)
    log = node_logger(settings.node.id, settings.node.job)
    spec = node_spec(settings)
    observer = NodeObserver(spec.node, spec.job)
    log.info(
        "node-starting",
        redis=redact_url(settings.redis.url),
        horizon=list(settings.horizon.urls),
        resource=settings.horizon.resource,
        lease_ttl_ms=spec.ttl_ms,
        renew_interval_ms=settings.lease.renew_interval_ms,
        safety_margin_ms=settings.lease.safety_margin_ms,
        redis_timeout_ms=settings.redis.timeout_ms,
        min_replicas_acked=settings.redis.min_replicas_acked,
        events_max_len=settings.events.max_len,
        state_dir=settings.node.state_dir or None,
        clock=getattr(trio.lowlevel.current_clock(), "name", type(trio.lowlevel.current_clock()).__name__),
    )
    store = build_store(settings)
    source = build_source(settings, store)
    fatal: BaseException | None = None
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def node_then_stop(*, task_status: trio.TaskStatus[Any]) -> None:
                    try:
                        await run_node(store, source, spec, log, observer, task_status=task_status)
                    finally:
                        nursery.cancel_scope.cancel()

                handle = await nursery.start(node_then_stop)
                await _start_endpoints(nursery, settings, observer, log, store)
                shutting_down = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if shutting_down:
                        log.warning("shutdown-forced", signal=name)
                        nursery.cancel_scope.cancel()
                        break
                    shutting_down = True
                    log.info("shutdown-requested", signal=name)
                    await handle.shutdown(name)
    except* IngestionFatal as group:
        fatal = group.exceptions[0]  # raised through the supervisor's and this nursery
    finally:
        store.client.close()
    if fatal is not None:
        log.error("node-stopped", reason="ingestion-fatal", error=str(fatal))
        return 1
    log.info("node-stopped", reason="shutdown")
    return 0


async def _start_endpoints(
    nursery: trio.Nursery, settings: Settings, observer: NodeObserver, log: Any, store: LeaseStore
) -> None:
    """Start the metrics and status endpoints when configured (see ingestion.metrics/status)."""
    o = settings.observe
    if o.metrics_port:
        from ingestion.metrics import serve_metrics

        await nursery.start(
            functools.partial(serve_metrics, stream_info=store.events_info),
            o.listen_host, o.metrics_port, observer, log,
        )
    if o.status_port:
        from ingestion.status import serve_status

        await nursery.start(serve_status, o.listen_host, o.status_port, observer, log)
