"""Many webhook jobs led by one node: their idle waits for the source job's next record must leave
the node's renewals and commits their threads and connections (issue 46), and still wake at once."""

from __future__ import annotations

import time
from typing import Any

import trio

from actors.lease_store import LeaseStore, RedisUnavailable, ReleaseNotices, connect, stream_waits
from actors.source import SyntheticSource
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.receiver import Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from ingestion.webhook.admin import request_pause
from ingestion.webhook.records import Stored, StreamRecords, holder_group
from tests.support.nodes import OpenStore, Recorder, start_node
from tests.support.webhooks import SECRET, commit_source_records, webhook

IDLE = 120  # idle webhook leaders on the node
RENEWALS = 40  # renewal-sized calls made while they wait
BOUND = 0.5  # seconds: the bound of each renewal


async def test_idle_webhook_waits_leave_renewals_their_threads(redis_server: LocalRedis, job: str) -> None:
    """120 idle readers of 120 source streams, all on the node's one client, wait for records
    while 40 leases are renewed at once, each within 500 ms: none may time out (before: the waits
    held trio's 40 default threads and redis-py's 100 pooled connections, and 23 of 40 timed out).
    A record committed to one source then wakes its reader within 250 ms."""
    client = connect(redis_server.url, timeout=1.0)
    try:
        leases = [LeaseStore(client, f"{job}-lead{i}", call_timeout=BOUND) for i in range(RENEWALS)]
        tokens = []
        for store in leases:
            got = await store.acquire("n1", 30_000)
            tokens.append(got.token)  # type: ignore[union-attr]
        sources = [LeaseStore(client, f"{job}-src{i}", call_timeout=1.0) for i in range(IDLE)]
        readers = [StreamRecords(s, f"webhook:{job}-hook{i}") for i, s in enumerate(sources)]
        woke: dict[int, float] = {}
        failed_waits = 0

        async def idle(i: int) -> None:
            nonlocal failed_waits
            while True:
                start = trio.current_time()
                try:
                    await readers[i].wait("0-0", 5.0)
                except RedisUnavailable:
                    failed_waits += 1  # (a term would end on it)
                    continue
                if trio.current_time() - start < 4.0 and await readers[i].read("0-0", 1):
                    woke[i] = time.monotonic()
                    return

        timed_out = 0

        async def renew(store: LeaseStore, token: int) -> None:
            nonlocal timed_out
            try:
                await store.renew("n1", token, 30_000)
            except RedisUnavailable:
                timed_out += 1

        async with trio.open_nursery() as nursery:
            for i in range(IDLE):
                nursery.start_soon(idle, i)
            await trio.sleep(0.5)  # every reader waiting
            for _ in range(3):
                async with trio.open_nursery() as renewals:
                    for store, token in zip(leases, tokens, strict=True):
                        renewals.start_soon(renew, store, token)
                await trio.sleep(0.2)
            bound = f"{BOUND * 1000:.0f} ms bound"
            assert timed_out == 0, f"{timed_out} of {3 * RENEWALS} renewals timed out ({bound})"
            assert failed_waits == 0, f"{failed_waits} waits of the idle readers failed"

            writer = LeaseStore(connect(redis_server.url, timeout=1.0), f"{job}-src7")
            got = await writer.acquire("src", 30_000)
            committed_at = time.monotonic()
            await writer.commit("src", got.token, None, [SyntheticSource(total=1).record(1)])  # type: ignore[union-attr]
            writer.client.close()
            with trio.fail_after(2):
                while 7 not in woke:  # noqa: ASYNC110 (the reader's task says when it woke)
                    await trio.sleep(0.005)
            late = woke[7] - committed_at
            assert late < 0.25, f"woken {1000 * late:.0f} ms after the commit"
            assert list(woke) == [7]
            nursery.cancel_scope.cancel()
    finally:
        client.close()


async def test_standby_subscriptions_of_many_jobs_leave_renewals_connections(
    redis_server: LocalRedis, job: str
) -> None:
    """A node starting 200 jobs has each of them a standby at first, each subscribed for its job's
    release notices (a pooled connection each) while its leases are renewed: redis-py's pool must
    hold them all (its default of 100 raised ``MaxConnectionsError`` for the renewals: the node
    of issue 46 logged 6,449 ``redis-unavailable`` lines and ended 267 terms ``commit-unknown``)."""
    client = connect(redis_server.url, timeout=1.0)
    try:
        leases = [LeaseStore(client, f"{job}-lead{i}", call_timeout=1.0) for i in range(RENEWALS)]
        tokens = [(await s.acquire("n1", 30_000)).token for s in leases]  # type: ignore[union-attr]
        notices = [ReleaseNotices(LeaseStore(client, f"{job}-standby{i}")) for i in range(160)]
        failed: list[str] = []

        async def renew(store: LeaseStore, token: int) -> None:
            try:
                await store.renew("n1", token, 30_000)
            except RedisUnavailable as exc:
                failed.append(str(exc))

        async with trio.open_nursery() as nursery:
            for n in notices:
                nursery.start_soon(n.wait, 3.0)
            await trio.sleep(1.0)  # every standby subscribed
            async with trio.open_nursery() as renewals:
                for store, token in zip(leases, tokens, strict=True):
                    renewals.start_soon(renew, store, token)
            assert not failed, f"{len(failed)} of {RENEWALS} renewals failed: {failed[0]}"
            nursery.cancel_scope.cancel()
        for n in notices:
            n.close()
    finally:
        client.close()


class CountedReads(StreamRecords):
    """The source stream, counting the reads of it (each one a call on the node's threads)."""

    reads = 0

    async def read(self, after: str, count: int) -> list[Stored]:
        self.reads += 1
        return await super().read(after, count)


async def test_an_idle_webhook_job_reads_its_source_only_when_woken_or_every_idle_wait(
    redis_server: LocalRedis, open_store: OpenStore, job: str
) -> None:
    """An idle leader reads the source stream about once per ``IDLE_WAIT`` (5 s), not every
    second (150 idle jobs made 150 reads a second of the node's calls), and still delivers a new
    record at once, with one read (a short page is the end: no second read to find it empty)."""
    receiver = Receiver(SECRET)
    url = redis_server.url
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        hook, _ = webhook(open_store, url, f"{job}-src", f"{job}-hook", port)
        counted = CountedReads(open_store(url, f"{job}-src", timeout=1.0), holder_group(f"{job}-hook"))
        hook.records = counted
        node = await start_node(nursery, Recorder(), url, f"{job}-hook", "a", hook)
        await wait_until(lambda: counted.reads > 0, 5, what="the first read")
        before = counted.reads
        await trio.sleep(4.0)
        assert counted.reads - before <= 1, f"{counted.reads - before} reads in 4 s of idling"
        idle = counted.reads
        await commit_source_records(open_store(url, f"{job}-src"), 1, 1)
        await receiver.wait_for(1, 1.0)
        await trio.sleep(1.0)
        # one read for the new record: it came short, so the next is waited for, not read for
        assert counted.reads - idle == 1, f"{counted.reads - idle} reads for one new record"
        await node.shutdown()
        nursery.cancel_scope.cancel()


async def test_waiters_of_one_stream_at_different_positions_wake_only_for_entries_after_theirs(
    redis_server: LocalRedis, job: str
) -> None:
    """One shared read serves waiters at several positions of a stream: one behind the newest entry
    wakes at once, one at the newest waits for the next commit, and then wakes within 250 ms."""
    client = connect(redis_server.url, timeout=1.0)
    try:
        store = LeaseStore(client, f"{job}-src")
        got = await store.acquire("src", 30_000)
        token = got.token  # type: ignore[union-attr]
        src = SyntheticSource(total=3)
        await store.commit("src", token, None, [src.record(1)])
        await store.commit("src", token, src.token_of(1), [src.record(2)])
        first, second = [entry[0] for entry in client.xrange(store.keys["events"])]  # type: ignore[union-attr]
        waits = stream_waits(client, 1.0)
        woke: dict[str, float] = {}

        async def wait(name: str, after: str) -> None:
            if await waits.wait(store.keys["events"], after, 5.0):
                woke[name] = time.monotonic()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "behind", first)
            nursery.start_soon(wait, "at-newest", second)
            await trio.sleep(0.5)
            assert list(woke) == ["behind"]
            committed_at = time.monotonic()
            await store.commit("src", token, src.token_of(2), [src.record(3)])
            with trio.fail_after(2):
                while "at-newest" not in woke:  # noqa: ASYNC110 (the waiter's task says when it woke)
                    await trio.sleep(0.005)
            assert woke["at-newest"] - committed_at < 0.25
    finally:
        client.close()


async def test_an_idle_webhook_job_makes_no_call_of_its_own_each_second(
    redis_server: LocalRedis, open_store: OpenStore, job: str
) -> None:
    """An idle leader's looks at its operators' requests (each second) and counts of its held dead
    letters (every 5 s) ride on the node's batch, one call a second for all its webhook jobs, not
    a call of its own each (150 webhook jobs on a node made about 180 calls a second for them);
    a request is still carried out."""
    receiver = Receiver(SECRET)
    url = redis_server.url
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_receiver, receiver)
        await commit_source_records(open_store(url, f"{job}-src"), 1, 1)
        hook, store = webhook(open_store, url, f"{job}-src", f"{job}-hook", port)
        calls = 0
        run = store.run

        async def counted(fn: Any, *args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await run(fn, *args)

        store.run = counted  # type: ignore[method-assign]
        node = await start_node(nursery, Recorder(), url, f"{job}-hook", "a", hook)
        await receiver.wait_for(1, 5.0)
        await trio.sleep(1.0)  # the term's first looks done
        before = calls
        await trio.sleep(5.0)
        assert calls - before <= 1, f"{calls - before} calls of the job's own in 5 s of idling"
        request_pause(store.client, f"{job}-hook", True, by="test")
        await wait_until(lambda: hook.stats.state == "paused", 5, what="the pause carried out")
        await node.shutdown()
        nursery.cancel_scope.cancel()
