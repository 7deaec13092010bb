"""Retention of the events stream (``events.max_len``) against a real redis-server.

The trim runs inside the fenced commit script. It keeps about ``max_len`` entries and never removes
an entry that a consumer group on the stream has not acknowledged or not yet been delivered.
"""

from __future__ import annotations

import random

import pytest
import redis

from actors.lease_store import Committed, LeaseStore, connect
from actors.source import Record
from ingestion.testing.local_redis import LocalRedis

MAX_LEN = 500
NODE_SIZE = 100  # Redis's stream-node-max-entries default: the granularity of an approximate trim


def records(start: int, count: int) -> list[Record]:
    return [
        Record(str(i << 32), f'{{"paging_token":"{i << 32}","n":{i}}}')
        for i in range(start, start + count)
    ]


class Job:
    """One leader committing consecutive records through the real commit script."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.cursor: str | None = None
        self.next = 1
        self.trimmed = 0

    async def lead(self) -> None:
        await self.store.acquire("a", 60_000)

    async def commit(self, count: int) -> None:
        result = await self.store.commit("a", 1, self.cursor, records(self.next, count))
        assert isinstance(result, Committed), result
        self.cursor, self.next = result.cursor, self.next + count
        self.trimmed += result.trimmed


@pytest.fixture
def store(redis_server: LocalRedis, job: str) -> LeaseStore:
    return LeaseStore(connect(redis_server.url, timeout=2.0), job, events_max_len=MAX_LEN)


def numbers(client: redis.Redis, key: str) -> list[int]:
    return [int(f["paging_token"]) >> 32 for _id, f in client.xrange(key)]


def read_all(client: redis.Redis, key: str, group: str, *, ack: bool, count: int | None = None) -> list[str]:
    """Deliver to ``group`` (all, or ``count`` entries) and acknowledge them when ``ack``."""
    got: list[str] = []
    while count is None or len(got) < count:
        want = 1000 if count is None else min(1000, count - len(got))
        reply = client.xreadgroup(group, "c", {key: ">"}, count=want)
        if not reply:
            break
        ids = [entry_id for entry_id, _ in reply[0][1]]
        got += ids
        if ack:
            client.xack(key, group, *ids)
    return got


async def test_without_consumer_groups_the_stream_keeps_about_max_len(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    job = Job(store)
    await job.lead()
    for _ in range(30):
        await job.commit(100)
    kept = numbers(redis_client, store.keys["events"])
    assert MAX_LEN <= len(kept) <= MAX_LEN + NODE_SIZE + 100
    assert kept == list(range(3001 - len(kept), 3001))  # the newest ones, in order, no gap
    assert job.trimmed == 3000 - len(kept)
    info = await store.events_info()
    assert (info.length, info.entries_added, info.trimmed) == (len(kept), 3000, 3000 - len(kept))
    assert await store.committed_cursor() == str(3000 << 32)  # the cursor hash is never trimmed


async def test_an_unread_group_holds_everything_until_it_acknowledges(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    key = store.keys["events"]
    job = Job(store)
    await job.lead()
    await job.commit(10)
    redis_client.xgroup_create(key, "reader", id="0")
    for _ in range(20):
        await job.commit(100)
    assert redis_client.xlen(key) == 2010 and job.trimmed == 0

    read_all(redis_client, key, "reader", ack=True)
    for _ in range(5):
        await job.commit(100)
        read_all(redis_client, key, "reader", ack=True)
    kept = numbers(redis_client, key)
    assert MAX_LEN <= len(kept) <= MAX_LEN + NODE_SIZE + 100
    assert kept == list(range(2511 - len(kept), 2511))


async def test_delivered_but_unacknowledged_entries_are_kept(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    key = store.keys["events"]
    job = Job(store)
    await job.lead()
    await job.commit(1)
    redis_client.xgroup_create(key, "slow", id="0")
    for _ in range(10):
        await job.commit(100)
    delivered = read_all(redis_client, key, "slow", ack=False)  # all 1001 delivered, none acked
    redis_client.xack(key, "slow", *delivered[:200])  # the first 200 done
    for _ in range(10):
        await job.commit(100)
    kept = numbers(redis_client, key)
    # Everything from the oldest pending entry (number 201) on is still there.
    assert kept[0] <= 201 and kept[-1] == 2001
    assert kept == list(range(kept[0], 2002))
    assert redis_client.xpending(key, "slow")["pending"] == 801


async def test_a_lagging_second_group_holds_trimming_back(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    key = store.keys["events"]
    job = Job(store)
    await job.lead()
    await job.commit(1)
    redis_client.xgroup_create(key, "fast", id="0")
    redis_client.xgroup_create(key, "lagging", id="0")
    for _ in range(15):
        await job.commit(100)
        read_all(redis_client, key, "fast", ack=True)
    read_all(redis_client, key, "lagging", ack=True, count=300)  # entries 1..300 done
    for _ in range(5):
        await job.commit(100)
        read_all(redis_client, key, "fast", ack=True)
    kept = numbers(redis_client, key)
    assert kept[0] <= 301, "an entry the lagging group has not read was trimmed"
    assert kept[0] > 300 - NODE_SIZE - 1, "trimming stopped at more than a stream node below the floor"
    assert kept == list(range(kept[0], 2002))
    info = await store.events_info()
    lagging = next(g for g in info.groups if g.name == "lagging")
    assert lagging.unacknowledged == 2001 - 300


async def test_a_rejected_commit_trims_nothing(store: LeaseStore, redis_client: redis.Redis) -> None:
    key = store.keys["events"]
    job = Job(store)
    await job.lead()
    for _ in range(10):
        await job.commit(100)
    before = redis_client.xlen(key)
    assert before > MAX_LEN
    small = LeaseStore(store.client, store.job, events_max_len=10)
    stale = await small.commit("a", 0, job.cursor, records(job.next, 100))  # token 0: stale
    assert not isinstance(stale, Committed)
    assert redis_client.xlen(key) == before


async def test_max_len_zero_keeps_everything(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis
) -> None:
    unbounded = Job(LeaseStore(connect(redis_server.url, timeout=2.0), job))
    await unbounded.lead()
    for _ in range(20):
        await unbounded.commit(100)
    assert redis_client.xlen(unbounded.store.keys["events"]) == 2000


@pytest.mark.parametrize("seed", range(4))
async def test_random_readers_never_lose_an_entry_they_still_need(
    store: LeaseStore, redis_client: redis.Redis, seed: int
) -> None:
    """Random commits, groups joining, reading, acknowledging late or never: after each step every
    entry any group still needs is in the stream, the stream is a gap-free suffix, and it is no
    longer than the most any group needs, or max_len, plus the approximate trim's slack."""
    rng = random.Random(seed)
    key = store.keys["events"]
    job = Job(store)
    await job.lead()
    await job.commit(1)
    groups: dict[str, list[str]] = {}  # group -> delivered, unacknowledged ids
    seen: dict[str, set[str]] = {}  # group -> every entry id seen in the stream since it was created
    before: set[str] = set()
    for step in range(120):
        for ids in seen.values():
            ids |= before
        action = rng.random()
        committed = action < 0.45
        if committed:
            await job.commit(rng.randint(1, 120))
        elif action < 0.5 and len(groups) < 3:
            name = f"g{step}"
            redis_client.xgroup_create(key, name, id=rng.choice(["0", "$"]))
            groups[name] = []
            seen[name] = {entry_id for entry_id, _ in redis_client.xrange(key)}
        elif groups:
            name = rng.choice(sorted(groups))
            groups[name] += read_all(redis_client, key, name, ack=False, count=rng.randint(1, 400))
            if rng.random() < 0.7 and groups[name]:
                done = rng.randint(0, len(groups[name]))
                ack = groups[name][:done] if rng.random() < 0.8 else rng.sample(groups[name], done)
                if ack:
                    redis_client.xack(key, name, *ack)
                groups[name] = [i for i in groups[name] if i not in set(ack)]
        entries = redis_client.xrange(key)
        now = before = {entry_id for entry_id, _ in entries}
        kept = [int(f["paging_token"]) >> 32 for _id, f in entries]
        assert kept == list(range(kept[0], job.next)), f"step {step}: gap or reorder"
        for g in redis_client.xinfo_groups(key):
            last = _id_parts(g["last-delivered-id"])
            undelivered = {i for i in seen[g["name"]] if _id_parts(i) > last}
            pending = set(groups[g["name"]])
            missing = (undelivered | pending) - now
            assert not missing, f"step {step}: {g['name']} still needs trimmed entries {sorted(missing)[:3]}"
        if not committed:
            continue  # trimming happens in commits: an acknowledgement alone shrinks nothing
        needed = _most_needed(redis_client, key)
        assert len(kept) <= max(MAX_LEN, needed) + NODE_SIZE + 120, f"step {step}: not trimmed"


def _id_parts(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _most_needed(client: redis.Redis, key: str) -> int:
    """Entries from the oldest one any group still needs to the end (counted by reading)."""
    most = 0
    for g in client.xinfo_groups(key):
        pending = client.xpending(key, g["name"])
        start = pending["min"] if pending["pending"] else "(" + g["last-delivered-id"]
        most = max(most, len(client.xrange(key, min=start)))
    return most
