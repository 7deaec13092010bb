"""The lease path (acquire, renew, release, commit) has threads of its own: a node's other calls
(its jobs' reads and housekeeping, on trio's default 40 threads), however many are waiting, never
hold a renewal or a commit back (issue 46: a node with 150 webhook jobs lost leases to commits
and renewals that queued behind their housekeeping). In-process, with a real redis-server."""

from __future__ import annotations

import trio

from actors.lease_store import LeaseStore, RedisUnavailable, Renewal, connect
from actors.source import SyntheticSource
from ingestion.testing.local_redis import LocalRedis

BUSY = 60  # slow calls of the node's jobs under way (more than trio's 40 default threads)
BOUND = 0.5  # seconds: each renewal's and commit's bound


async def test_renewals_and_commits_never_queue_behind_the_other_calls(
    redis_server: LocalRedis, job: str
) -> None:
    client = connect(redis_server.url, timeout=3.0)
    try:
        leases = [LeaseStore(client, f"{job}-{i}", call_timeout=BOUND) for i in range(5)]
        tokens = [(await s.acquire("n1", 30_000)).token for s in leases]  # type: ignore[union-attr]
        other = LeaseStore(client, f"{job}-other", call_timeout=5.0)
        busy = 0

        async def slow(i: int) -> None:  # a call that takes 1.5 s to answer (nothing to pop)
            nonlocal busy
            busy += 1
            await other.run(client.blpop, [f"{job}-nothing-{i}"], 1.5)

        timed_out: list[str] = []

        async def lease_calls(i: int) -> None:
            try:
                await leases[i].renew("n1", tokens[i], 30_000)
                await leases[i].commit("n1", tokens[i], None, [SyntheticSource(total=1).record(1)])
            except RedisUnavailable as exc:
                timed_out.append(str(exc))

        async with trio.open_nursery() as nursery:
            for i in range(BUSY):
                nursery.start_soon(slow, i)
            await trio.testing.wait_all_tasks_blocked()
            assert busy == BUSY
            async with trio.open_nursery() as renewals:
                for i in range(len(leases)):
                    renewals.start_soon(lease_calls, i)
            assert timed_out == [], f"{len(timed_out)} of {len(leases)} lease calls timed out"
            nursery.cancel_scope.cancel()
    finally:
        client.close()


LEASES = 200


async def test_a_nodes_renewals_due_together_go_together(redis_server: LocalRedis, job: str) -> None:
    """200 leases of one node renewed at once (their renewals fall due together) take a few round
    trips, not 200 (each a thread hop of the node: issue 46's node of 200 jobs could not keep up
    on a loaded machine); each gets its own answer, a lost lease its ``LOST``."""
    client = connect(redis_server.url, timeout=3.0)
    try:
        leases = [LeaseStore(client, f"{job}-r{i}", call_timeout=2.0) for i in range(LEASES)]
        tokens = [(await s.acquire("n1", 30_000)).token for s in leases]  # type: ignore[union-attr]
        answers: dict[int, Renewal] = {}

        async def renew(i: int) -> None:
            answers[i] = await leases[i].renew("n1", tokens[i] + (1 if i == 7 else 0), 30_000)

        before = int(client.info("stats")["total_reads_processed"])
        async with trio.open_nursery() as nursery:
            for i in range(LEASES):
                nursery.start_soon(renew, i)
        reads = int(client.info("stats")["total_reads_processed"]) - before
        assert answers == {i: Renewal.LOST if i == 7 else Renewal.RENEWED for i in range(LEASES)}
        assert reads <= 20, f"{reads} reads by Redis for {LEASES} renewals"
    finally:
        client.close()
