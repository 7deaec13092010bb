"""Election hardening: what a review found, each with a test that failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncGenerator

import redis
import trio

from actors.clock import CLOCK_ID, BootClock
from actors.lease import Extended, LeaseMachine, LeaseTiming, Lost, LostReason
from actors.lease_store import Acquired, job_keys
from actors.source import Batch, Record, SyntheticSource
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from tests.support.nodes import FAST_TIMING, OpenStore, Recorder, assert_exactly_once_in_order, start_node

LIVE_SOURCE = SyntheticSource(total=None, batch_size=5, interval=0.02)


async def test_a_notice_published_while_nobody_waits_survives_the_resubscription(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """A notice that reached the old subscription between two waits must not be dropped when the
    next wait renews the subscription (it used to close the old connection unread)."""
    store = open_store(redis_server.url, job, timeout=0.25)
    notices = store.release_notices()
    try:
        assert await notices.wait(0.05) is None  # subscribed
        notices._waits = notices.RESUBSCRIBE_EVERY  # the next wait renews the subscription
        redis_client.publish(job_keys(job)["released"], "7|other-node")
        await trio.sleep(0.05)  # delivered to the old connection, which nobody reads now
        assert await notices.wait(1.0) == "other-node"
    finally:
        notices.close()


class BadBatches:
    """A buggy source: its second batch goes backwards."""

    async def resolve_start(self, cursor: str) -> str:
        return cursor

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        yield Batch((Record(str(10 << 32), "{}"),))
        yield Batch((Record(str(30 << 32), "{}"), Record(str(20 << 32), "{}")))
        await trio.sleep_forever()


async def test_a_bad_batch_ends_the_term_not_the_node(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        handle = await start_node(nursery, rec, redis_server.url, job, "a", BadBatches())  # type: ignore[arg-type]
        await rec.wait_for("became-leader")
        lost = await rec.wait_for("lost-leadership", within=5)
        assert lost.fields["reason"] == "released"
        assert redis_client.hget(job_keys(job)["cursor"], "cursor") == str(10 << 32)
        await handle.shutdown()  # the node is alive and answers
        await rec.wait_for("stopped", within=5)


def test_the_boottime_clock_is_trio_time_and_sleeps_to_its_deadlines() -> None:
    clock = BootClock()
    now = clock.current_time()
    assert abs(now - time.clock_gettime(CLOCK_ID)) < 0.05
    assert clock.deadline_to_sleep_time(now + 10) > 9.9
    assert clock.deadline_to_sleep_time(now - 1) == 0.0

    async def main() -> tuple[float, float]:
        start = trio.current_time()
        await trio.sleep(0.05)
        return start, trio.current_time()

    start, end = trio.run(main, clock=BootClock())
    assert abs(start - now) < 5 and 0.05 <= end - start < 1


def test_a_node_process_runs_on_the_boottime_clock(job: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "--node-id", "n1", "--job", job,
         "--redis", "redis://127.0.0.1:9/0", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
    finally:
        process.terminate()
        process.wait(10)
    assert first["event"] == "node-starting"
    assert first["clock"] == "boottime"


def test_one_bad_value_is_one_line() -> None:
    def problems(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ingestion", *args],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2
        return done.stderr.strip().splitlines()

    prefix = "ingestion: configuration error: "
    assert problems("--lease-ttl-ms", "-5") == [
        prefix + "lease.ttl_ms: must be between 100 and 3600000, got -5"
    ]
    # A derived setting the user set is still checked, a relation with a valid input too.
    got = subprocess.run(
        [sys.executable, "-m", "ingestion", "--lease-ttl-ms", "-5"],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "INGESTION_LEASE_RENEW_INTERVAL_MS": "-3"},
    ).stderr.strip().splitlines()  # fmt: skip
    assert got == [
        prefix + "lease.ttl_ms: must be between 100 and 3600000, got -5",
        prefix + "lease.renew_interval_ms: must be positive, got -3",
    ]
    assert problems("--lease-ttl-ms", "2000", "--redis", "http://x")[0].startswith(prefix + "redis.url")


async def test_two_processes_with_one_node_id_do_not_livelock(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """Each used to take the other's lease for a leftover of its own and release it: dozens of
    terms a second. Only the first campaign after start may free a lease under its own id."""
    rec = Recorder()
    source = SyntheticSource(total=None, batch_size=5, interval=0.02)
    async with trio.open_nursery() as nursery:
        first = await start_node(nursery, rec, redis_server.url, job, "dup", source)
        await rec.wait_for("became-leader")
        second = await start_node(nursery, rec, redis_server.url, job, "dup", source)
        await rec.wait_for("duplicate-node-id", within=5)
        await trio.sleep(4)
        await first.shutdown()
        await second.shutdown()
    terms = len(rec.of("became-leader"))
    assert terms <= 3, f"{terms} terms in about 4 s"
    assert assert_exactly_once_in_order(redis_client, job) > 0


async def test_a_node_stopped_after_an_acquire_with_unknown_outcome_frees_the_lease(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    """The acquire left while Redis was unreachable, timed out, and was applied later (it sat in
    the network): the node, asked to stop, finds the lease under its id and releases it instead of
    leaving it orphaned for a TTL."""
    rec = Recorder()
    lease_key = job_keys(job)["lease"]
    timing = LeaseTiming(ttl=3.0, renew_interval=0.6, margin=0.8)
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE_SOURCE, timing=timing)
        await rec.wait_for("became-leader", "b")
        a = await start_node(
            nursery, rec, f"redis://127.0.0.1:{proxy.port}/0", job, "a", LIVE_SOURCE, timing=timing
        )
        await rec.wait_for("standby", "a")  # a's connection to Redis is open and pooled
        proxy.set_mode("blackhole")
        await b.shutdown()
        await rec.wait_for("stopped", "b")
        # a campaigns when b's lease would have expired; its acquire times out in the network.
        await rec.wait_for("redis-unavailable", "a", within=10)
        # Whether those bytes ever left a's process is up to the connection pool (a timed-out
        # handshake sends no script), so the late application is made certain: the same acquire,
        # for a's id, applied by Redis while a still hears nothing.
        late = await open_store(redis_server.url, job, timeout=0.25).acquire("a", int(timing.ttl * 1000))
        assert isinstance(late, Acquired), late
        assert redis_client.get(lease_key) == f"{late.token}|a"
        proxy.set_mode("forward")
        await a.shutdown()
        await rec.wait_for("stopped", "a", within=5)
        assert not rec.of("became-leader", "a")
        nursery.cancel_scope.cancel()
    assert redis_client.get(lease_key) is None


def test_a_renewal_that_lands_as_the_scope_fires_ends_the_term_as_a_hand_back() -> None:
    machine = LeaseMachine(FAST_TIMING)
    term = machine.granted(1, 0.0)
    deadline = term.ingest_deadline
    extended = machine.renewed(1, sent_at=deadline - 0.05, now=deadline - 0.001)
    assert isinstance(extended, Extended) and extended.ingest_deadline > deadline
    # The Ingestor's scope fired at the old deadline before the extension reached it.
    lost = machine.ingest_stopped(1, now=deadline + 0.0001)
    assert lost == Lost(1, LostReason.RELEASED)  # not "lease-expired": the lease was renewed
    machine = LeaseMachine(FAST_TIMING)
    term = machine.granted(2, 0.0)
    assert machine.ingest_stopped(2, now=term.ingest_deadline) == Lost(2, LostReason.LEASE_EXPIRED)


async def test_renewals_delivered_late_delay_a_takeover_by_at_most_one_more_ttl(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """The leader's link to Redis holds every packet (a partition that delays rather than drops)
    until just before its lease would expire; the renewals it gave up on then reach Redis and
    extend a lease nobody runs. FAILOVER.md states the bound: the standby leads at most
    2·ttl (+ jitter and round trips) after the last renewal that reached Redis in time."""
    rec = Recorder()
    ttl = FAST_TIMING.ttl
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        a = await start_node(nursery, rec, f"redis://127.0.0.1:{proxy.port}/0", job, "a", LIVE_SOURCE)
        await rec.wait_for("became-leader", "a")
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE_SOURCE)
        await rec.wait_for("standby", "b")
        await rec.wait_for("committed", "a", count=3)
        proxy.set_mode("blackhole")
        cut_at = trio.current_time()
        lost = await rec.wait_for("lost-leadership", "a", within=5)
        await trio.sleep(max(0.0, cut_at + ttl - FAST_TIMING.renew_interval - trio.current_time()))
        proxy.set_mode("forward")  # held renewals (and the release) reach Redis now
        with trio.fail_after(2 * ttl + 2):  # a new term, on either node
            while not (taken_list := [e for e in rec.of("became-leader") if e.at > cut_at]):
                await rec.wait_for("became-leader", count=len(rec.of("became-leader")) + 1)
        taken = taken_list[0]
        # The last renewal that reached Redis in time left at most one renew interval before
        # the cut; a late one extends the lease by at most one TTL from when it lands.
        assert taken.at - (cut_at - FAST_TIMING.renew_interval) <= 2 * ttl + 0.5
        assert lost.at < taken.at
        assert taken.fields["token"] == 2
        await rec.wait_for("committed", taken.node, count=len(rec.of("committed", taken.node)) + 3)
        await a.shutdown()
        await b.shutdown()
        nursery.cancel_scope.cancel()
    assert assert_exactly_once_in_order(redis_client, job) > 0
