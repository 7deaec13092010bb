"""The Elector's rarer log events, each reached for real: one Elector against a real Redis, the
test playing its Heartbeat and Ingestor through the actor's own channels.

``redis-failover-detected`` (a rollback, a new replication id), ``release-failed`` (at the end of a
term and when leaving after an unknown outcome), ``term-not-ended`` (the Ingestor does not report
the end of a revoked term) and ``renewal-after-ingest-deadline`` (the Ingestor's scope fired but a
renewal had moved the Elector's deadline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import structlog
import trio
from structlog.testing import capture_logs

from actors.elector import Elector, ReleaseNoticed
from actors.lease import LeaseTiming
from actors.lease_store import Acquired, LeaseStore, connect
from actors.messages import (
    ElectorInput,
    HeartbeatInput,
    IngestorInput,
    LeaseGranted,
    LeaseRevoked,
    ShutdownRequested,
    TermEnded,
)
from actors.observe import NodeObserver
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until

# Long enough that nothing expires while a test is talking to the Elector.
SLOW_TIMING = LeaseTiming(ttl=20.0, renew_interval=4.0, margin=2.0)


class ElectorUnderTest:
    """An Elector whose Heartbeat and Ingestor are the test."""

    def __init__(self, store: LeaseStore, timing: LeaseTiming = SLOW_TIMING, known_token: int = 0) -> None:
        self.inbox, inbox_recv = trio.open_memory_channel[ElectorInput | ReleaseNoticed](16)
        heartbeat_send, self.heartbeat = trio.open_memory_channel[HeartbeatInput](16)
        ingestor_send, self.ingestor = trio.open_memory_channel[IngestorInput](16)
        self.elector = Elector(
            store, "n", int(timing.ttl * 1000), timing, 0.0, "0", inbox_recv, heartbeat_send,
            ingestor_send, structlog.get_logger(), NodeObserver("n", store.job), known_token=known_token,
        )  # fmt: skip
        self.done = trio.Event()

    async def start(self, nursery: trio.Nursery) -> None:
        async def run() -> None:
            await self.elector.run()
            self.done.set()

        nursery.start_soon(run)

    async def granted(self) -> LeaseGranted:
        with trio.fail_after(5):
            msg = await self.ingestor.receive()
        assert isinstance(msg, LeaseGranted), msg
        return msg

    async def stop_leading(self, token: int) -> None:
        """Ask the node to shut down while it leads; end the term when it is revoked."""
        await self.inbox.send(ShutdownRequested("SIGTERM"))
        with trio.fail_after(5):
            revoked = await self.ingestor.receive()
        assert revoked == LeaseRevoked(token, "shutdown", graceful=True)
        await self.inbox.send(TermEnded(token, "revoked"))
        with trio.fail_after(5):
            await self.done.wait()


async def logged(logs: list[dict[str, Any]], event: str, within: float = 5.0) -> dict[str, Any]:
    """The first captured log line of ``event``, waiting (bounded) for it."""
    found = await wait_until(
        lambda: [e for e in logs if e["event"] == event], within, what=f"{event} logged", every=0.01
    )
    return found[0]


def events(logs: list[dict[str, Any]], match: Callable[[dict[str, Any]], bool] = lambda e: True) -> list[str]:
    return [e["event"] for e in logs if match(e)]


async def test_a_rollback_below_the_known_token_is_logged_as_a_failover_with_what_redis_had(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """Redis's counter (2) is below the token this node has seen (5) and the cursor survived: a
    failover to a replica that missed writes. The new token is floored above 5 and it is said."""
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    redis_client.set(store.keys["token"], 2)
    redis_client.hset(store.keys["cursor"], mapping={"cursor": "10", "token": "2", "node": "old"})
    e = ElectorUnderTest(store, known_token=5)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await e.start(nursery)
            grant = await e.granted()
            assert (grant.token, grant.cursor) == (6, "10")
            await e.stop_leading(6)
    failover = [x for x in logs if x["event"] == "redis-failover-detected"]
    assert len(failover) == 1
    assert failover[0]["log_level"] == "warning"
    assert {k: failover[0][k] for k in ("rolled_back", "redis_token", "known_token", "cursor")} == {
        "rolled_back": True, "redis_token": 2, "known_token": 5, "cursor": "10",
    }  # fmt: skip


async def test_a_new_replication_id_between_two_answers_is_logged_as_a_failover(
    private_redis: LocalRedis, job: str
) -> None:
    """A standby sees another holder; the primary is then replaced (its replication id changes,
    as when a replica is promoted); the next answer is logged as a failover, not a rollback."""
    client = connect(private_redis.url, timeout=1.0)
    holder = LeaseStore(client, job)
    assert isinstance(await holder.acquire("other", 60_000), Acquired)
    store = LeaseStore(connect(private_redis.url, timeout=1.0), job)
    e = ElectorUnderTest(store)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await e.start(nursery)
            await logged(logs, "standby")
            before = client.info("replication")["master_replid"]
            client.replicaof("127.0.0.1", 9)  # a replica for a moment (of nothing), then promoted:
            client.replicaof("NO", "ONE")  # Redis gives a promoted replica a new replication id
            after = client.info("replication")["master_replid"]
            assert after != before
            await e.inbox.send(ReleaseNoticed("other"))  # wakes the standby: it asks again
            failover = await logged(logs, "redis-failover-detected")
            await e.inbox.send(ShutdownRequested("SIGTERM"))
            with trio.fail_after(5):
                await e.done.wait()
    assert failover["log_level"] == "info"
    assert (failover["previous_replid"], failover["replid"]) == (before, after)
    assert failover["rolled_back"] is False and failover["redis_token"] is None
    assert events(logs).count("redis-failover-detected") == 1
    client.close()


async def test_a_release_that_cannot_reach_redis_is_logged_and_retried_when_leaving(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """Redis goes away during the term: the release at its end fails (``release-failed`` with the
    token), and leaving, the Elector tries once more to free what may still be its lease
    (``release-failed`` without a token). The lease stays in Redis, as both lines say."""
    async with trio.open_nursery() as outer:
        proxy: TcpProxy = await outer.start(TcpProxy(redis_server.port).serve)
        store = LeaseStore(connect(f"redis://127.0.0.1:{proxy.port}/0", timeout=0.25), job)
        e = ElectorUnderTest(store)
        with capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await e.start(nursery)
                grant = await e.granted()
                proxy.set_mode("refuse")
                await e.stop_leading(grant.token)
        outer.cancel_scope.cancel()
    failed = [x for x in logs if x["event"] == "release-failed"]
    assert [(x["token"], x["log_level"]) for x in failed] == [(grant.token, "warning"), (None, "warning")]
    assert all(x["error"] for x in failed)
    assert "lease-released" not in events(logs)
    assert redis_client.get(store.keys["lease"]) == f"{grant.token}|n"


async def test_a_term_whose_end_is_not_reported_is_logged_and_no_new_term_starts(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """No renewals: the Elector's ingest deadline passes and it revokes the term. The Ingestor
    (the test) does not answer for a whole TTL: ``term-not-ended``, and the Elector keeps waiting
    rather than campaign for a term that could overlap the one still running."""
    timing = LeaseTiming(ttl=1.0, renew_interval=0.2, margin=0.3)
    store = LeaseStore(connect(redis_server.url, timeout=0.5), job)
    e = ElectorUnderTest(store, timing)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await e.start(nursery)
            grant = await e.granted()
            with trio.fail_after(5):
                revoked = await e.ingestor.receive()
            assert revoked == LeaseRevoked(grant.token, "lease-expired", graceful=False)
            not_ended = await logged(logs, "term-not-ended")
            assert e.ingestor.statistics().current_buffer_used == 0  # no new term was granted
            assert redis_client.get(store.keys["token"]) == str(grant.token)  # nor campaigned for
            await e.inbox.send(TermEnded(grant.token, "revoked"))
            regrant = await e.granted()  # once the term has ended, the node campaigns again
            assert regrant.token == grant.token + 1
            await e.stop_leading(regrant.token)
    assert not_ended["log_level"] == "error"
    assert (not_ended["token"], not_ended["waited_s"]) == (grant.token, 1.0)


async def test_an_ingest_deadline_reported_after_a_renewal_moved_it_is_a_hand_back_not_an_expiry(
    redis_server: LocalRedis, job: str
) -> None:
    """The Ingestor reports that its scope fired at the ingest deadline, but the Elector's deadline
    is still ahead (a renewal moved it and had not reached the Ingestor yet): the lease is valid,
    so the term ends as ``released``, and the Elector says why."""
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    e = ElectorUnderTest(store)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await e.start(nursery)
            grant = await e.granted()
            assert trio.current_time() < grant.ingest_deadline
            await e.inbox.send(TermEnded(grant.token, "deadline"))
            regrant = await e.granted()
            await e.stop_leading(regrant.token)
    late = [x for x in logs if x["event"] == "renewal-after-ingest-deadline"]
    assert [(x["token"], x["log_level"]) for x in late] == [(grant.token, "warning")]
    lost = [(x["token"], x["reason"]) for x in logs if x["event"] == "lost-leadership"]
    assert lost[0] == (grant.token, "released")
    assert "lease-released" in events(logs, lambda x: x.get("token") == grant.token)
