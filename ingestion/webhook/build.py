"""A webhook job's source, built from its settings: where the delivered job's records are read
(its Redis events stream, or its PostgreSQL sink), the endpoint's client rules, the secret."""

from __future__ import annotations

import ssl
from typing import Any

import structlog

from actors.lease_store import LeaseStore
from ingestion.webhook.core import RetrySchedule, parse_secrets
from ingestion.webhook.records import PostgresRecords, RecordStore, StreamRecords
from ingestion.webhook.source import WebhookSource


def holder_group(job: str) -> str:
    """The consumer group a webhook job keeps on its source job's stream (retention floor)."""
    return f"webhook:{job}"


def build_webhook_source(settings: Any, job: Any, store: LeaseStore) -> WebhookSource:
    """``job`` (``kind = "webhook"``) as a source; ``store`` is its own lease store."""
    hook = job.webhook
    records: RecordStore
    if hook.source_job and job.source_sink:
        records = PostgresRecords(
            job.source_sink, settings.sink.schema, hook.source_job, timeout=max(store.call_timeout, 1.0)
        )
    else:
        source_store = LeaseStore(store.client, hook.source_job, call_timeout=store.call_timeout)
        records = StreamRecords(source_store, holder_group(job.name))
    verify: ssl.SSLContext | bool = True
    if hook.ca_file:
        verify = ssl.create_default_context(cafile=hook.ca_file)
    else:
        from ingestion.common.http import ssl_context

        verify = ssl_context()
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
