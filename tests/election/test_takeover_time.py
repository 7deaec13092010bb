"""``takeover_ms``: how long the job was leaderless, counted from the previous leader's last sign
of life (its grant, its latest renewal, or its release), by Redis's clock, not from when its lease
expired: after a crash the job has had no leader since (at the latest) the last renewal, and the
lease's remaining TTL is part of the outage."""

from __future__ import annotations

import redis
import trio

from actors.lease_store import Acquired, job_keys
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import OpenStore


async def test_a_takeover_after_a_crash_counts_from_the_last_renewal(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, job)
    grant = await store.acquire("a", 300)
    assert isinstance(grant, Acquired) and grant.takeover_ms is None
    await trio.sleep(0.2)
    before_renewal = redis_client.time()
    assert await store.renew("a", 1, 300)
    await trio.sleep(1.0)  # a crashed: its lease expired 300 ms after that renewal
    taken = await store.acquire("b", 300)
    now = redis_client.time()
    assert isinstance(taken, Acquired) and taken.previous_node == "a"
    assert taken.takeover_ms is not None
    since_renewal_ms = (now[0] - before_renewal[0]) * 1000 + (now[1] - before_renewal[1]) / 1000
    assert 1000 <= taken.takeover_ms <= since_renewal_ms + 1
    audit = redis_client.xrevrange(job_keys(job)["audit"], count=1)[0][1]
    assert int(audit["takeover_ms"]) == taken.takeover_ms
    leader = redis_client.hgetall(job_keys(job)["leader"])
    assert leader["node"] == "b" and int(leader["alive_at_ms"]) == int(leader["acquired_at_ms"])


async def test_a_takeover_after_a_release_counts_from_the_release(
    redis_server: LocalRedis, job: str, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, job)
    assert isinstance(await store.acquire("a", 5000), Acquired)
    await trio.sleep(0.5)  # renewed at the grant only
    assert await store.release("a", 1)
    await trio.sleep(0.1)
    taken = await store.acquire("b", 5000)
    assert isinstance(taken, Acquired) and taken.takeover_ms is not None
    assert 100 <= taken.takeover_ms < 400
