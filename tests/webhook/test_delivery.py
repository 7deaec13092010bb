"""Webhook jobs in-process against a real Redis and a real HTTP receiver that verifies every
delivery with the official ``standardwebhooks`` package: order, retries, dead letters, fencing."""

from __future__ import annotations

import functools
import json
from typing import Any

import httpx
import pytest
import redis
import structlog
import trio

from actors.lease_store import job_keys
from actors.source import Record, SyntheticSource
from ingestion.common.keyspace import webhook_keys
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook.core import RetrySchedule, parse_secrets
from ingestion.webhook.records import holder_group
from ingestion.webhook.source import WebhookSource
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.support.webhooks import FAST, SECRET, at_position, commit_source_records, seqs, webhook


async def deliver_all(
    url: str, redis_client: redis.Redis, open_store: OpenStore, job: str, receiver: Receiver, count: int,
    **options: Any,
) -> None:  # fmt: skip
    """Commit synthetic records 1..``count`` to ``job``-src and run ``job``-hook (with
    ``options``) until all are delivered and the position is at the last."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(url, source_job), 1, count)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, url, source_job, hook_job, port, **options)
        node = await start_node(nursery, Recorder(), url, hook_job, "a", hook)
        await receiver.wait_for(count, 10)
        await at_position(redis_client, hook_job, count)
        await node.shutdown()
        nursery.cancel_scope.cancel()


async def test_records_arrive_signed_in_order_once_and_the_position_is_committed(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 30)
    receiver = Receiver(SECRET)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _store = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await receiver.wait_for(30, 10)
        await commit_source_records(open_store(redis_server.url, source_job), 31, 50)
        await receiver.wait_for(50, 10)
        await at_position(redis_client, hook_job, 50)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == list(range(1, 51))
    assert receiver.refused_signature == 0 and receiver.duplicates == 0
    assert len(receiver.peers) == 1  # one connection, kept alive: answers are read to their end
    assert receiver.ids()[0] == f"{source_job}:{SyntheticSource.token_of(1)}"
    payload = json.loads(receiver.db.execute("SELECT payload FROM records LIMIT 1").fetchone()[0])
    assert payload["type"] == "ingestion.scheduled.run"
    # no record of its own in the webhook job's stream: nothing was dead-lettered
    assert redis_client.xlen(job_keys(hook_job)["events"]) == 0
    # the source job's stream keeps what is undelivered: the group sits at a delivered record
    groups = redis_client.xinfo_groups(job_keys(source_job)["events"])
    assert [g["name"] for g in groups] == [holder_group(hook_job)]


async def test_failures_are_retried_in_order_and_exhausted_records_are_dead_lettered(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 5)
    receiver = Receiver(SECRET, fault=Fault(status=503, retry_after=0))
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        # 4 attempts for record 1 (the first and 3 retries), then its dead letter; likewise 2
        await wait_until(lambda: redis_client.xlen(job_keys(hook_job)["events"]) >= 2, 10,
                         what="two dead letters")  # fmt: skip
        receiver.fault = None
        await receiver.wait_for(3, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    dead = [json.loads(f["record"]) for _id, f in redis_client.xrange(job_keys(hook_job)["events"])]
    assert [d["record"]["seq"] for d in dead][:2] == [1, 2]
    assert dead[0]["attempts"] == 4 and dead[0]["status"] == 503
    assert dead[0]["webhook_id"] == f"{source_job}:{SyntheticSource.token_of(1)}"
    # the records after the dead letters were delivered, in order, none twice
    delivered = seqs(receiver)
    assert delivered == sorted(delivered) and delivered[-1] == 5
    assert set(delivered) | {d["record"]["seq"] for d in dead} == {1, 2, 3, 4, 5}
    state = redis_client.hgetall(webhook_keys(hook_job)["endpoint"])
    assert state["state"] == "ok"


async def test_blocking_keeps_order_through_a_long_outage(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 5)
    receiver = Receiver(SECRET, fault=Fault(status=500))
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, on_exhausted="block")
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: receiver.posts >= 12, 10, what="a dozen failed attempts")
        receiver.fault = None
        await receiver.wait_for(5, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3, 4, 5]
    assert redis_client.xlen(job_keys(hook_job)["events"]) == 0


async def test_410_disables_the_endpoint_until_enabled(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 3)
    receiver = Receiver(SECRET, fault=Fault(status=410))
    rec = Recorder()
    keys = webhook_keys(hook_job)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: redis_client.hget(keys["endpoint"], "state") == "disabled", 10,
                         what="the endpoint disabled")  # fmt: skip
        await trio.sleep(0.5)
        assert receiver.posts == 1  # disabled at once: no retry
        receiver.fault = None
        from ingestion.webhook.admin import request_enable

        request_enable(redis_client, hook_job)
        await receiver.wait_for(3, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3]


async def test_a_stale_deliverer_cannot_move_the_position(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    hook_job = f"{job}-hook"
    store = open_store(redis_server.url, hook_job, timeout=1.0)
    a = await store.acquire("a", 60_000)
    assert (await store.commit("a", a.token, None, (), anchor="100")).__class__.__name__ == "Committed"  # type: ignore[union-attr]
    redis_client.delete(store.keys["lease"])
    b = await store.acquire("b", 60_000)
    assert (await store.commit("b", b.token, "100", (), anchor="200")).__class__.__name__ == "Committed"  # type: ignore[union-attr]
    # a, paused past its lease, wakes and tries to move the position forward or back: refused
    for cursor in ("300", "50"):
        refused = await store.commit("a", a.token, "100", (Record(cursor, "{}"),))  # type: ignore[union-attr]
        assert refused.__class__.__name__ == "CommitRejected"
    assert redis_client.hget(store.keys["cursor"], "cursor") == "200"


async def test_batches_carry_up_to_n_records_each_keeping_its_id(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    receiver = Receiver(SECRET)
    await deliver_all(redis_server.url, redis_client, open_store, job, receiver, 250, batch=100)
    assert seqs(receiver) == list(range(1, 251))
    assert len(receiver.ids()) <= 250 // 100 + 2  # a batch is whatever was there, up to 100
    assert all(r["id"] == SyntheticSource.token_of(r["seq"]) for r in receiver.records())


class CapturingReceiver(Receiver):
    """The example receiver, keeping every delivery that reached it as sent (an eavesdropper's copy)."""

    def accept(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        self.__dict__.setdefault("captured", []).append((headers, body))
        return super().accept(headers, body)


async def test_a_captured_delivery_resent_with_its_fencing_header_raised_blocks_nothing(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """Issue 46: the fence was a header outside the signature. A delivery re-sent within the
    timestamp window with ``webhook-fencing-token: 2^62`` made the receiver refuse (409) every
    genuine delivery afterwards. The token is now in the signed body, the header decides nothing."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 5)
    receiver = CapturingReceiver(SECRET)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        await receiver.wait_for(5, 10)
        headers, body = receiver.__dict__["captured"][2]
        payload = json.loads(body)
        assert payload["fencing_token"] == int(headers["webhook-fencing-token"]) > 0  # signed, in the body
        assert payload["id"] == headers["webhook-id"]  # the record's own id
        forged = {**headers, "webhook-fencing-token": str(2**62)}
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"http://127.0.0.1:{port}/hook", content=body, headers=forged)
        assert answer.status_code == 204  # a duplicate: acknowledged, nothing written or raised
        await commit_source_records(open_store(redis_server.url, source_job), 6, 10)
        await receiver.wait_for(10, 10)  # the genuine deliverer goes on (it was refused: 409)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == list(range(1, 11)) and receiver.refused_stale == 0
    assert receiver.fence() == payload["fencing_token"]


async def test_a_batch_cut_anew_after_a_failover_is_not_taken_twice(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """With ``batch`` > 1 a batch is cut from the page read: records 1..5 were taken (their
    acknowledgement lost), then 6..15 were committed and the job handed over; the next leader
    cuts 1..10 (another ``webhook-id``). A receiver following the docs takes each record once."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 5)
    receiver = Receiver(SECRET, fault=Fault(lose_answer=True))
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, batch=10)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: receiver.posts >= 2, 10, what="records 1..5 taken, then sent again")
        await commit_source_records(open_store(redis_server.url, source_job), 6, 15)
        await node.shutdown()
        receiver.fault = None
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, batch=10)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "b", hook)
        await at_position(redis_client, hook_job, 15)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert receiver.ids()[:2] == [f"{source_job}:{SyntheticSource.token_of(1)}:{SyntheticSource.token_of(n)}"
                                  for n in (5, 10)]  # fmt: skip
    assert seqs(receiver) == list(range(1, 16))


async def test_concurrency_gives_up_order_but_moves_the_position_over_a_finished_prefix(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    receiver = Receiver(SECRET, answer_delay=0.01)
    await deliver_all(redis_server.url, redis_client, open_store, job, receiver, 60, concurrency=8)
    assert sorted(seqs(receiver)) == list(range(1, 61)) and receiver.duplicates == 0


async def test_replays_are_carried_out_by_the_leader_with_the_same_ids(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    from ingestion.webhook.admin import replay_bound, request_replay, status

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 10)
    receiver = Receiver(SECRET, fault=Fault(status=500))
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port,
                          schedule=RetrySchedule((0.02,)))  # fmt: skip
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: redis_client.xlen(job_keys(hook_job)["events"]) == 10, 10,
                         what="every record dead-lettered")  # fmt: skip
        shown = status(redis_client, hook_job, source_job, "http://x")
        assert shown["dead_letters"] == 10 and shown["undelivered"] == 0 and shown["leader"] == "a"
        receiver.fault = None
        request_replay(redis_client, hook_job, dead_letters=True)
        await receiver.wait_for(10, 10)
        # records 4..6 again, by record id: the receiver de-duplicates them by webhook-id
        request_replay(redis_client, hook_job, replay_bound(SyntheticSource.token_of(4)),
                       replay_bound(SyntheticSource.token_of(6)))  # fmt: skip
        await wait_until(lambda: receiver.duplicates == 3, 10, what="three records replayed")
        await wait_until(lambda: status(redis_client, hook_job, source_job, "x")["requests_pending"] == 0, 5,
                         what="both requests done")  # fmt: skip
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == list(range(1, 11))
    assert redis_client.hlen(webhook_keys(hook_job)["replayed"]) == 10
    assert status(redis_client, hook_job, source_job, "x")["last_replay"]["sent"] == 3


def test_replay_bounds() -> None:
    from ingestion.webhook.admin import replay_bound

    assert replay_bound("1000") == str(1000 << 32)
    assert replay_bound("4294971393") == "4294971393"
    assert replay_bound("0000000123-0000000001".zfill(30)) == "0000000123-0000000001".zfill(30)
    assert replay_bound("2026-12-04T00:00:00Z") == "time:1796342400000"
    with pytest.raises(ValueError, match="neither"):
        replay_bound("yesterday")


def test_the_webhooks_command_shows_status_and_asks_for_replays(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, tmp_path: Any
) -> None:
    import subprocess
    import sys

    config = tmp_path / "config.toml"
    config.write_text(
        f'[redis]\nurl = "{redis_server.url}"\n[jobs.{job}-src]\nkind = "scheduled"\n'
        f'action = "ingestion.jobs:heartbeat"\nperiod_ms = 100\n[jobs.{job}-hook]\nkind = "webhook"\n'
        f'from = "{job}-src"\nurl = "http://user:pw@127.0.0.1:9/in"\nsecret = "{SECRET}"\n'
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ingestion", "webhooks", "--config", str(config), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    shown = run("status", "--json")
    assert shown.returncode == 0, shown.stderr
    (status,) = json.loads(shown.stdout)
    assert status["job"] == f"{job}-hook" and status["state"] == "idle" and status["dead_letters"] == 0
    assert SECRET not in shown.stdout and "pw@" not in shown.stdout
    asked = run("replay", f"{job}-hook", "--from", "100", "--to", "2026-12-04T00:00:00Z")
    assert asked.returncode == 0, asked.stderr
    (entry,) = redis_client.xrange(webhook_keys(f"{job}-hook")["requests"])
    assert entry[1]["from"] == str(100 << 32) and entry[1]["to"] == "time:1796342400000"
    bad = run("replay", f"{job}-hook", "--from", "soon")
    assert bad.returncode == 2 and "neither a record id" in bad.stderr


async def test_trimming_the_source_stream_keeps_what_is_not_delivered_yet(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    source = open_store(redis_server.url, source_job, timeout=1.0, events_max_len=20)
    await commit_source_records(source, 1, 5)
    receiver = Receiver(SECRET, fault=Fault(status=503))  # the endpoint is down for now
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, on_exhausted="block")
        node = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: receiver.posts >= 2, 10, what="the first failed attempts")
        for first in range(6, 300, 10):  # the source job goes on, trimming to about 20 entries
            await commit_source_records(source, first, first + 9)
        assert redis_client.xlen(job_keys(source_job)["events"]) >= 299  # the group held them
        receiver.fault = None
        await receiver.wait_for(305, 20)
        stream = job_keys(source_job)["events"]
        last_id = redis_client.xrevrange(stream, count=1)[0][0]

        def held_at_the_end() -> bool:
            groups = redis_client.xinfo_groups(stream)
            return [g["last-delivered-id"] for g in groups] == [last_id]

        await wait_until(held_at_the_end, 5, what="the retention floor at the last delivered record")
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == list(range(1, 306))
    # once delivered, the source job's next commit trims them again
    await commit_source_records(source, 306, 306)
    assert redis_client.xlen(job_keys(source_job)["events"]) < 200


async def test_tls_is_verified_against_the_configured_ca(
    redis_server: LocalRedis, job: str, open_store: OpenStore, tmp_path: Any
) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    source_job = f"{job}-src"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 3)
    receiver = Receiver(SECRET)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(serve_receiver, receiver, certfile=str(tmp_path / "cert.pem"),
                              keyfile=str(tmp_path / "key.pem"))
        )  # fmt: skip
        # the system's CAs do not know this certificate: every attempt fails, none is accepted
        untrusted, _ = webhook(open_store, redis_server.url, source_job, f"{job}-a", port,
                               on_exhausted="block")  # fmt: skip
        untrusted.url = untrusted.url.replace("http://", "https://")
        a = await start_node(nursery, rec, redis_server.url, f"{job}-a", "a", untrusted)
        await wait_until(lambda: untrusted.stats.attempts.get("error", 0) >= 2, 10, what="refused TLS")
        await a.shutdown()
        assert receiver.posts == 0
        trusted, _ = webhook(open_store, redis_server.url, source_job, f"{job}-b", port,
                             verify=ssl.create_default_context(cafile=str(tmp_path / "ca.pem")))  # fmt: skip
        trusted.url = trusted.url.replace("http://", "https://")
        b = await start_node(nursery, rec, redis_server.url, f"{job}-b", "b", trusted)
        await receiver.wait_for(3, 10)
        await b.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3]


async def test_a_postgres_jobs_rows_are_delivered_in_order_and_located_after_a_failover(
    pg: LocalPostgres, redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    from ingestion.postgres.sink import PostgresSink
    from ingestion.webhook.records import PostgresRecords

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    sink = PostgresSink(pg.url, source_job, call_timeout=5)
    src = SyntheticSource(total=None)
    records = [src.record(i) for i in range(1, 41)]
    assert await sink.open_term("a", 1)
    await sink.commit("a", 1, None, records[:25])
    receiver = Receiver(SECRET)
    rec = Recorder()
    store = open_store(redis_server.url, hook_job, timeout=1.0)
    rows = PostgresRecords(pg.url, "ingestion", source_job, timeout=2.0)

    def hook() -> WebhookSource:
        return WebhookSource(
            job=hook_job, from_job=source_job, from_kind="scheduled", records=rows, store=store,
            url=f"http://127.0.0.1:{port}/in", keys=parse_secrets(SECRET), schedule=FAST,
            log=structlog.get_logger(),
        )  # fmt: skip

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        a = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook(), store=store)
        await receiver.wait_for(25, 10)
        await at_position(redis_client, hook_job, 25)
        await a.shutdown()
        # more rows while nobody delivers; the next deliverer finds its place by the paging token
        await sink.commit("a", 1, records[24].paging_token, records[25:])
        b = await start_node(nursery, rec, redis_server.url, hook_job, "b", hook(), store=store)
        await receiver.wait_for(40, 10)
        await b.shutdown()
        nursery.cancel_scope.cancel()
    sink.close()
    rows.close()
    assert seqs(receiver) == list(range(1, 41)) and receiver.duplicates == 0
    again = PostgresRecords(pg.url, "ingestion", source_job)
    assert await again.locate(SyntheticSource.token_of(7)) == "7"  # bisected by paging token
    assert await again.locate(SyntheticSource.token_of(7), inclusive=True) == "6"
    again.close()


async def test_terms_handed_over_at_many_points_still_deliver_every_record_once_in_order(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """Thirty terms, each ended (handed over) after a different short time: mid-POST, mid-commit,
    mid-read; each ends as a term does, and the records arrive once each, in order."""
    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 400)
    receiver = Receiver(SECRET, answer_delay=0.002)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        for turn in range(30):
            hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
            node = await start_node(nursery, rec, redis_server.url, hook_job, f"n{turn}", hook)
            await rec.wait_for("became-leader", f"n{turn}")
            await trio.sleep(0.005 * (turn % 7))
            await node.shutdown()
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, rec, redis_server.url, hook_job, "last", hook)
        await receiver.wait_for(400, 20)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == list(range(1, 401))


async def test_an_operator_pauses_and_resumes_delivery_across_terms_and_the_audit_says_who(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """Pause holds every record in order (nothing dropped, nothing dead-lettered), across a new
    term on another node; resume delivers them. Each request is carried out by the leader under
    its token and audited with who asked; every attempt that failed is kept with its status and
    latency, for the console."""
    from ingestion.webhook.admin import request_pause, status

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    src = open_store(redis_server.url, source_job)
    await commit_source_records(src, 1, 3)
    receiver = Receiver(SECRET, fault=Fault(status=503, retry_after=0))
    rec = Recorder()
    keys = webhook_keys(hook_job)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        slow = RetrySchedule((0.5, 0.5, 0.5))
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port, schedule=slow)
        a = await start_node(nursery, rec, redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: receiver.posts >= 2, 5, what="two failed attempts")
        receiver.fault = None
        await receiver.wait_for(3, 10)
        request_pause(redis_client, hook_job, True, by="console 127.0.0.1 (alice)")
        await wait_until(lambda: redis_client.hget(keys["endpoint"], "paused") == "1", 5, what="paused")
        assert status(redis_client, hook_job, source_job, "x")["state"] == "paused"
        await trio.sleep(0.3)
        assert seqs(receiver) == [1, 2, 3]
        await commit_source_records(src, 4, 4)
        request_pause(redis_client, hook_job, True, by="twice")  # a second pause, then a resume
        request_pause(redis_client, hook_job, False, by="in the same term")
        await receiver.wait_for(4, 10)
        request_pause(redis_client, hook_job, True, by="console 127.0.0.1 (alice)")
        await wait_until(lambda: status(redis_client, hook_job, source_job, "x")["requests_pending"] == 0, 5,
                         what="the requests carried out")  # fmt: skip
        await commit_source_records(src, 5, 6)
        await a.shutdown()
        # another term, on another node: still paused
        hook_b, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        b = await start_node(nursery, rec, redis_server.url, hook_job, "b", hook_b)
        await rec.wait_for("became-leader", "b")
        await trio.sleep(1.0)
        assert seqs(receiver) == [1, 2, 3, 4]
        request_pause(redis_client, hook_job, False, by="cli bob@ops")
        await receiver.wait_for(6, 10)
        await b.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3, 4, 5, 6]
    assert redis_client.xlen(job_keys(hook_job)["events"]) == 0  # no dead letter
    audit = [f for _id, f in redis_client.xrange(job_keys(hook_job)["audit"])]
    asked = [f for f in audit if f["event"] == "operator-request"]
    assert [(f["action"], f["by"], f["node"]) for f in asked] == [
        ("pause", "console 127.0.0.1 (alice)", "a"), ("pause", "twice", "a"),
        ("resume", "in the same term", "a"), ("pause", "console 127.0.0.1 (alice)", "a"),
        ("resume", "cli bob@ops", "b"),
    ]  # fmt: skip
    attempts = [f for _id, f in redis_client.xrange(keys["attempts"])]
    failed = [f for f in attempts if f["outcome"] != "2xx"]
    assert [f["status"] for f in failed] == ["503", "503"]
    assert failed[0]["record"] == SyntheticSource.token_of(1)
    assert all(int(f["latency_ms"]) >= 0 for f in attempts) and any(f["outcome"] == "2xx" for f in attempts)


async def test_a_pause_neither_enables_an_endpoint_disabled_by_410_nor_lets_a_replay_through(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """Disabled (410) and paused are kept apart: a pause and a resume leave the endpoint disabled
    (no POST) until an enable; a replay asked while paused is refused, said so, and sends nothing."""
    from ingestion.webhook.admin import request_enable, request_pause, request_replay, status

    source_job, hook_job = f"{job}-src", f"{job}-hook"
    await commit_source_records(open_store(redis_server.url, source_job), 1, 3)
    receiver = Receiver(SECRET, fault=Fault(status=410))
    keys = webhook_keys(hook_job)

    def done() -> int:
        return int(status(redis_client, hook_job, source_job, "x")["requests_pending"] == 0)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, redis_server.url, source_job, hook_job, port)
        node = await start_node(nursery, Recorder(), redis_server.url, hook_job, "a", hook)
        await wait_until(lambda: redis_client.hget(keys["endpoint"], "state") == "disabled", 10,
                         what="the endpoint disabled")  # fmt: skip
        receiver.fault = None
        request_pause(redis_client, hook_job, True)
        request_replay(redis_client, hook_job, "0")
        await wait_until(done, 5, what="the pause and the replay carried out")
        last = json.loads(redis_client.hget(keys["endpoint"], "last_request"))
        assert last["action"] == "replay" and last["sent"] == 0 and "paused" in last["refused"]
        request_pause(redis_client, hook_job, False)
        await wait_until(done, 5, what="the resume carried out")
        await trio.sleep(1.5)  # (the disabled endpoint's poll is 1 s)
        assert receiver.posts == 1 and hook.stats.state == "disabled"  # the one 410, nothing since
        assert status(redis_client, hook_job, source_job, "x")["state"] == "disabled"
        request_enable(redis_client, hook_job)
        await receiver.wait_for(3, 10)
        await node.shutdown()
        nursery.cancel_scope.cancel()
    assert seqs(receiver) == [1, 2, 3]
