"""One node process: settings in, a running node out, until SIGINT/SIGTERM.

Builds the Redis lease store and the Horizon source from the settings, starts the supervisor (and
the metrics and status endpoints when configured), and turns the first SIGINT or SIGTERM into a
graceful shutdown: ingestion stops, the in-flight commit finishes, the lease is released so a
standby takes over at once, and the process exits 0. A second signal cancels at once (the lease is
still released, under a short shielded scope).
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis
import structlog
import trio
from redis.exceptions import RedisClusterException

from actors.clock import BootClock
from actors.lease_store import (
    LeaseStore,
    NodeRegistry,
    RedisUnavailable,
    diagnose_redis,
    examine_redis,
    is_sentinel_url,
    job_keys,
    parse_sentinel_url,
    sentinel_services,
)
from actors.lease_store.connect import ClusterUnreachable, describe_redis_error
from actors.lease_store.store import deployment_of_url
from actors.observe import NodeObserver
from actors.scheduled import ScheduledJob
from actors.sink import Sink
from actors.source import Batch, Source, SourceFatalError, TermFenced, current_term
from actors.supervisor import JobRun, NodeSpec, run_jobs
from actors.token_memory import TokenMemory
from ingestion.common.gaps import history_gap_listener
from ingestion.config import ConfigError, JobSettings, Settings, load_action, redact_url
from ingestion.horizon.source import HorizonSource
from ingestion.node import stop_signals
from ingestion.node.logs import configure_logging, node_logger
from ingestion.node.sd_notify import notify


def _rpc_history(settings: Settings, job: JobSettings) -> Any:
    """The lake an RPC job reads history older than RPC keeps from (``on_history_gap = "lake"``),
    with the job's filters; None otherwise."""
    if settings.rpc.on_history_gap != "lake":
        return None
    from ingestion.lake.source import LakeSource

    return LakeSource(
        settings.rpc.lake,
        filters=job.rpc_filters(),
        endpoint_url=settings.lake.endpoint_url,
        poll_interval=settings.lake.poll_interval_ms / 1000,
        read_ahead=settings.lake.read_ahead,
        decode_processes=settings.lake.decode_processes,
    )


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
    if job.kind == "lake":
        from ingestion.lake.source import LakeSource

        return LakeSource(
            job.lake_url,
            filters=job.rpc_filters(),
            endpoint_url=settings.lake.endpoint_url,
            poll_interval=settings.lake.poll_interval_ms / 1000,
            read_ahead=settings.lake.read_ahead,
            decode_processes=settings.lake.decode_processes,
        )
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
            history=_rpc_history(settings, job),
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
    if job.kind == "lake":
        return {
            "job": job.name, "kind": job.kind, "lake": job.lake_url,
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


PREFLIGHT_TIMEOUT = 2.0  # seconds, each start-up question to Redis (or PostgreSQL)


def build_sink(settings: Settings, job: JobSettings, store: LeaseStore) -> Sink | None:
    """The job's sink when it is not the Redis events stream (``job.sink``, a PostgreSQL URL)."""
    if not job.sink:
        return None
    from ingestion.postgres.sink import PostgresSink

    return PostgresSink(
        job.sink, job.name, schema=settings.sink.schema, call_timeout=store.call_timeout,
        events_max_len=settings.events.max_len, application=f"ingestion:{settings.node.id}",
    )  # fmt: skip


def check_sinks(settings: Settings, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """Create what is missing of each PostgreSQL sink's schema, or refuse to start.

    Raises:
        ConfigError: one line naming ``sink.url`` (credentials, privileges, no such database) or
            ``sink.schema`` (a table with other columns). A server that does not answer is an
            outage, not a configuration error: each term tries again.
    """
    from ingestion.postgres.sink import sink_problem

    for url in sorted({j.sink for j in settings.jobs if j.sink}):
        problem = sink_problem(url, settings.sink.schema, timeout)
        if problem:
            raise ConfigError([problem])


def check_sources(settings: Settings) -> None:
    """Build every job's source once, to report what cannot be built as configuration errors.

    Raises:
        ConfigError: one line per job whose resource or action cannot be used.
    """
    problems = []
    for job in settings.jobs:
        try:
            build_source(settings, job)
        except ValueError as exc:
            section = "rpc" if job.kind == "rpc" else "horizon"
            problems.append(f"jobs.{job.name}: {exc}" if len(settings.jobs) > 1 else f"{section}: {exc}")
    if problems:
        raise ConfigError(problems)




def preflight(settings: Settings) -> None:
    """Checks that need more than the settings' text, before the node starts.

    Raises:
        ConfigError: the token memory in node.state_dir is unusable; what the Redis URL reaches is
            wrong in a way retrying cannot fix (not a sentinel, not a cluster, not Redis, no such database,
            credentials refused, an ACL that denies the job's keys); or every sentinel that
            answered says it does not monitor the URL's service. Redis or sentinels that do not
            answer are an outage, not a configuration error: the node starts, logs
            ``redis-unavailable`` and waits for them (:func:`diagnose_after_outages` asks again).
    """
    # The files of the deployment the node will talk to (its name needs no network).
    deployment = deployment_of_url(settings.redis.url)
    for job in settings.node.jobs:
        try:
            TokenMemory(job, settings.node.state_dir or None, deployment=deployment)
        except (OSError, ValueError) as exc:
            problem = str(exc)  # (TokenMemory's own errors name the setting already)
            if not problem.startswith("node.state_dir"):
                problem = f"node.state_dir: {problem}"
            raise ConfigError([problem]) from exc
    check_sinks(settings)
    r = settings.redis
    url = r.url
    timeout = max(r.timeout_ms / 1000, PREFLIGHT_TIMEOUT)
    mistake = diagnose_redis(
        url, [job_keys(j)["cursor"] for j in settings.node.jobs], timeout=timeout,
        tls_ca_file=r.tls_ca_file or None, tls_cert_file=r.tls_cert_file or None,
        tls_key_file=r.tls_key_file or None,
    )  # fmt: skip
    if mistake:
        raise ConfigError([f"redis.url {redact_url(url)}: {mistake}"])
    if not is_sentinel_url(url):
        return
    target = parse_sentinel_url(url)
    _unreachable, known = sentinel_services(target, r.timeout_ms / 1000)
    if known and not any(target.service in services for services in known.values()):
        monitored = sorted({s for services in known.values() for s in services})
        raise ConfigError([
            f"redis.url: no sentinel at {','.join(known)} monitors a service named "
            f"{target.service!r} (they monitor: {', '.join(monitored) or 'nothing'})"
        ])


class StartupError(Exception):
    """The node cannot start: one line naming the setting (exit 2)."""


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


def source_identity(job: JobSettings) -> str:
    """What a job follows, as recorded in its cursor hash (field ``source``) by its first term:
    ``horizon /operations``, ``rpc [<getEvents filters>]``, ``scheduled module:function``."""
    if job.kind == "horizon":
        return f"horizon {job.resource}"
    if job.kind == "rpc":
        filters = [f.to_json() for f in job.rpc_filters()]
        if not filters:
            return "rpc (every event)"
        return "rpc " + json.dumps(filters, separators=(",", ":"), sort_keys=True)
    return f"scheduled {job.action}"


def _cursor_kind(cursor: str | None) -> str | None:
    """The kind of source a committed cursor belongs to (a job older than the recorded identity):
    an RPC event id or a Horizon paging token."""
    if cursor is None or cursor in ("0", "now"):
        return None
    from ingestion.rpc.protocol import is_event_id

    # An RPC event id is always <19 digits>-<10 digits>; a Horizon effect's token is not padded.
    return "rpc" if len(cursor) == 30 and is_event_id(cursor) else "horizon"


def identity_conflict(job: JobSettings, recorded: str | None, cursor: str | None) -> str | None:
    """One line when the job's Redis state was written by a source configured otherwise."""
    if job.kind not in ("horizon", "rpc"):
        return None
    mine = source_identity(job)
    if recorded is not None:
        if recorded == mine:
            return None
        theirs = recorded
    else:
        kind = _cursor_kind(cursor)
        if kind in (None, job.kind):
            return None
        what = "an RPC event id" if kind == "rpc" else "a Horizon paging token"
        theirs = f"{kind} (its cursor {cursor} is {what})"
    return (
        f"node.job: job {job.name!r} in Redis follows {theirs}, this node is configured for "
        f"{mine}: give this job another name (--job NAME) or configure it as the other nodes"
    )


class IdentifiedSource:
    """A job's source that, at the start of each term, records what it follows in the job's
    cursor hash (a fenced write, so only the leader's lands) or refuses to run when Redis says
    another source wrote this job. Everything else is the wrapped source's. Redis not answering
    ends the term (``RedisUnavailable``: commit-unknown, in the Ingestor), and so does a refused
    write (:class:`TermFenced`: fenced), never the node."""

    def __init__(self, inner: Source, store: LeaseStore, job: JobSettings) -> None:
        self.inner = inner
        self.store = store
        self.job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def resolve_start(self, cursor: str) -> str:
        return await self.inner.resolve_start(cursor)

    @asynccontextmanager
    async def stream(self, cursor: str) -> AsyncIterator[trio.abc.ReceiveChannel[Batch]]:
        await self._record()
        async with self.inner.stream(cursor) as batches:
            yield batches

    async def _record(self) -> None:
        key = job_keys(self.job.name)["cursor"]
        fields: Any = await self.store.run(self.store.client.hmget, key, ["source", "cursor"])
        recorded, stored_cursor = fields
        conflict = identity_conflict(self.job, recorded, stored_cursor)
        if conflict:
            raise SourceFatalError(conflict)
        if recorded is None:
            term = current_term.get()
            refused = await self.store.fenced_hset(
                term.node, term.token, key, {"source": source_identity(self.job)}
            )
            if refused is not None:
                raise TermFenced(refused.reason)  # a newer term holds the job: this one is over


async def check_identities(settings: Settings, stores: dict[str, LeaseStore]) -> None:
    """Refuse to start (``StartupError``) when a hosted job's Redis state belongs to a source
    configured otherwise; Redis not answering is left to the terms (they check again)."""
    problems = []
    for job in settings.jobs:
        store = stores[job.name]
        try:
            fields: Any = await store.run(
                store.client.hmget, job_keys(job.name)["cursor"], ["source", "cursor"]
            )
            recorded, cursor = fields
        except RedisUnavailable:
            continue
        conflict = identity_conflict(job, recorded, cursor)
        if conflict:
            problems.append(StartupError(conflict))
    if problems:
        raise ExceptionGroup("jobs configured otherwise", problems)


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
    """The start-up checks of what ``redis.url`` reaches (:func:`preflight`), run again once per
    outage: an outage is retried, but a Redis that comes back (or first answers) with a password
    the URL lacks, fewer databases or an ACL that denies the keys would be retried forever. After
    a ``redis-unavailable``, ask until a server answers; the outage ends once no job has seen
    ``redis-unavailable`` for ``quiet`` seconds.

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
        from ingestion.node.parent import lease_reporter

        for store in stores.values():
            store.on_lease = lease_reporter(lease_pipe, log)
    observers = {j.name: NodeObserver(settings.node.id, j.name) for j in settings.jobs}
    history_gap_listener.set(functools.partial(_count_history_gap, observers))
    fatal: dict[str, str] = {}
    signalled = False
    runs = [
        JobRun(
            stores[j.name],
            _identified(build_source(settings, j, stores[j.name]), stores[j.name], j),
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

    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            stop_signals.release()
            async with trio.open_nursery() as nursery:

                async def jobs_then_stop(*, task_status: trio.TaskStatus[Any]) -> None:
                    try:
                        await run_jobs(
                            runs, log, registry=NodeRegistry(client), on_fatal=on_fatal,
                            task_status=task_status,
                        )  # fmt: skip
                    finally:
                        nursery.cancel_scope.cancel()

                # Everything that can refuse to start does so before the node campaigns.
                await _start_endpoints(nursery, settings, list(observers.values()), log, stores)
                nursery.start_soon(diagnose_after_outages, settings, list(observers.values()))
                await check_identities(settings, stores)
                handle = await nursery.start(jobs_then_stop)
                _tell_service_manager(log, "READY=1")
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
        for sink in sinks.values():
            if sink is not None:
                sink.close()  # type: ignore[attr-defined]
    if fatal and not signalled:
        log.error("node-stopped", reason="ingestion-fatal", error="; ".join(
            f"{job}: {error}" for job, error in fatal.items()
        ))
        return 1
    log.info("node-stopped", reason="shutdown")
    return 0


def _identified(source: Source, store: LeaseStore, job: JobSettings) -> Source:
    return IdentifiedSource(source, store, job) if job.kind in ("horizon", "rpc") else source


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
) -> None:
    """Start the metrics and status endpoints when configured (see ingestion.serve.metrics/status)."""
    o = settings.observe
    if o.metrics_port:
        from ingestion.serve.metrics import serve_metrics

        readers = {job: store.events_info for job, store in stores.items()}
        await _bind(
            nursery, "metrics_port", o.listen_host, o.metrics_port,
            functools.partial(serve_metrics, stream_info=readers, ttl=settings.lease.ttl_ms / 1000),
            observers, log,
        )  # fmt: skip
    if o.status_port:
        from ingestion.serve.status import serve_status

        await _bind(nursery, "status_port", o.listen_host, o.status_port, serve_status, observers, log)
