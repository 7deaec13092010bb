"""Redis Cluster: a job's slot migrated to another master while a node ingests into it.

During a migration (``CLUSTER SETSLOT MIGRATING/IMPORTING``, then ``MIGRATE``) the source master
answers ``ASK`` for a key it no longer has: the command must be sent to the target *after
``ASKING``*, on the same connection. The slot map still names the source until ``SETSLOT NODE``,
so re-reading it (as for ``MOVED``) leads back to the source: a store that does that fails every
script call for as long as the migration lasts. Real cluster, real slot migration, an in-process
node committing throughout; the stream is checked exactly once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import trio

from actors.lease_store import Acquired, Held, LeaseStore, connect, job_keys
from actors.source import SyntheticSource
from tests.support.nodes import Recorder, start_node
from tests.support.redis_cluster import RedisClusterGroup, redis_cluster

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.01)
ASK_WINDOW = 3.0  # seconds every key sits on the target while the map still names the source


@pytest.fixture(scope="module")
def cluster3() -> Iterator[RedisClusterGroup]:
    with redis_cluster(masters=3, replicas=0) as group:
        yield group


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=5)


def _migration(group: RedisClusterGroup, key: str) -> tuple[redis.Redis, redis.Redis, int, int]:
    """For moving ``key``'s slot: clients of its master (source) and of another master (target),
    the target's port, and the slot."""
    source_server = group.server_for(key)
    target_port = next(s.port for s in group.servers if s.port != source_server.port)
    source, target = _node(source_server.port), _node(target_port)
    return source, target, target_port, int(source.cluster("keyslot", key))


async def test_a_slot_migration_under_load_is_followed_with_asking(
    cluster3: RedisClusterGroup, job: str
) -> None:
    keys = job_keys(job)
    source, target, target_port, slot = _migration(cluster3, keys["lease"])
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    rec = Recorder()
    store = LeaseStore(connect(cluster3.url, timeout=0.5), job)
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, cluster3.url, job, "a", LIVE, store=store)
        await rec.wait_for("became-leader", "a", token=1)
        await rec.wait_for("committed", "a", count=5)
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while moving := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.execute_command(
                "MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *moving
            )
        # Every key is on the target now; the slot map still says the source.
        migrated_at = trio.current_time()
        before = len(rec.of("committed", "a"))
        await trio.sleep(ASK_WINDOW)
        during = [e for e in rec.of("committed", "a")[before:] if e.at >= migrated_at]
        lost = [e for e in rec.of("lost-leadership", "a") if e.at >= migrated_at]
        for server in (target, source):
            server.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        await rec.wait_for("committed", "a", count=len(rec.of("committed", "a")) + 5)
        await a.shutdown()
        await rec.wait_for("stopped", "a")
    assert len(during) >= 20, f"{len(during)} commits in {ASK_WINDOW} s of ASK; lost {lost}"
    assert not lost
    entries = target.xrange(keys["events"])
    indexes = [SyntheticSource.index_of(f["paging_token"]) for _id, f in entries]
    assert indexes == list(range(1, len(indexes) + 1))
    assert source.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    print(f"\n{len(during)} commits in {ASK_WINDOW} s with every key on the importing master")


class _MigratesOnLoad:
    """The source master's client, except that loading a script there is followed by the job's
    slot migrating to ``target`` (keys moved, the map still naming the source) on a target that
    never saw the script: the store's next try meets ASK, then NOSCRIPT on the target."""

    def __init__(self, conn: redis.Redis, migrate: Callable[[], None]) -> None:
        self.conn, self.migrate = conn, migrate

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def script_load(self, script: str) -> str:
        sha: str = self.conn.script_load(script)
        self.migrate()
        return sha


def _migrate_keys(source: redis.Redis, target: redis.Redis, target_port: int, slot: int) -> None:
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.cluster("myid"))
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.cluster("myid"))
    while moving := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *moving)


def _end_migration(source: redis.Redis, target: redis.Redis, slot: int) -> None:
    for server in (target, source):
        server.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.cluster("myid"))


async def test_noscript_then_ask_then_noscript_loads_the_script_on_the_target_and_runs_it(
    cluster3: RedisClusterGroup, job: str
) -> None:
    keys = job_keys(job)
    source, target, target_port, slot = _migration(cluster3, keys["lease"])
    store = LeaseStore(connect(cluster3.url, timeout=2.0), job)
    granted = await store.acquire("a", 60_000)
    assert isinstance(granted, Acquired)
    await store.commit("a", granted.token, None, (), anchor="1")  # every key exists now
    for server in (source, target):
        server.script_flush()
    real = store._connection_for
    wrapped = _MigratesOnLoad(
        real(keys["lease"]), lambda: _migrate_keys(source, target, target_port, slot)
    )
    store._connection_for = lambda key: wrapped  # type: ignore[assignment,method-assign,return-value]
    try:
        answer = await store.acquire("b", 60_000)  # NOSCRIPT, ASK, NOSCRIPT: nothing ran yet
        assert isinstance(answer, Held) and answer.holder == "a"
    finally:
        store._connection_for = real  # type: ignore[method-assign]
        _end_migration(source, target, slot)


async def test_an_ask_does_not_report_the_target_masters_replid(
    cluster3: RedisClusterGroup, job: str
) -> None:
    """The replid an acquire reports is the job's master's: an ASK during a slot migration runs
    the script on another shard, whose replid says nothing of a failover."""
    keys = job_keys(job)
    source, target, target_port, slot = _migration(cluster3, keys["lease"])
    store = LeaseStore(connect(cluster3.url, timeout=2.0), job)
    first = await store.acquire("a", 60_000)
    assert isinstance(first, Acquired) and first.replid is not None
    await store.commit("a", first.token, None, (), anchor="1")  # every key exists now
    _migrate_keys(source, target, target_port, slot)
    try:
        during = await store.acquire("b", 60_000)  # answered by the target after ASKING
        assert isinstance(during, Held) and during.holder == "a"
        assert during.replid in (None, first.replid)
    finally:
        _end_migration(source, target, slot)
