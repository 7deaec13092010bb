"""The one reader of a job's state (``actors/lease_store/state.py``) against a real redis-server:
many jobs in one round trip, read as ``LeaseStore.state`` reads one, on any client."""

from __future__ import annotations

import attrs
import redis

from actors.lease_store import JobState, LeaseStore, StateQuery, connect, job_keys, read_states
from actors.source import Record
from ingestion.testing.local_redis import LocalRedis


def untimed(state: JobState) -> JobState:
    """The state without its lease's time left (read twice, a millisecond apart)."""
    return attrs.evolve(state, lease_ttl_ms_left=None)


async def test_many_jobs_are_read_at_once_as_the_store_reads_one(redis_server: LocalRedis, job: str) -> None:
    client = connect(redis_server.url, timeout=2.0)
    store = LeaseStore(client, job)
    acquired = await store.acquire("a", 5000)
    records = [Record(t, f'{{"paging_token":"{t}"}}') for t in ("10", "11")]
    await store.commit("a", acquired.token, None, records)  # type: ignore[union-attr]
    client.hset(job_keys(job)["cursor"], "source", "horizon /operations")  # an application's field

    led, never = read_states(client, [job, f"{job}-never"], audit_count=5)

    assert untimed(led) == untimed(await store.state(5))
    assert (led.leader, led.lease_token, led.token, led.cursor, led.cursor_token, led.events) == (
        "a",
        1,
        1,
        "11",
        1,
        2,
    )
    assert led.cursor_fields == {"cursor": "11", "token": "1", "node": "a", "source": "horizon /operations"}
    assert [entry["event"] for entry in led.audit] == ["became-leader"]
    assert led.lease_ttl_ms_left is not None and 4000 < led.lease_ttl_ms_left <= 5000
    assert (never.job, never.leader, never.lease_token, never.token, never.cursor, never.events) == (
        f"{job}-never",
        None,
        None,
        0,
        None,
        0,
    )
    # a client that does not decode its replies reads the same state
    raw = redis.Redis.from_url(redis_server.url)
    try:
        assert [untimed(s) for s in read_states(raw, [job], audit_count=5)] == [untimed(led)]
    finally:
        raw.close()
        client.close()


async def test_a_caller_reads_the_state_beside_its_own_commands(redis_server: LocalRedis, job: str) -> None:
    client = connect(redis_server.url, timeout=2.0)
    store = LeaseStore(client, job)
    await store.acquire("b", 5000)
    query = StateQuery(job)
    pipe = client.pipeline(transaction=False)
    pipe.exists(job_keys(job)["lease"])
    query.queue(pipe)
    pipe.time()
    replies = pipe.execute()
    client.close()
    assert len(replies) == 2 + query.replies
    state = query.parse(replies[1 : 1 + query.replies])
    assert (replies[0], state.leader, state.lease_token, state.audit) == (1, "b", 1, [])
