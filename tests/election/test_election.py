"""The election core end to end: in-process nodes, the real actors, a real redis-server."""

from __future__ import annotations

import json

import redis
import structlog
import trio

from actors.lease import LeaseTiming
from actors.lease_store import job_keys
from actors.source import SyntheticSource
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.verify import SourceRecord, check_stream, read_entries, read_grants
from tests.support.nodes import (
    FAST_TIMING,
    Recorder,
    assert_exactly_once_in_order,
    events_in_stream,
    start_node,
)

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)


def assert_one_writer_per_term(client: redis.Redis, job: str) -> int:
    """The stream checked on Redis's own clock (:func:`ingestion.verify.check_stream` with the
    audit stream's grants): every record once, in order, and each token's entries written by the
    node granted that token, after its grant and before the next one. Two leaders writing at once
    fail this, whatever order their log lines reached the test in."""
    entries = read_entries(client, job)
    expected = [LIVE.record(i) for i in range(1, len(entries) + 1)]
    source = [SourceRecord(r.paging_token, json.loads(r.body)) for r in expected]
    result = check_stream(entries, source, read_grants(client, job))
    assert result.ok, result.summary()
    return result.count


async def test_two_nodes_started_together_elect_exactly_one_leader(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        handles = []
        async with trio.open_nursery() as starters:
            for name in ("a", "b"):
                starters.start_soon(
                    lambda n=name: _append(handles, start_node(nursery, rec, redis_server.url, job, n, LIVE))
                )
        leader = await rec.wait_for("became-leader")
        standby = await rec.wait_for("standby")
        assert {leader.node, standby.node} == {"a", "b"}
        assert standby.fields == {"leader": leader.node, "token": 1}
        await trio.sleep(3 * FAST_TIMING.ttl)  # several lease lifetimes: one leader at a time
        # A step-down on a starved CI machine is allowed; two leaders for one term never: each
        # grant is a new token, and the lease names the holder of the newest one (or nobody, in
        # the instant between two terms).
        keys = job_keys(job)
        lease, counter = redis_client.pipeline().get(keys["lease"]).get(keys["token"]).execute()
        if lease is not None:
            holder = await rec.wait_for("became-leader", token=int(counter), within=5)
            assert lease == f"{counter}|{holder.node}"
        grants = [(e.fields["token"], e.node) for e in rec.of("became-leader")]
        assert len({t for t, _n in grants}) == len(grants), f"a token granted twice: {grants}"
        print(f"\n{len(grants)} terms in {3 * FAST_TIMING.ttl:.1f} s: {grants}")
        for h in handles:
            await h.shutdown()
    # Two writers at once, judged on one clock (Redis's): no entry under a token after the next
    # token was granted.
    assert assert_one_writer_per_term(redis_client, job) > 0


async def _append(out: list, coro) -> None:  # type: ignore[type-arg, no-untyped-def]
    out.append(await coro)


async def test_partitioned_leader_stops_before_its_lease_expires_and_standby_takes_over(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """Renewals stop (the leader's Redis link drops every packet): the leader's ingestion scope
    fires before the lease can expire in Redis; the standby takes over with a higher token; the
    audit stream records who took over from whom; once healed the old leader stands by."""
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        a = await start_node(nursery, rec, f"redis://127.0.0.1:{proxy.port}/0", job, "a", LIVE)
        await rec.wait_for("became-leader", "a")
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE)
        await rec.wait_for("standby", "b")
        await rec.wait_for("committed", "a", count=5)

        proxy.set_mode("blackhole")
        cut_at = trio.current_time()
        lost = await rec.wait_for("lost-leadership", "a")
        taken = await rec.wait_for("became-leader", "b")
        assert lost.fields["reason"] in ("redis-unavailable", "lease-expired")
        # The last renewal that reached Redis was sent before the cut, so Redis cannot expire the
        # lease before cut_at - renew_interval + ttl... and the leader stopped before even that.
        assert lost.at < cut_at + FAST_TIMING.ttl - FAST_TIMING.margin / 2
        assert lost.at < taken.at
        last_commit_by_a = max(e.at for e in rec.of("committed", "a"))
        assert last_commit_by_a < lost.at
        assert taken.fields["token"] == 2
        assert taken.fields["previous_node"] == "a" and taken.fields["previous_token"] == 1
        assert taken.fields["takeover_ms"] is not None and taken.fields["takeover_ms"] >= 0

        audit = [f for _id, f in redis_client.xrange(job_keys(job)["audit"])]
        takeover = [f for f in audit if f["event"] == "became-leader" and f["node"] == "b"]
        assert takeover and takeover[-1]["previous_node"] == "a"
        assert takeover[-1]["previous_token"] == "1" and takeover[-1]["token"] == "2"

        proxy.set_mode("forward")
        await rec.wait_for("standby", "a", leader="b", token=2, within=10)
        await rec.wait_for("committed", "b", count=3)
        await b.shutdown()
        await a.shutdown()
        nursery.cancel_scope.cancel()  # the proxy
    count = assert_exactly_once_in_order(redis_client, job)
    assert count > 0


async def test_refused_connection_makes_leader_step_down_and_campaign_again(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        a = await start_node(nursery, rec, f"redis://127.0.0.1:{proxy.port}/0", job, "a", LIVE)
        await rec.wait_for("committed", "a", count=3)
        proxy.set_mode("refuse")
        lost = await rec.wait_for("lost-leadership", "a")
        assert lost.fields["reason"] == "redis-unavailable"
        await rec.wait_for("redis-unavailable", "a")
        proxy.set_mode("forward")
        # Alone in the cluster: once Redis is back (and its old lease gone) it leads again.
        again = await rec.wait_for("became-leader", "a", count=2, within=10)
        assert again.fields["token"] == 2
        await rec.wait_for("committed", "a", count=len(rec.of("committed", "a")) + 2)
        await a.shutdown()
        nursery.cancel_scope.cancel()  # the proxy
    assert_exactly_once_in_order(redis_client, job)


async def test_stale_leader_write_is_rejected_after_takeover(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """A former leader that still believes it leads writes with its old token: Redis rejects it,
    nothing changes, ``fencing-token-rejected`` is logged and the former leader steps down."""
    slow_renewals = LeaseTiming(ttl=30.0, renew_interval=10.0, margin=2.0)
    source = SyntheticSource(total=None, batch_size=5, interval=0.3)
    rec = Recorder()
    keys = job_keys(job)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            a = await start_node(
                nursery, rec, redis_server.url, job, "a", source, timing=slow_renewals
            )
            await rec.wait_for("committed", "a", count=2)
            # Redis forgets a's lease (as if it had expired while a was paused); a does not know.
            redis_client.delete(keys["lease"])
            b = await start_node(nursery, rec, redis_server.url, job, "b", source, timing=slow_renewals)
            taken = await rec.wait_for("became-leader", "b")
            assert taken.fields["token"] == 2
            before = redis_client.hgetall(keys["cursor"])
            events_before = redis_client.xlen(keys["events"])
            lost = await rec.wait_for("lost-leadership", "a", within=5)
            assert lost.fields == {"token": 1, "reason": "fenced"}
            # a's rejected write changed nothing: every entry after the takeover is b's.
            tokens_after = [t for _i, t, _n in events_in_stream(redis_client, job)[events_before:]]
            assert set(tokens_after) <= {"2"}
            assert redis_client.hget(keys["cursor"], "token") in (before.get("token"), "2")
            await rec.wait_for("standby", "a", leader="b", token=2)
            await b.shutdown()
            await a.shutdown()
    rejected = [e for e in logs if e["event"] == "fencing-token-rejected"]
    assert rejected and rejected[0]["node"] == "a"
    assert rejected[0]["token"] == 1 and rejected[0]["current_token"] == 2
    assert "cursor" in rejected[0]
    assert_exactly_once_in_order(redis_client, job)


async def test_graceful_shutdown_releases_lease_and_standby_leads_within_milliseconds(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    timing = LeaseTiming(ttl=5.0, renew_interval=1.0, margin=1.0)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", LIVE, timing=timing)
        await rec.wait_for("became-leader", "a")
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE, timing=timing)
        await rec.wait_for("standby", "b")
        await rec.wait_for("committed", "a", count=3)
        asked = trio.current_time()
        await a.shutdown("SIGTERM")
        taken = await rec.wait_for("became-leader", "b", within=timing.ttl)
        handoff = taken.at - asked
        assert handoff < 0.5, f"handoff took {handoff:.3f}s, not a few hundred ms (TTL is 5 s)"
        lost = rec.of("lost-leadership", "a")
        assert lost[0].fields == {"token": 1, "reason": "shutdown"}
        assert rec.of("stopped", "a")
        await rec.wait_for("committed", "b", count=2)
        await b.shutdown()
    audit = [f["event"] for _id, f in redis_client.xrange(job_keys(job)["audit"])]
    assert audit == ["became-leader", "released", "became-leader", "released"]
    assert_exactly_once_in_order(redis_client, job)


async def test_restarting_every_node_resumes_from_the_committed_cursor(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    total = 400
    source = SyntheticSource(total=total, batch_size=7, interval=0.01)
    keys = job_keys(job)
    elections = 0
    for generation in range(3):
        rec = Recorder()
        committed_before = redis_client.hget(keys["cursor"], "cursor")  # nobody runs now
        async with trio.open_nursery() as nursery:
            handles = [
                await start_node(nursery, rec, redis_server.url, job, name, source)
                for name in ("a", "b")
            ]
            leader = await rec.wait_for("became-leader")
            assert leader.fields["cursor"] == (committed_before or "0")
            if generation < 2:
                await rec.wait_for("committed", count=10)
            else:
                while redis_client.hget(keys["cursor"], "cursor") != source.token_of(total):
                    await rec.wait_for("committed", count=len(rec.of("committed")) + 1)
            for h in handles:
                await h.shutdown()
        elections += len(rec.of("became-leader"))  # 1 a generation, more if starved CI stepped down
    assert assert_exactly_once_in_order(redis_client, job) == total
    tokens = [int(t) for _i, t, _n in events_in_stream(redis_client, job)]
    assert tokens == sorted(tokens), "a write carried a token below an earlier write's"
    # Every generation led under a token of its own. The bound is the grants the audit stream
    # holds, not the elections the nodes logged: an acquire whose reply a starved CI timed out
    # was granted all the same, and the node hands that lease back without logging a term.
    grants = [
        int(f["token"]) for _id, f in redis_client.xrange(keys["audit"]) if f["event"] == "became-leader"
    ]
    assert len(grants) >= elections and grants == sorted(grants)
    assert 3 <= tokens[-1] and set(tokens) <= set(grants)
