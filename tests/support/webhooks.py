"""What the webhook tests share: the signing secret, a fast retry schedule, committing synthetic
records as a source job's leader would, and an in-process webhook job delivering them."""

from __future__ import annotations

from typing import Any

import structlog

from actors.lease_store import LeaseStore
from actors.source import SyntheticSource
from ingestion.webhook.build import holder_group
from ingestion.webhook.core import RetrySchedule, parse_secrets
from ingestion.webhook.records import StreamRecords
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
FAST = RetrySchedule((0.05, 0.05, 0.05))


async def commit_source_records(store: LeaseStore, first: int, last: int, node: str = "src") -> None:
    """Commit synthetic records ``first..last`` to the source job's stream, as its leader would."""
    got = await store.acquire(node, 60_000)
    token = got.token  # type: ignore[union-attr]
    cursor = await store.committed_cursor()
    src = SyntheticSource(total=last)
    records = [src.record(i) for i in range(first, last + 1)]
    done = await store.commit(node, token, cursor, records)
    assert done.__class__.__name__ == "Committed", done
    await store.release(node, token)


def webhook(
    open_store: OpenStore, url: str, source_job: str, job: str, port: int, **options: Any
) -> tuple[WebhookSource, LeaseStore]:
    store = open_store(url, job, timeout=1.0)
    source_store = open_store(url, source_job, timeout=1.0)
    hook = WebhookSource(
        job=job, from_job=source_job, from_kind="scheduled",
        records=StreamRecords(source_store, holder_group(job)), store=store,
        url=f"http://127.0.0.1:{port}/hook", keys=parse_secrets(SECRET),
        schedule=options.pop("schedule", FAST), log=structlog.get_logger().bind(job=job),
        timeout=options.pop("timeout", 2.0), **options,
    )  # fmt: skip
    return hook, store
