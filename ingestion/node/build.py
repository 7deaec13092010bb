"""A node's parts built from its settings: each job's source (Horizon, RPC, lake or a scheduled
action), its lease store and its sink (the Redis events stream, or PostgreSQL)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import structlog

from actors.lease_store import (
    LeaseStore,
)
from actors.scheduled import ScheduledJob
from actors.sink import Sink
from actors.source import Source, current_term
from ingestion.config import JobSettings, Settings, load_action, redact_url
from ingestion.config.jobs import API_PROJECTOR_ACTION
from ingestion.horizon.source import HorizonSource


def _rpc_history(settings: Settings, job: JobSettings) -> Any:
    """The lake an RPC job reads history older than RPC keeps from (``on_history_gap = "lake"``),
    with the job's filters; None otherwise."""
    if settings.rpc.on_history_gap != "lake":
        return None
    from ingestion.lake.source import LakeSource  # lazy: start-up (this kind's jobs only)

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
    """The source of ``job`` (default: the node's first job), behind the events stage when the job
    decodes its records or watches a list (:mod:`ingestion.decode.stage`); ``store`` (the job's)
    lets the source write fenced audit entries (a skipped history gap) and holds the Redis the
    watch list of ``watch_set`` is read from.

    Raises:
        ValueError: the job's resource or action cannot be used, or its watch list cannot be read.
    """
    job = job or settings.jobs[0]
    source = _raw_source(settings, job, store)
    if job.last_ledger and store is not None:  # a backfill's range (ingestion/backfill/)
        from ingestion.backfill.bounded import BoundedSource  # lazy: start-up (this kind's jobs only)

        source = BoundedSource(source, job.last_ledger, store, job.name)
    if job.kind not in ("horizon", "rpc", "lake"):
        return source
    from ingestion.decode.stage import rule_for, stage_for  # lazy: start-up (this kind's jobs only)

    watch = watch_source(settings, job, store)
    rule, changes = rule_for(job.kind, job.resource, names=watch is not None)
    return stage_for(source, rule, job.decode and changes, watch)


def watch_source(settings: Settings, job: JobSettings, store: LeaseStore | None = None) -> Any:
    """The job's watch list (:class:`ingestion.watchlist.lists.WatchSource`), or None.

    Raises:
        ValueError: an address of the list (or of its file) is not one.
    """
    from ingestion.watchlist import edits as watch_redis  # lazy: start-up (this kind's jobs only)
    from ingestion.watchlist import lists as watch  # lazy: start-up (this kind's jobs only)

    if job.watch:
        return watch.InlineWatch(job.watch)
    if job.watch_file:
        return watch.FileWatch.open(job.watch_file)
    if job.watch_set:
        client = store.client if store is not None else settings.redis.connect()
        return watch_redis.RedisWatch(client, job.parent or job.name)  # a range watches its job's list
    return None


def _raw_source(settings: Settings, job: JobSettings, store: LeaseStore | None) -> Source:
    if job.kind == "webhook":
        if store is None:
            raise ValueError("a webhook job's source needs its lease store")
        return _webhook_source(settings, job, store)
    if job.kind == "audit":  # ingestion/audit/job.py: the lake against another job's store
        from ingestion.audit.job import AuditJob, build_audit_step  # lazy: start-up (this kind's jobs only)

        store = store if store is not None else build_store(settings, job.name)
        audited = next((j for j in settings.jobs if j.name == job.audits), None)
        watch = watch_source(settings, audited, store) if audited is not None else None
        step = build_audit_step(settings, job, store, watch)
        return AuditJob(step, period=job.period_ms / 1000, processes=settings.lake.decode_processes)
    if job.kind == "scheduled":
        if job.action == API_PROJECTOR_ACTION:  # the events API's projector: built from the settings
            from ingestion.api.projector import projector_action  # lazy: start-up (this kind's jobs only)

            view = projector_action(job.sink, settings.sink.schema, settings.api.job)
            return ScheduledJob(view, period=job.period_ms / 1000)
        action = load_action(job.action)
        if action is None:
            raise ValueError(f"cannot import the action {job.action!r}")
        return ScheduledJob(action, period=job.period_ms / 1000)
    if job.kind == "lake":
        from ingestion.lake.source import LakeSource  # lazy: start-up (this kind's jobs only)

        return LakeSource(
            job.lake_url,
            filters=job.rpc_filters(),
            endpoint_url=settings.lake.endpoint_url,
            poll_interval=settings.lake.poll_interval_ms / 1000,
            read_ahead=settings.lake.read_ahead,
            decode_processes=settings.lake.decode_processes,
        )
    if job.kind == "rpc":
        from ingestion.rpc.source import RpcSource  # lazy: start-up (this kind's jobs only)

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
        complete_check_interval=h.complete_check_ms / 1000,
        audit=None if store is None else audit_writer(store),
    )


def _webhook_source(settings: Settings, job: JobSettings, store: LeaseStore) -> Source:
    """A webhook job's source (ingestion/webhook/source.py): where the delivered job's records are
    read (its Redis events stream, or its PostgreSQL sink), the endpoint's client rules, the
    secret; ``store`` is the webhook job's own lease store."""
    from ingestion.common.http import ssl_context  # lazy: start-up (this kind's jobs only)
    from ingestion.webhook.core import RetrySchedule, parse_secrets  # lazy: start-up (this kind's jobs only)

    # lazy: start-up (this kind's jobs only)
    from ingestion.webhook.records import PostgresRecords, RecordStore, StreamRecords, holder_group
    from ingestion.webhook.source import WebhookSource  # lazy: start-up (this kind's jobs only)

    hook = job.webhook
    if hook is None:
        raise ValueError(f"job {job.name!r} is not a webhook job")
    records: RecordStore
    if hook.source_job and job.source_sink:
        records = PostgresRecords(
            job.source_sink, settings.sink.schema, hook.source_job, timeout=max(store.call_timeout, 1.0)
        )
    else:
        source_store = LeaseStore(store.client, hook.source_job, call_timeout=store.call_timeout)
        records = StreamRecords(source_store, holder_group(job.name))
    verify = ssl.create_default_context(cafile=hook.ca_file) if hook.ca_file else ssl_context()
    return WebhookSource(
        job=job.name,
        from_job=hook.source_job,
        from_kind=hook.source_kind,
        records=records,
        store=store,
        url=hook.url,
        keys=parse_secrets(hook.secret),
        schedule=RetrySchedule.parse(hook.retry_schedule, max_age=hook.max_age_ms / 1000),
        log=structlog.get_logger().bind(node=settings.node.id, job=job.name),
        probe_max=hook.retry_probe_max_ms / 1000,
        on_exhausted=hook.on_exhausted,
        max_dead_letters=hook.max_dead_letters,
        batch=hook.batch,
        concurrency=hook.concurrency,
        connect_timeout=hook.connect_timeout_ms / 1000,
        timeout=hook.timeout_ms / 1000,
        verify=verify,
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
    if job.kind == "webhook" and job.webhook is not None:
        hook = job.webhook
        return {"job": job.name, "kind": job.kind, "from": hook.source_job, "url": redact_url(hook.url)}
    if job.kind == "audit":
        return {"job": job.name, "kind": job.kind, "audits": job.audits, "lake": job.lake_url or None}
    return {"job": job.name, "kind": job.kind, "action": job.action}


def audit_writer(store: LeaseStore) -> Callable[[str, dict[str, str]], Awaitable[bool]]:
    """``await audit(event, fields)``: a fenced audit entry under the calling term's token."""

    async def audit(event: str, fields: dict[str, str]) -> bool:
        term = current_term.get()
        return await store.fenced_audit(term.node, term.token, event, fields) is None

    return audit


def build_store(settings: Settings, job: str | None = None, client: redis.Redis | None = None) -> LeaseStore:
    """The lease store of ``job`` (default: the first), on ``client`` (default: a new one).

    A webhook job's events stream holds its dead letters, which are kept until an operator
    replays or drops them: ``events.max_len`` never trims it (docs/WEBHOOKS.md)."""
    name = job or settings.node.job
    webhook = any(j.name == name and j.kind == "webhook" for j in settings.jobs)
    return LeaseStore(
        client if client is not None else settings.redis.connect(),
        name,
        min_replicas_acked=settings.redis.min_replicas_acked,
        events_max_len=0 if webhook else settings.events.max_len,
    )


def build_sink(settings: Settings, job: JobSettings, store: LeaseStore) -> Sink | None:
    """The job's sink when it is not the Redis events stream (``job.sink``, a PostgreSQL URL),
    which ties the job to ``store``'s Redis deployment (its election domain: the deployment's own
    id, ``LeaseStore.deployment_id``)."""
    if not job.sink:
        return None
    from ingestion.postgres.sink import PostgresSink  # lazy: start-up (this kind's jobs only)

    return PostgresSink(
        job.sink, job.name, schema=settings.sink.schema, call_timeout=store.call_timeout,
        events_max_len=settings.events.max_len, application=f"ingestion:{settings.node.id}",
        domain=store.deployment, identify=store.deployment_id,
    )  # fmt: skip
