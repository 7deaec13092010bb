"""Dead letters are kept until dealt with: never trimmed by ``events.max_len``, and the source
records they name held on the source job's stream until they are replayed or dropped.

The reproduction runs real node processes: a Horizon job committing from the simulator, with
``events.max_len`` small, and a webhook job delivering it to an endpoint that answers 500, so that
every record is dead-lettered while the source job's commits trim its stream."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import structlog
import trio

from actors.lease_store import LeaseStore, job_keys
from actors.source import Record, SyntheticSource
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until
from ingestion.webhook.core import parse_secrets
from ingestion.webhook.records import Stored, StreamRecords, holder_group
from ingestion.webhook.source import Unit, WebhookSource, _commit_batch
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.support.webhooks import FAST, SECRET, commit_source_records, webhook

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
    source_job = f"{job}-src"
    source = open_store(redis_server.url, source_job, timeout=1.0, events_max_len=20)
    await commit_source_records(source, 1, 5)
    receiver = Receiver(SECRET, fault=Fault(status=503))
    with structlog.testing.capture_logs() as logs:
        await _through_a_failed_first_hold(redis_server, redis_client, job, open_store, source, receiver)
    # the wait was said, once (a failed hold stalls delivery: never silently)
    assert [e["event"] for e in logs].count("webhook-retention-hold-failed") == 1


async def _through_a_failed_first_hold(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore,
    source: LeaseStore, receiver: Receiver,
) -> None:  # fmt: skip
    source_job, hook_job = f"{job}-src", f"{job}-hook"
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


def webhooks_command(config: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingestion", "webhooks", "--config", str(config), "--redis", url, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_dropped_dead_letters_are_gone_audited_shown_and_release_their_source_records(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore, tmp_path: Path
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    config = tmp_path / "config.toml"
    config.write_text(
        f'[jobs.{source_job}]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 100\n'
        f'[jobs.{hook_job}]\nkind = "webhook"\nfrom = "{source_job}"\nurl = "http://127.0.0.1:9/in"\n'
        f'secret = "{SECRET}"\n'
    )
    source = open_store(redis_server.url, source_job, timeout=1.0, events_max_len=5)
    await commit_source_records(source, 1, 10)
    receiver = Receiver(SECRET, fault=Fault(status=500))
    dead, stream = job_keys(hook_job)["events"], job_keys(source_job)["events"]

    def entry(entry_id: str) -> tuple[int, int]:
        ms, _, seq = entry_id.partition("-")
        return int(ms), int(seq)

    def floor() -> tuple[int, int]:
        (group,) = redis_client.xinfo_groups(stream)
        return entry(group["last-delivered-id"])

    def entry_of(seq: int) -> tuple[int, int]:
        token = SyntheticSource.token_of(seq)
        return next(entry(eid) for eid, f in redis_client.xrange(stream) if f["paging_token"] == token)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        for seq in range(1, 11):  # one dead letter a millisecond apart at least, for --before
            await wait_until(lambda s=seq: redis_client.xlen(dead) >= s, 10, what=f"dead letter {seq}")  # type: ignore[misc]
            await trio.sleep(0.003)
        receiver.fault = None
        await commit_source_records(source, 11, 20)
        await receiver.wait_for(10, 10)
        # every record from the first dead letter's on is held
        await wait_until(lambda: floor() < entry_of(1), 5, what="the floor before record 1")
        letters = redis_client.xrange(dead)
        sixth_ms = int(letters[5][0].partition("-")[0])
        before = datetime.datetime.fromtimestamp(sixth_ms / 1000, datetime.UTC).isoformat()
        expected = sum(1 for eid, _f in letters if int(eid.partition("-")[0]) < sixth_ms)
        assert 5 <= expected <= 6
        dropped = await trio.to_thread.run_sync(
            webhooks_command, config, redis_server.url, "drop-dead-letters", hook_job, "--before", before
        )
        assert dropped.returncode == 0, dropped.stderr
        assert f"dropped {expected} dead letters of {hook_job}" in dropped.stdout
        left = [json.loads(f["record"])["record"]["seq"] for _id, f in redis_client.xrange(dead)]
        assert left == list(range(expected + 1, 11))
        # the leader lets go of the dropped ones' records: the floor moves up to the oldest left
        await wait_until(lambda: entry_of(expected) <= floor() < entry_of(expected + 1), 10,
                         what="the floor before the oldest dead letter left")  # fmt: skip
        await wait_until(lambda: hook.stats.dead_letters_held == 10 - expected, 10, what="the count")
        shown = await trio.to_thread.run_sync(webhooks_command, config, redis_server.url, "status", "--json")
        (status,) = json.loads(shown.stdout)
        assert status["dead_letters_held"] == 10 - expected and status["dead_letters_dropped"] == expected
        assert status["last_drop"]["by"].startswith("cli ") and status["last_drop"]["before"]
        text = await trio.to_thread.run_sync(webhooks_command, config, redis_server.url, "status")
        assert f"dead letters held {10 - expected} (0 replayed, {expected} dropped)" in text.stdout
        assert "dead letters last dropped at" in text.stdout
        # all the others: nothing is held any more, the floor goes to the last delivered record
        everything = await trio.to_thread.run_sync(
            webhooks_command, config, redis_server.url, "drop-dead-letters", hook_job
        )
        assert everything.returncode == 0 and f"dropped {10 - expected} dead letters" in everything.stdout
        await wait_until(lambda: floor() == entry_of(20), 10, what="the floor at the last record")
        await wait_until(lambda: hook.stats.dead_letters_held == 0, 10, what="none held")
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert redis_client.xlen(dead) == 0
    audit = [
        f
        for _id, f in redis_client.xrange(job_keys(hook_job)["audit"])
        if f["event"] == "dead-letters-dropped"
    ]
    assert [int(a["dropped"]) for a in audit] == [expected, 10 - expected]
    assert audit[0]["before"] and audit[1]["before"] == "" and audit[0]["by"].startswith("cli ")
    bad = webhooks_command(config, redis_server.url, "drop-dead-letters", hook_job, "--before", "soon")
    assert bad.returncode == 2 and "not an ISO 8601 time" in bad.stderr


def test_the_floor_below_a_held_record_is_an_id_below_it_that_the_trim_can_step_past() -> None:
    from ingestion.webhook.records import _entry_before

    assert _entry_before("1765000000000-5") == "1765000000000-4"
    assert _entry_before("0-1") == "0-0" and _entry_before("0-0") == "0-0"
    # below ms-0: under any entry of the millisecond before, and its next id still exact as a double
    below = _entry_before("1765000000000-0")
    ms, _, seq = below.partition("-")
    assert ms == "1764999999999" and int(seq) + 1 == float(int(seq) + 1) and int(seq) > 10**15


def test_max_dead_letters_is_a_webhook_setting_of_zero_or_more(tmp_path: Path) -> None:
    from ingestion.config import ConfigError, load

    def config(extra: str) -> Path:
        path = tmp_path / "config.toml"
        path.write_text(
            '[jobs.ops]\nkind = "horizon"\nresource = "/operations"\n[jobs.hook]\nkind = "webhook"\n'
            f'from = "ops"\nurl = "https://example.test/in"\nsecret = "{SECRET}"\n{extra}'
        )
        return path

    hook = load(config("max_dead_letters = 500\n"), {}, {}).jobs[1].webhook
    assert hook is not None and hook.max_dead_letters == 500
    assert load(config(""), {}, {}).jobs[1].webhook.max_dead_letters == 0  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"jobs\.hook\.max_dead_letters: must be at least 0, got -1"):
        load(config("max_dead_letters = -1\n"), {}, {})


def test_a_record_whose_body_is_not_json_is_dead_lettered_as_its_text() -> None:
    """A body that starts like JSON but is not (a source's bug, a hostile write to the stream) is
    kept in its dead letter as text; before, the commit that dead-letters it raised, and so did
    every term after it that reached that record: the job never moved past it."""
    broken = Stored("1-0", 0, Record("4294967296", '{"id": "4294967296", "truncated'))
    fine = Stored("2-0", 0, Record("8589934592", '{"id": "8589934592"}'))
    done = [(Unit((s,), f"msg_{s.record.paging_token}", ()), "dead", {"attempts": 8}) for s in (broken, fine)]
    batch = _commit_batch(done)
    letters = [json.loads(r.body) for r in batch.records]
    assert letters[0]["record"] == '{"id": "4294967296", "truncated' and letters[0]["attempts"] == 8
    assert letters[1]["record"] == {"id": "8589934592"}
    assert batch.through is None  # (the last dead letter's own id is the position)
