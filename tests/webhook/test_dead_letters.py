"""Dead letters are kept until dealt with: never trimmed by ``events.max_len``, and the source
records they name held on the source job's stream until they are replayed or dropped.

The reproduction runs real node processes: a Horizon job committing from the simulator, with
``events.max_len`` small, and a webhook job delivering it to an endpoint that answers 500, so that
every record is dead-lettered while the source job's commits trim its stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import structlog
import trio

from actors.lease_store import job_keys
from actors.source import SyntheticSource
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until
from ingestion.webhook.build import holder_group
from ingestion.webhook.core import parse_secrets
from ingestion.webhook.receiver import Fault, Receiver, serve_receiver
from ingestion.webhook.records import StreamRecords
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.webhook.test_delivery import FAST, commit_source_records, webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # (the receiver's and the config's)
TTL_MS = 1500
MAX_LEN = 10
LETTERS = 250  # over a Redis stream node (100 entries): the approximate trim drops whole nodes


def failing_hook_config(path: Path, port: int, job: str, extra: str = "") -> Path:
    path.write_text(
        f"[events]\nmax_len = {MAX_LEN}\n"
        f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
        f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\nretry_schedule = ["10ms"]\n{extra}'
    )
    return path


@pytest.mark.slow
async def test_dead_letters_and_the_source_records_they_name_outlive_events_max_len(
    job: str, tmp_path: Path
) -> None:
    hook = f"{job}-hook"
    receiver = Receiver(SECRET, fault=Fault(status=500))  # every record fails: each is dead-lettered
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = failing_hook_config(tmp_path / "config.toml", port, job)
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=10, history_ledgers=30) as cluster:
            await cluster.start_node("n1", extra=extra)
            await cluster.log.wait_for("webhook-dead-lettered", job=hook, count=LETTERS, within=60)
            await cluster.terminate("n1")
            named = [line.fields["record"] for line in cluster.log.of("webhook-dead-lettered", job=hook)]
            client = cluster.client
            kept = {f["paging_token"] for _id, f in client.xrange(job_keys(hook)["events"])}
            source = {f["paging_token"] for _id, f in client.xrange(job_keys(job)["events"])}
        outer.cancel_scope.cancel()
    assert len(named) >= LETTERS
    lost = [token for token in named if token not in kept]
    assert not lost, f"{len(lost)} of {len(named)} dead letters trimmed from {hook}'s stream"
    unheld = [token for token in named if token not in source]
    assert not unheld, f"{len(unheld)} of {len(named)} dead-lettered records trimmed from {job}'s stream"


async def test_a_failed_first_retention_hold_is_retried_until_it_holds(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """The deliverer's first move of its retention floor is cut off (its connection to Redis
    reset as the command is on its way); the endpoint fails, so nothing is delivered or committed
    for a while: the floor must be set again anyway, or the source job's commits trim what is not
    delivered yet."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    source = open_store(redis_server.url, source_job, timeout=1.0, events_max_len=20)
    await commit_source_records(source, 1, 5)
    receiver = Receiver(SECRET, fault=Fault(status=503))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        proxy.blackhole_at(b"XGROUP")  # the floor's first move: held, then its connection reset
        through_proxy = open_store(f"redis://127.0.0.1:{proxy.port}/0", source_job, timeout=1.0)
        hook = WebhookSource(
            job=hook_job, from_job=source_job, from_kind="scheduled",
            records=StreamRecords(through_proxy, holder_group(hook_job)),
            store=open_store(redis_server.url, hook_job, timeout=1.0),
            url=f"http://127.0.0.1:{port}/hook", keys=parse_secrets(SECRET), schedule=FAST,
            log=structlog.get_logger().bind(job=hook_job), timeout=2.0, on_exhausted="block",
        )  # fmt: skip
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: proxy.held >= 1, 10, what="the first XGROUP on its way")
        proxy.set_mode("refuse")  # the held command is dropped with its connection
        proxy.set_mode("forward")
        stream = job_keys(source_job)["events"]
        await wait_until(lambda: receiver.posts >= 2, 10, what="failed attempts")

        def held() -> bool:
            return any(g["name"] == holder_group(hook_job) for g in redis_client.xinfo_groups(stream))

        await wait_until(held, 5, what="the retention floor set after all")
        for first in range(6, 300, 10):  # the source job goes on, trimming to about 20 entries
            await commit_source_records(source, first, first + 9)
        receiver.fault = None
        await receiver.wait_for(305, 20)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert [r["seq"] for r in receiver.records()] == list(range(1, 306))


def held_metric(hook: WebhookSource) -> float | None:
    """``ingestion_webhook_dead_letters_held`` as the node serves it (None: not reported)."""
    from ingestion.webhook.metrics import WebhookCollector

    for family in WebhookCollector({hook.job: hook.stats}).collect():
        if family.name == "ingestion_webhook_dead_letters_held":
            return family.samples[0].value if family.samples else None
    return None


async def test_at_max_dead_letters_delivery_blocks_until_they_are_dealt_with(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    from ingestion.webhook.admin import request_replay

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    source = open_store(redis_server.url, source_job, timeout=1.0, events_max_len=5)
    await commit_source_records(source, 1, 10)
    receiver = Receiver(SECRET, fault=Fault(status=500))
    dead = job_keys(hook_job)["events"]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, max_dead_letters=3)
        assert held_metric(hook) is None  # not leading: a standby reports no count
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: redis_client.xlen(dead) == 3, 10, what="three dead letters")
        posts = receiver.posts
        await wait_until(lambda: receiver.posts >= posts + 20, 10, what="the fourth record retried on")
        assert redis_client.xlen(dead) == 3  # at the bound: the fourth waits, in order
        assert hook.stats.dead_letters_held == 3 and held_metric(hook) == 3
        assert hook.stats.state == "failing"
        for first in range(11, 100, 10):  # the source job trims to about 5 entries meanwhile
            await commit_source_records(source, first, first + 9)
        first_held = redis_client.xrange(job_keys(source_job)["events"], count=1)[0][1]["paging_token"]
        assert first_held == SyntheticSource.token_of(1)  # the dead letters' records are held
        receiver.fault = None
        await receiver.wait_for(97, 10)  # the waiting record on, then the rest
        request_replay(redis_client, hook_job, dead_letters=True)
        await receiver.wait_for(100, 10)
        await wait_until(lambda: hook.stats.dead_letters_held == 0, 10, what="none held")
        stream = job_keys(source_job)["events"]
        last_id = redis_client.xrevrange(stream, count=1)[0][0]
        await wait_until(
            lambda: [g["last-delivered-id"] for g in redis_client.xinfo_groups(stream)] == [last_id], 5,
            what="the retention floor released up to the last record",
        )  # fmt: skip
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert sorted(r["seq"] for r in receiver.records()) == list(range(1, 101))
    assert held_metric(hook) is None
