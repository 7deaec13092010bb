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
from actors.lease_store import job_keys
from actors.source import Batch, Record
from ingestion.local_redis import LocalRedis
from tests.conftest import make_store
from tests.nodes import Recorder, start_node


async def test_a_notice_published_while_nobody_waits_survives_the_resubscription(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """A notice that reached the old subscription between two waits must not be dropped when the
    next wait renews the subscription (it used to close the old connection unread)."""
    store = make_store(redis_server.url, job)
    notices = store.release_notices()
    try:
        assert await notices.wait(0.05) is None  # subscribed
        notices._waits = notices.RESUBSCRIBE_EVERY  # the next wait renews the subscription
        redis_client.publish(job_keys(job)["released"], "7|other-node")
        await trio.sleep(0.05)  # delivered to the old connection, which nobody reads now
        assert await notices.wait(1.0) == "other-node"
    finally:
        notices.close()
        store.client.close()


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
