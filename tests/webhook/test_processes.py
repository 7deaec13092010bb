"""Webhook delivery through real failures: three node processes, an ingest job and a webhook job
to a loopback receiver that verifies every signature with ``standardwebhooks`` and refuses a
fencing token lower than the highest it accepted. The deliverer is SIGKILLed, SIGSTOPped past its
TTL, and the receiver answers 503, 429 with Retry-After, hangs past the timeout and drops
connections; at the end the receiver holds every record of the source job exactly once (by
``webhook-id``), first accepted in the source job's order."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio

from actors.lease_store import job_keys
from ingestion.testing.cluster import ClockFake, Cluster, faketime_available, figure, open_cluster
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook import admin
from tests.support.webhooks import hook_leader as leader_of

pytestmark = pytest.mark.slow

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TTL_MS = 1500


def hook_config(path: Path, port: int, job: str, extra: str = "") -> Path:
    path.write_text(
        f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
        f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\ntimeout_ms = 800\nconnect_timeout_ms = 500\n'
        f'retry_schedule = ["50ms", "100ms", "200ms", "400ms", "500ms"]\non_exhausted = "block"\n{extra}'
    )
    return path


def hook_leader(cluster: Cluster, hook: str) -> str | None:
    return leader_of(cluster.client, hook)


async def delivered_more(receiver: Receiver, more: int, within: float = 30.0) -> None:
    await receiver.wait_for(len(receiver.records()) + more, within)


async def test_every_record_arrives_once_in_order_through_kills_pauses_and_a_hostile_endpoint(
    job: str, tmp_path: Path
) -> None:
    hook = f"{job}-hook"
    receiver = Receiver(SECRET)
    failovers = 0
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = hook_config(tmp_path / "config.toml", port, job)
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=5, history_ledgers=20) as cluster:
            for name in ("n1", "n2", "n3"):
                await cluster.start_node(name, extra=extra)
            await wait_until(lambda: hook_leader(cluster, hook) is not None, 20, what="a deliverer")
            await delivered_more(receiver, 50)

            # the deliverer SIGKILLed, three times; each comes back as a standby
            for _ in range(3):
                victim = hook_leader(cluster, hook)
                assert victim is not None
                await cluster.kill(victim)
                failovers += 1
                await wait_until(lambda v=victim: hook_leader(cluster, hook) not in (None, v), 20,  # type: ignore[misc]
                                 what="another deliverer")  # fmt: skip
                await delivered_more(receiver, 20)
                await cluster.start_node(victim, extra=extra)

            # the deliverer paused past its TTL: another takes over; the paused one wakes fenced
            victim = hook_leader(cluster, hook)
            assert victim is not None
            cluster.signal(victim, signal.SIGSTOP)
            failovers += 1
            await wait_until(lambda: hook_leader(cluster, hook) not in (None, victim), 20,
                             what="a deliverer instead of the paused one")  # fmt: skip
            await delivered_more(receiver, 20)
            cluster.signal(victim, signal.SIGCONT)

            # a hostile endpoint: each fault for a while, then it answers again
            for fault in (Fault(status=503), Fault(status=429, retry_after=1), Fault(hang=1.5),
                          Fault(drop=True)):  # fmt: skip
                receiver.fault = fault
                await trio.sleep(2.0)
                receiver.fault = None
                await delivered_more(receiver, 10)

            # caught up: the position at the source stream's last record, at some moment
            def caught_up() -> bool:
                last = cluster.client.xrevrange(job_keys(job)["events"], count=1)
                position = cluster.client.hget(job_keys(hook)["cursor"], "cursor")
                return bool(last) and position == last[0][1]["paging_token"]

            await wait_until(caught_up, 60, what="the deliverer at the source's last record")
            position = cluster.client.hget(job_keys(hook)["cursor"], "cursor")
            source = [
                f["paging_token"] for _id, f in cluster.client.xrange(job_keys(job)["events"])
            ]
            verification = await cluster.verify()
            assert verification.ok, verification.summary()
            logged = [json.dumps(line.fields) for line in cluster.log.lines]
            logged += [text for _name, text in cluster.log.raw]
            assert not [line for line in logged if SECRET[6:] in line]  # the secret is never logged
        outer.cancel_scope.cancel()
    delivered = [r["paging_token"] for r in receiver.records()]
    upto = source[: source.index(position) + 1]
    assert delivered[: len(upto)] == upto  # each once, first accepted in the source's order
    assert receiver.refused_signature == 0, receiver.refusals
    figure(
        "webhook_failovers", records=len(upto), failovers=failovers, duplicates=receiver.duplicates,
        stale_refused=receiver.refused_stale, posts=receiver.posts,
        duplicates_per_failover=f"{receiver.duplicates / failovers:.2f}",
    )  # fmt: skip
    # at most the POST in flight is repeated per failover (the endpoint's own faults add none:
    # a failed POST was not accepted)
    assert receiver.duplicates <= failovers


async def test_batches_cut_anew_after_failovers_put_no_record_in_the_receiver_twice(
    job: str, tmp_path: Path
) -> None:
    """``batch = 10``: each batch is cut from the page its leader read, so after a failover a
    record already taken comes again in a batch of another ``webhook-id``. Three times the receiver
    takes a batch and loses its answer while the source commits on, and the deliverer is SIGKILLed:
    the receiver, following the docs (each payload de-duplicated by its ``id``, the signed fence),
    holds every record once, in the source's order."""
    hook = f"{job}-hook"
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = hook_config(tmp_path / "config.toml", port, job, "batch = 10\n")
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=3, history_ledgers=10) as cluster:
            for name in ("n1", "n2", "n3"):
                await cluster.start_node(name, extra=extra)
            await wait_until(lambda: hook_leader(cluster, hook) is not None, 20, what="a deliverer")
            await delivered_more(receiver, 30)
            for _ in range(3):
                victim = hook_leader(cluster, hook)
                assert victim is not None
                posts = receiver.posts
                receiver.fault = Fault(lose_answer=True)  # taken, and the acknowledgement lost
                await wait_until(lambda p=posts: receiver.posts > p + 1, 20, what="a batch taken, sent again")  # type: ignore[misc]
                newest = len(cluster.client.xrange(job_keys(job)["events"]))
                await wait_until(lambda n=newest: cluster.client.xlen(job_keys(job)["events"]) > n, 20,  # type: ignore[misc]
                                 what="more records behind the batch")  # fmt: skip
                await cluster.kill(victim)
                receiver.fault = None
                await wait_until(lambda v=victim: hook_leader(cluster, hook) not in (None, v), 20,  # type: ignore[misc]
                                 what="another deliverer")  # fmt: skip
                await delivered_more(receiver, 5)
                await cluster.start_node(victim, extra=extra)

            def caught_up() -> bool:
                last = cluster.client.xrevrange(job_keys(job)["events"], count=1)
                position = cluster.client.hget(job_keys(hook)["cursor"], "cursor")
                return bool(last) and position == last[0][1]["paging_token"]

            await wait_until(caught_up, 60, what="the deliverer at the source's last record")
            position = cluster.client.hget(job_keys(hook)["cursor"], "cursor")
            source = [f["paging_token"] for _id, f in cluster.client.xrange(job_keys(job)["events"])]
        outer.cancel_scope.cancel()
    delivered = [r["paging_token"] for r in receiver.records()]
    upto = source[: source.index(position) + 1]
    assert delivered[: len(upto)] == upto  # each once, first taken in the source's order
    assert receiver.refused_signature == 0, receiver.refusals
    figure("webhook_batch_failovers", records=len(upto), failovers=3, batches=len(receiver.ids()),
           regrouped=receiver.regrouped, duplicate_posts=receiver.duplicates)  # fmt: skip
    assert receiver.regrouped >= 1  # a record did come again in a batch cut otherwise


async def test_dead_letters_through_an_outage_are_replayed_by_the_leader_on_the_commands_request(
    job: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    hook = f"{job}-hook"
    receiver = Receiver(SECRET, fault=Fault(status=500))  # down from the start
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = tmp_path / "config.toml"
        config.write_text(
            f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
            f'[jobs.{hook}]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
            f'secret = "{SECRET}"\nstart = "first"\nretry_schedule = ["20ms", "20ms"]\n'
        )
        extra = ["--config", str(config), "--job", hook]
        async with open_cluster(job, ttl_ms=TTL_MS, ops_per_ledger=2, history_ledgers=5,
                                ledger_interval=0.5) as cluster:  # fmt: skip
            for name in ("n1", "n2"):
                await cluster.start_node(name, extra=extra)
            dead = job_keys(hook)["events"]
            await wait_until(lambda: cluster.client.xlen(dead) >= 10, 30, what="ten dead letters")
            receiver.fault = None
            await wait_until(lambda: receiver.stored > 0, 30, what="delivery going on")

            def command(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [sys.executable, "-m", "ingestion", "webhooks", "--config", str(config),
                     "--redis", cluster.redis_url, *args],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip

            asked = await trio.to_thread.run_sync(command, "replay", hook, "--dead-letters")
            assert asked.returncode == 0, asked.stderr
            letters = [f["paging_token"] for _id, f in cluster.client.xrange(dead)]

            def replayed() -> bool:
                status = admin.status(cluster.client, hook, job, "")
                return status["requests_pending"] == 0 and status["dead_letters_replayed"] >= len(letters)

            await wait_until(replayed, 30, what="the dead letters replayed")
            shown = await trio.to_thread.run_sync(command, "status", "--json")
            (status,) = [s for s in json.loads(shown.stdout) if s["job"] == hook]
            assert status["dead_letters"] == len(letters) == status["dead_letters_replayed"]
            assert status["last_request"]["action"] == "replay-dead-letters"
        outer.cancel_scope.cancel()
    delivered = {r["paging_token"] for r in receiver.records()}
    assert set(letters) <= delivered  # every dead letter arrived once the endpoint answered
    assert receiver.refused_signature == 0


@pytest.mark.skipif(not faketime_available(), reason="libfaketime is not installed")
async def test_a_node_whose_wall_clock_is_an_hour_off_signs_with_redis_clock(
    job: str, tmp_path: Path
) -> None:
    """A receiver refuses a timestamp minutes off its own clock: a deliverer whose wall clock is
    an hour behind (libfaketime; Redis and the receiver tell the time right) signs with Redis's
    clock, so every POST is accepted, and says once that its own clock is off."""
    hook = f"{job}-hook"
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = hook_config(tmp_path / "config.toml", port, job)
        extra = ["--config", str(config), "--job", hook]
        # A TTL of 5 s, so Redis's answers may take 500 ms (the auto bound): libfaketime slows every clock
        # call of the node, and with 150 ms (TTL 1.5 s) a loaded CI machine had every renewal and
        # commit of it time out for 20 s, so it never delivered; this test is about the signature.
        async with open_cluster(job, ttl_ms=5000, ops_per_ledger=5, history_ledgers=5) as cluster:
            await cluster.start_node("n1", clock=ClockFake("-1h"), extra=extra)
            await delivered_more(receiver, 20)
            skews = cluster.log.of("wall-clock-skew", "n1", job=hook)
        outer.cancel_scope.cancel()
    assert receiver.refused_signature == 0, receiver.refusals
    assert skews and -3700 < skews[0].fields["skew_s"] < -3500, skews
