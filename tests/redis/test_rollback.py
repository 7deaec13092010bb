"""Redis going back in time (a failover to a replica that missed writes, a restore): the node stays
live, never reuses a token it has seen, and the stream on the surviving Redis stays exactly-once.

A rollback is reproduced on one real redis-server by DUMPing the job's keys at one moment and
RESTOREing them later: the token counter, the cursor, the events and the audit go back together, as
they do on a promoted replica.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import trio

from actors.lease_store import Acquired, LeaseStore, StateLost, job_keys
from actors.source import SyntheticSource
from actors.token_memory import TokenMemory
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import (
    OpenStore,
    Recorder,
    assert_exactly_once_in_order,
    events_in_stream,
    start_node,
)

SLOW = SyntheticSource(total=None, batch_size=5, interval=0.05)


def snapshot(client: redis.Redis, job: str) -> dict[str, bytes | None]:
    kw = client.connection_pool.connection_kwargs
    raw = redis.Redis(host=kw["host"], port=kw["port"], db=kw.get("db", 0))
    try:
        return {key: raw.dump(key) for key in job_keys(job).values()}  # type: ignore[misc]
    finally:
        raw.close()


def roll_back(client: redis.Redis, saved: dict[str, bytes | None]) -> None:
    """Put the job's keys back as they were at ``snapshot`` (absent keys deleted)."""
    pipe = client.pipeline(transaction=True)
    for key, value in saved.items():
        pipe.delete(key)
        if value is not None:
            pipe.restore(key, 0, value, replace=True)
    pipe.execute()


def test_token_memory_survives_restarts_only_goes_up_and_is_shared(tmp_path: Path) -> None:
    first = TokenMemory("job/with:odd name", tmp_path / "state")
    assert first.value == 0
    assert first.raise_to(5) and not first.raise_to(3)
    second = TokenMemory("job/with:odd name", tmp_path / "state")  # a restarted node
    assert second.value == 5
    assert second.raise_to(9)
    assert first.raise_to(7)  # a stale in-memory value never lowers the file
    assert TokenMemory("job/with:odd name", tmp_path / "state").value == 9
    assert TokenMemory("another", tmp_path / "state").value == 0
    memory_only = TokenMemory("job/with:odd name")
    assert memory_only.path is None and memory_only.raise_to(4) and memory_only.value == 4
    assert first.path is not None
    first.path.write_text("garbage")
    with pytest.raises(ValueError, match="does not hold a fencing token"):
        TokenMemory("job/with:odd name", tmp_path / "state")


async def test_acquire_after_a_rollback_floors_above_the_known_token_and_audits_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, job)
    grant = await store.acquire("a", 60_000)
    assert isinstance(grant, Acquired) and grant.token == 1 and grant.rolled_back_from is None
    from actors.source import Record

    assert await store.commit("a", 1, None, [Record("10", "{}")])
    saved = snapshot(redis_client, job)
    assert await store.release("a", 1)
    for token in (2, 3):
        again = await store.acquire("a", 60_000)
        assert isinstance(again, Acquired) and again.token == token
        assert await store.release("a", token)
    roll_back(redis_client, saved)  # counter 1, lease "1|a" again, cursor "10"
    redis_client.delete(job_keys(job)["lease"])
    after = await store.acquire("b", 60_000, known_token=3)
    assert isinstance(after, Acquired)
    assert after.token == 4 and after.rolled_back_from == 1 and after.cursor == "10"
    last = redis_client.xrevrange(job_keys(job)["audit"], count=1)[0][1]
    assert last["rolled_back_from"] == "1" and last["token"] == "4"
    # A loss is not a rollback: with the cursor gone too, nothing is issued (to a caller that saw
    # the job commit: tests/redis/test_state_lost.py has the caller that did not).
    redis_client.delete(*job_keys(job).values())
    lost = await store.acquire("b", 60_000, known_token=4, known_committed=True)
    assert lost == StateLost(counter=0, cursor=None)
    assert redis_client.get(job_keys(job)["token"]) is None


async def test_a_restarted_node_never_reuses_a_token_after_redis_goes_back_in_time(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, tmp_path: Path, open_store: OpenStore
) -> None:
    """Without a durable token memory a restarted node accepts a Redis that went back and is
    issued a token it already used; with node.state_dir it is floored above it."""
    state = str(tmp_path / "state")
    saved: dict[str, bytes | None] = {}
    for generation in range(3):
        rec = Recorder()
        if generation == 2:
            roll_back(redis_client, saved)  # back to the end of generation 0
        async with trio.open_nursery() as nursery:
            handle = await start_node(nursery, rec, redis_server.url, job, "a", SLOW, state_dir=state)
            grant = await rec.wait_for("became-leader")
            await rec.wait_for("committed", count=3)
            await handle.shutdown()
        if generation == 0:
            saved = snapshot(redis_client, job)
            assert grant.fields["token"] == 1
        elif generation == 1:
            assert grant.fields["token"] == 2
        else:
            # Redis's counter said 1; the node remembered 2 across its restart.
            assert grant.fields["token"] == 3, grant.fields
            remembered = TokenMemory(job, state, deployment=open_store(redis_server.url, job).deployment)
            assert remembered.value == 3 and remembered.committed
    assert assert_exactly_once_in_order(redis_client, job) > 0
    tokens = [int(t) for _i, t, _n in events_in_stream(redis_client, job)]
    assert tokens == sorted(tokens) and set(tokens) == {1, 3}  # term 2's records went back


async def test_a_fencing_rejection_raises_the_known_token(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """The counter a rejection names is a token in use: the node must never be issued it again,
    even when Redis later goes back below it."""
    keys = job_keys(job)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        handle = await start_node(nursery, rec, redis_server.url, job, "a", SLOW)
        await rec.wait_for("became-leader", token=1)
        await rec.wait_for("committed", count=2)
        # Someone else's terms moved the counter to 6; a lease under token 1 (not a's) hides it
        # from a's next campaign, so only the rejection can tell a about token 6.
        pipe = redis_client.pipeline(transaction=True)
        pipe.set(keys["token"], 6)
        pipe.set(keys["lease"], "1|zz", px=1500)
        pipe.execute()
        rejected = await rec.wait_for("fencing-token-rejected")
        assert rejected.fields["current_token"] == 6
        await rec.wait_for("standby", leader="zz")
        redis_client.set(keys["token"], 1)  # Redis goes back below 6
        again = await rec.wait_for("became-leader", count=2, within=10)
        assert again.fields["token"] == 7, again.fields
        await handle.shutdown()


async def test_acquire_and_commit_wait_for_a_replica_and_report_what_it_did_not_confirm(
    redis_server: LocalRedis, job: str
) -> None:
    """With min_replicas_acked, a write the replica did not acknowledge in time is ambiguous
    (ReplicationUnconfirmed, a RedisUnavailable) although the primary applied it."""
    from actors.lease_store import Committed, ReplicationUnconfirmed, connect
    from actors.source import Record

    primary = LocalRedis().start()
    replica = LocalRedis(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    try:
        probe = connect(primary.url, timeout=2.0)
        for _ in range(200):  # up to 10 s for the first full sync
            if (probe.info("replication").get("slave0") or {}).get("state") == "online":
                break
            await trio.sleep(0.05)
        else:
            raise AssertionError("the replica never came online")
        # A replica on a loaded machine may take a few hundred ms to acknowledge: wait up to 1 s
        # (half the call bound), so that only the stopped replica below fails to.
        store = LeaseStore(connect(primary.url, timeout=2.0), job, min_replicas_acked=1)
        grant = await store.acquire("a", 60_000)
        assert isinstance(grant, Acquired) and grant.replid
        ok = await store.commit("a", grant.token, None, [Record("10", "{}")])
        assert isinstance(ok, Committed)
        assert replica.process is not None
        replica.process.send_signal(19)  # SIGSTOP: the replica cannot acknowledge
        try:
            with pytest.raises(ReplicationUnconfirmed) as caught:
                await store.commit("a", grant.token, "10", [Record("11", "{}")])
            assert caught.value.acked == 0 and caught.value.wanted == 1
            assert "acknowledged by 0 of the 1 replicas" in str(caught.value)
            # Applied by the primary all the same: that is why it counts as unknown.
            assert probe.hget(job_keys(job)["cursor"], "cursor") == "11"
            # A lease grant so applied names its token (the node logs it; the audit holds it).
            assert await store.release("a", grant.token) is True
            with pytest.raises(ReplicationUnconfirmed) as caught:
                await store.acquire("a", 60_000)
            assert caught.value.token == grant.token + 1
            assert probe.get(job_keys(job)["lease"]) == f"{grant.token + 1}|a"
        finally:
            replica.process.send_signal(18)  # SIGCONT
        probe.close()
        store.client.close()
    finally:
        replica.stop()
        primary.stop()
