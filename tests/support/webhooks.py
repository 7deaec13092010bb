"""What the webhook tests share: a source job's committed records, a webhook job's source against
the test receiver, and waits on its position."""

from __future__ import annotations

from typing import Any

import redis
import structlog
import trio

from actors.lease_store import LeaseStore, job_keys, read_states
from actors.source import SyntheticSource
from actors.supervisor import NodeHandle
from ingestion.testing.receiver import Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook.core import RetrySchedule, parse_secrets
from ingestion.webhook.records import StreamRecords, holder_group
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore, Recorder, start_node

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


async def at_position(redis_client: redis.Redis, hook_job: str, index: int) -> None:
    """Until the webhook job's committed position is synthetic record ``index``."""
    last = SyntheticSource.token_of(index)
    await wait_until(lambda: redis_client.hget(job_keys(hook_job)["cursor"], "cursor") == last, 5,
                     what=f"the delivery position at record {index}")  # fmt: skip


def seqs(receiver: Receiver) -> list[int]:
    return [r["seq"] for r in receiver.records()]


def hook_leader(client: redis.Redis, hook: str) -> str | None:
    """The node that leads the webhook job ``hook`` now (None: nobody)."""
    return read_states(client, [hook])[0].leader


async def delivering(
    nursery: trio.Nursery, open_store: OpenStore, url: str, job: str, receiver: Receiver, records: int,
    **options: Any,
) -> tuple[WebhookSource, NodeHandle, int]:
    """Source job ``{job}-src`` holding synthetic records 1..``records``, ``receiver`` served, and
    webhook job ``{job}-hook`` (``options``: its source's, as :func:`webhook`'s) led by node "a"
    in ``nursery``; waits until the receiver took them unless it answers with a fault. Returns the
    webhook job's source, its node and the receiver's port."""
    await commit_source_records(open_store(url, f"{job}-src"), 1, records)
    port = await nursery.start(serve_receiver, receiver)
    hook, _ = webhook(open_store, url, f"{job}-src", f"{job}-hook", port, **options)
    node = await start_node(nursery, Recorder(), url, f"{job}-hook", "a", hook)
    if receiver.fault is None:
        await receiver.wait_for(records, 10)
    return hook, node, port
