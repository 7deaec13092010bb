"""One node process: settings in, a running node out, until SIGINT/SIGTERM.

Builds each job's lease store, source and sink from the settings (:mod:`ingestion.node.build`),
starts the supervisor (and the metrics and status endpoints when configured), and turns the first
SIGINT or SIGTERM into a graceful shutdown: ingestion stops, the in-flight commit finishes, the
lease is released so a standby takes over at once, and the process exits 0. A second signal cancels
at once (the lease is still released, under a short shielded scope).
"""

from __future__ import annotations

import errno
import functools
import math
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis
import structlog
import trio
from redis.exceptions import RedisClusterException

from actors.clock import BootClock
from actors.lease_store import (
    LeaseStore,
    NodeRegistry,
    examine_redis,
    job_keys,
)
from actors.lease_store.connect import ClusterUnreachable, describe_redis_error
from actors.observe import NodeObserver
from actors.source import Source
from actors.supervisor import JobRun, JobsHandle, NodeSpec, run_jobs
from ingestion.backfill.runner import BackfillRunner
from ingestion.backfill.status import backfill_doc, listed_jobs
from ingestion.common.gaps import history_gap_listener
from ingestion.config import ConfigError, JobSettings, Settings, redact_url
from ingestion.decode.stage import decode_error_listener
from ingestion.node import heap, stop_signals
from ingestion.node.build import _job_summary, build_sink, build_source, build_store
from ingestion.node.claim import NodeClaim
from ingestion.node.identity import _identified, check_identities
from ingestion.node.logs import configure_logging, node_logger
from ingestion.node.network import guarded
from ingestion.node.preflight import PREFLIGHT_TIMEOUT, StartupError
from ingestion.node.sd_notify import notify
from ingestion.serve.presence import keep_present
from ingestion.serve.status import serve_status

if TYPE_CHECKING:  # (prometheus_client is loaded with the metrics port only: start-up time)
    from prometheus_client.registry import Collector


def start_node(settings: Settings, lease_pipe: int | None = None) -> int:
    """Run the node until it stops; its exit status. ``lease_pipe``: in a worker process, where
    to report each lease acquired and released to the parent (ingestion/node/parent.py).

    Raises:
        ConfigError: a listen socket could not be bound, or Redis holds the job under another
            source (one line naming the setting), before the node campaigned.
    """
    try:
        return trio.run(run_node_process, settings, lease_pipe, clock=BootClock())
    except* StartupError as group:
        raise ConfigError([str(e) for e in _leaves(group)]) from None


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


OUTAGE_QUIET = 10.0  # seconds without redis-unavailable that end an outage (electors retry every 2 s at most)


RECHECK_INTERVAL = 1.0  # seconds between questions to a Redis that does not answer


async def connect_redis(settings: Settings, log: Any, *, retry_cap: float = 2.0) -> redis.Redis:
    """The client of ``redis.url``. A cluster client reads the slot map when it is built: while no
    node answers, that is an outage like any other (``redis-unavailable``, retried with backoff up
    to ``retry_cap`` seconds), not a crash.

    Raises:
        StartupError: a node answered, but not as a cluster (one line, exit 2).
    """
    r = settings.redis
    attempt = 0
    while True:
        try:
            return await trio.to_thread.run_sync(r.connect, abandon_on_cancel=True)
        except ClusterUnreachable as exc:
            attempt += 1
            delay = min(retry_cap, 0.1 * 2 ** min(attempt, 10))
            log.warning(
                "redis-unavailable", attempt=attempt, retry_in=delay,
                error=describe_redis_error(exc, where=redact_url(r.url)),
            )  # fmt: skip
            await trio.sleep(delay)
        except RedisClusterException as exc:
            raise StartupError(f"redis.url {redact_url(r.url)}: {exc}") from exc


async def diagnose_after_outages(
    settings: Settings,
    observers: list[NodeObserver],
    *,
    quiet: float = OUTAGE_QUIET,
    interval: float = RECHECK_INTERVAL,
) -> None:
    """The start-up checks of what ``redis.url`` reaches (:func:`~ingestion.node.preflight.preflight`),
    run again once per outage: an outage is retried, but a Redis that comes back (or first answers) with
    a password the URL lacks, fewer databases or an ACL that denies the keys would be retried
    forever. After a ``redis-unavailable``, ask until a server answers; the outage ends once no job
    has seen ``redis-unavailable`` for ``quiet`` seconds.

    Raises:
        StartupError: what answered is wrong in a way retrying cannot fix (one line, exit 2).
    """
    r = settings.redis
    examine = functools.partial(
        examine_redis, r.url, [job_keys(j)["cursor"] for j in settings.node.jobs],
        timeout=max(r.timeout_ms / 1000, PREFLIGHT_TIMEOUT), tls_ca_file=r.tls_ca_file or None,
        tls_cert_file=r.tls_cert_file or None, tls_key_file=r.tls_key_file or None,
    )  # fmt: skip
    last_failure = -math.inf
    failed = trio.Event()

    def listen(event: str, _fields: dict[str, Any]) -> None:
        nonlocal last_failure
        if event == "redis-unavailable":
            last_failure = trio.current_time()
            failed.set()

    unsubscribe = [o.subscribe(listen) for o in observers]
    try:
        while True:
            await failed.wait()
            while True:
                diagnosis = await trio.to_thread.run_sync(examine, abandon_on_cancel=True)
                if diagnosis.mistake:
                    raise StartupError(f"redis.url {redact_url(r.url)}: {diagnosis.mistake}")
                if diagnosis.reached:
                    break
                await trio.sleep(interval)
            while True:  # the same outage, until it has been quiet that long
                failed = trio.Event()
                with trio.move_on_at(last_failure + quiet) as still_quiet:
                    await failed.wait()
                if still_quiet.cancelled_caught:
                    break
    finally:
        for stop in unsubscribe:
            stop()


def _redis_mistake(settings: Settings) -> str | None:
    """What is wrong with what ``redis.url`` reaches, as the start-up checks word it (blocking)."""
    r = settings.redis
    return examine_redis(
        r.url, [job_keys(j)["cursor"] for j in settings.node.jobs],
        timeout=max(r.timeout_ms / 1000, PREFLIGHT_TIMEOUT), tls_ca_file=r.tls_ca_file or None,
        tls_cert_file=r.tls_cert_file or None, tls_key_file=r.tls_key_file or None,
    ).mistake  # fmt: skip


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


def _count_decode_errors(observers: dict[str, NodeObserver], count: int) -> None:
    """A job's stage handed on records that could not be decoded (the job is bound in the
    calling task's log context)."""
    job = structlog.contextvars.get_contextvars().get("job")
    if job in observers:
        observers[job].decode_failed(count)


def _job_source(settings: Settings, job: JobSettings, store: LeaseStore) -> Source:
    """A job's source as a node runs it: checked against its network (ingestion/node/network.py),
    then against what Redis says it follows and where it commits (ingestion/node/identity.py)."""
    n = settings.network
    checked = guarded(
        build_source(settings, job, store), store, job,
        check_interval=n.check_ms / 1000, reset_after=n.reset_after_ms / 1000,
    )  # fmt: skip
    return _identified(checked, store, job, settings.sink.schema)


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


async def run_node_process(settings: Settings, lease_pipe: int | None = None) -> int:
    """Host every configured job under one nursery until SIGINT/SIGTERM (exit 0) or until no job
    is left because each stopped fatally (exit 1). A job that fails fatally stops alone. With
    ``lease_pipe`` (a worker under ingestion/node/parent.py) each lease acquired or released is
    reported there."""
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
        pid=os.getpid(),
        parent_pid=os.getppid() if lease_pipe is not None else None,
    )
    client: redis.Redis | None = None
    stop_asked = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop_signals.release()  # held since start-up (ingestion/node/stop_signals.py): received here
        async with trio.open_nursery() as nursery:  # a SIGTERM while Redis is away stops the wait

            async def stop_waiting() -> None:
                nonlocal stop_asked
                async for _ in signals:
                    stop_asked = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(stop_waiting)
            client = await connect_redis(settings, log)
            nursery.cancel_scope.cancel()
        stop_signals.hold()  # until the next receiver (one left pending is delivered to it)
    if client is None or stop_asked:
        # (a signal taken just as the connection was made stops the node too: it is not lost)
        if client is not None:
            client.close()
        log.info("node-stopped", reason="shutdown")
        return 0
    stores = {j.name: build_store(settings, j.name, client) for j in settings.jobs}
    sinks = {j.name: build_sink(settings, j, stores[j.name]) for j in settings.jobs}
    if lease_pipe is not None:
        from ingestion.node.lease_reports import lease_reporter  # lazy: start-up (~1 ms): parent only

        for store in stores.values():
            store.on_lease = lease_reporter(lease_pipe, log)
    observers = {j.name: NodeObserver(settings.node.id, j.name) for j in settings.jobs}
    history_gap_listener.set(functools.partial(_count_history_gap, observers))
    decode_error_listener.set(functools.partial(_count_decode_errors, observers))
    fatal: dict[str, str] = {}
    signalled = False
    runs = [
        JobRun(
            stores[j.name],
            _job_source(settings, j, stores[j.name]),
            node_spec(settings, j),
            node_logger(settings.node.id, j.name),
            observers[j.name],
            sinks[j.name],
        )
        for j in settings.jobs
    ]

    def on_fatal(job: str, error: str) -> None:
        fatal[job] = error
        node_logger(settings.node.id, job).error("job-stopped", reason="ingestion-fatal", error=error)

    def range_run(job: JobSettings) -> JobRun:
        """A backfill's range job (ingestion/backfill/), built like a configured one."""
        store = build_store(settings, job.name, client)
        if lease_pipe is not None:
            from ingestion.node.lease_reports import lease_reporter  # lazy: start-up (~1 ms): parent only

            store.on_lease = lease_reporter(lease_pipe, log)
        return JobRun(
            store, _job_source(settings, job, store),
            node_spec(settings, job), node_logger(settings.node.id, job.name),
            NodeObserver(settings.node.id, job.name), build_sink(settings, job, store),
        )  # fmt: skip

    registry = NodeRegistry(client)
    backfills = BackfillRunner(
        settings.jobs, stores, registry, range_run, log, interval=settings.lease.ttl_ms / 1000,
        schema=settings.sink.schema,
    )

    claim = NodeClaim(
        client, settings.node.id, settings.lease.ttl_ms, log, redact_url(settings.redis.url),
        functools.partial(_redis_mistake, settings),
    )  # fmt: skip
    stopped_starting = claim_lost = False
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            stop_signals.release()
            async with trio.open_nursery() as nursery:

                async def jobs_then_stop(*, task_status: trio.TaskStatus[Any]) -> None:
                    try:
                        await run_jobs(
                            runs, log, registry=registry, on_fatal=on_fatal, task_status=task_status
                        )
                    finally:
                        nursery.cancel_scope.cancel()

                # Everything that can refuse to start does so before the node campaigns, and a
                # stop signal meanwhile ends start-up at once (the claim may wait up to a TTL).
                with trio.CancelScope() as starting:
                    async with trio.open_nursery() as watching:

                        async def stop_starting() -> None:
                            nonlocal stopped_starting
                            async for signum in signals:
                                stopped_starting = True
                                log.info("shutdown-requested", signal=signal.Signals(signum).name)
                                starting.cancel()
                                return

                        watching.start_soon(stop_starting)
                        await _start_endpoints(
                            nursery, settings, list(observers.values()), log, stores, runs, backfills
                        )
                        nursery.start_soon(diagnose_after_outages, settings, list(observers.values()))
                        await claim.claim()  # one running node per node id (ingestion/node/claim.py)
                        await nursery.start(claim.keep)
                        nursery.start_soon(
                            keep_present, client, settings.node.id, list(observers.values()),
                            {j.name: j.kind for j in settings.jobs}, settings.lease.ttl_ms, log,
                            _webhook_figures(runs),
                        )  # fmt: skip
                        await check_identities(settings, stores)
                        watching.cancel_scope.cancel()
                if stopped_starting:
                    nursery.cancel_scope.cancel()  # nothing campaigned: the endpoints (and the claim) end
                else:
                    handle = await nursery.start(jobs_then_stop)
                    backfills.parent_able = functools.partial(_able, handle)
                    if backfills.hosted:
                        await nursery.start(backfills.run)
                    _tell_service_manager(log, "READY=1")
                    heap.settle(log)  # serving: the start-up heap is frozen (ingestion/node/heap.py)

                    async def stop_on_claim_lost() -> None:
                        nonlocal claim_lost
                        await claim.lost.wait()
                        claim_lost = True
                        await backfills.shutdown("node-id-claim-lost")
                        await handle.shutdown("node-id-claim-lost")

                    nursery.start_soon(stop_on_claim_lost)
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if signalled:
                            log.warning("shutdown-forced", signal=name)
                            nursery.cancel_scope.cancel()
                            break
                        signalled = True
                        log.info("shutdown-requested", signal=name)
                        _tell_service_manager(log, "STOPPING=1")
                        await backfills.shutdown(name)  # its ranges release their leases first
                        await handle.shutdown(name)
    finally:
        client.close()
        for sink in sinks.values():
            if sink is not None:
                sink.close()  # type: ignore[attr-defined]
    if claim_lost and not signalled:
        log.error("node-stopped", reason="node-id-claim-lost")
        return 1
    if fatal and not signalled:
        log.error("node-stopped", reason="ingestion-fatal", error="; ".join(
            f"{job}: {error}" for job, error in fatal.items()
        ))
        return 1
    log.info("node-stopped", reason="shutdown")
    return 0


def _webhook_figures(runs: Sequence[JobRun]) -> dict[str, Callable[[], dict[str, Any]]]:
    """A webhook job's delivery figures for its presence report (the console shows them)."""
    from ingestion.webhook.source import WebhookSource  # lazy: node start-up (~15 ms): webhook jobs only

    def figures(source: WebhookSource) -> Callable[[], dict[str, Any]]:
        def now() -> dict[str, Any]:
            s = source.stats
            lag = s.lag_seconds(int(time.time() * 1000))
            return {"delivery": s.state, "delivered": s.delivered, "dead_letters": s.dead_letters,
                    "lag": round(lag, 3)}  # fmt: skip

        return now

    return {r.store.job: figures(r.source) for r in runs if isinstance(r.source, WebhookSource)}


def audit_stats(runs: Sequence[JobRun]) -> dict[str, Any]:
    """job -> the stats of each audit job among ``runs`` (ingestion/audit/job.py: their metrics)."""
    from ingestion.audit.job import AuditStep  # lazy: node start-up (~40 ms)

    return {
        r.store.job: step.stats for r in runs
        if isinstance(step := getattr(r.source, "action", None), AuditStep)
    }  # fmt: skip


def _able(handle: JobsHandle, job: str) -> frozenset[str] | None:
    """The other nodes able to lead ``job`` as its source watch sees them (None: no watch)."""
    hosted = handle.handles.get(job)
    return hosted.watch.able if hosted is not None and hosted.watch is not None else None


def _listen_problem(exc: OSError, key: str, host: str, port: int) -> str:
    """One line for a listen socket that could not be bound, naming the setting and the fix."""
    flag = "--metrics-port" if key == "metrics_port" else "--status-port"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"observe.{key}: port {port} on {host} is already in use (another process listens "
            f"there): choose another {flag}, or stop that process"
        )
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"observe.listen_host: cannot listen on {host!r}: {exc.strerror or exc}: give an "
            "address of this machine, such as 127.0.0.1 or 0.0.0.0 (INGESTION_OBSERVE_LISTEN_HOST)"
        )
    if exc.errno == errno.EACCES:
        return f"observe.{key}: port {port} needs privileges: choose a port above 1023 ({flag})"
    return f"observe.{key}: cannot listen on {host}:{port}: {exc.strerror or exc}"


def _no_api() -> None:
    return None  # this node serves no events API (api.port 0): none on its console


async def _bind(
    nursery: trio.Nursery, key: str, host: str, port: int, serve: Callable[..., Awaitable[None]],
    *args: Any,
) -> None:
    """Start one listening endpoint; a socket that cannot be bound is a ``StartupError``."""
    try:
        await nursery.start(serve, host, port, *args)
    except* OSError as group:
        raise StartupError(_listen_problem(_leaves(group)[0], key, host, port)) from None  # type: ignore[arg-type]


async def _start_endpoints(
    nursery: trio.Nursery,
    settings: Settings,
    observers: list[NodeObserver],
    log: Any,
    stores: dict[str, LeaseStore],
    runs: Sequence[JobRun] = (),
    backfills: BackfillRunner | None = None,
) -> None:
    """Start the metrics and status endpoints and the events API when configured (see
    ingestion.serve.metrics/status, ingestion.api)."""
    o = settings.observe
    api_collectors: list[Collector] = []
    api_view: Callable[[], dict[str, Any] | None] = _no_api
    if settings.api.port:
        from ingestion.api.service import ApiStartError, build_app, serve_settings  # lazy: start-up (~170 ms)

        try:
            app = build_app(settings, log)
            await nursery.start(serve_settings, app, settings, log)
        except ApiStartError as exc:
            raise StartupError(str(exc)) from None
        api_collectors.append(app.metrics)
        api_view = app.console_view
    if o.metrics_port:
        from ingestion.serve.metrics import serve_metrics  # lazy: node start-up (hypercorn, ~180 ms)
        from ingestion.webhook.metrics import WebhookCollector  # lazy: node start-up (~40 ms)
        from ingestion.webhook.source import WebhookSource  # lazy: node start-up (~15 ms)

        readers = {job: store.events_info for job, store in stores.items()}
        hooks = {r.store.job: r.source.stats for r in runs if isinstance(r.source, WebhookSource)}
        collectors: list[Collector] = [WebhookCollector(hooks)] if hooks else []
        audits = audit_stats(runs)
        if audits:
            from ingestion.audit.metrics import AuditCollector  # lazy: node start-up: audit jobs only

            collectors.append(AuditCollector(audits))
        collectors += api_collectors
        if backfills is not None and backfills.hosted:
            from ingestion.backfill.metrics import BackfillCollector  # lazy: node start-up: backfills only

            collectors.append(BackfillCollector(lambda: backfills.progress, settings.node.id))
        from ingestion.serve.console import ClusterReader  # lazy: node start-up (~80 ms)

        sinks = {j.name: j.sink for j in settings.jobs}
        console = ClusterReader(
            next(iter(stores.values())).client, settings.node.id, {j.name: j.kind for j in settings.jobs},
            token=o.console_token, streams=o.console_streams, discover=listed_jobs, api=api_view,
            backfill=lambda client, job: backfill_doc(client, job, sinks.get(job, ""), settings.sink.schema),
        )  # fmt: skip
        await nursery.start(console.run)
        await _bind(
            nursery, "metrics_port", o.listen_host, o.metrics_port,
            functools.partial(
                serve_metrics, stream_info=readers, ttl=settings.lease.ttl_ms / 1000, collectors=collectors,
                console=console,
            ),
            observers, log,
        )  # fmt: skip
    if o.status_port:
        await _bind(nursery, "status_port", o.listen_host, o.status_port, serve_status, observers, log)
