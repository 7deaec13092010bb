"""``redis-state-lost`` only when a commit is known to have existed; token memory per deployment.

A Redis that forgot a job's counter and cursor lost something only if the job had committed: a
counter lost before the first commit is nothing an operator must decide about, and the nodes go on
(with a token floored above every one they have seen). Real redis-servers, in-process nodes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import redis
import trio

from actors.lease_store import Acquired, Held, StateLost, connect, job_keys
from actors.lease_store.store import deployment_name, deployment_of_url
from actors.source import Batch, Record, SyntheticSource
from actors.token_memory import TokenMemory
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import OpenStore, Recorder, start_node

SLOW = SyntheticSource(total=None, batch_size=5, interval=0.05)


class QuietSource:
    """A source with nothing to ingest yet: a leader of it never commits."""

    async def resolve_start(self, cursor: str) -> str:
        return cursor

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        await trio.sleep_forever()
        yield Batch((Record("1", "{}"),))  # pragma: no cover


async def test_a_counter_lost_before_the_first_commit_does_not_stop_the_job(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    rec = Recorder()
    keys = job_keys(job)
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", QuietSource())
        await rec.wait_for("became-leader", "a", token=1)
        b = await start_node(nursery, rec, redis_server.url, job, "b", QuietSource())
        await rec.wait_for("standby", "b", token=1)
        # Redis forgets the job (restarted empty, a replica promoted before it saw anything):
        # nothing had been committed, so there is nothing to lose.
        redis_client.delete(*keys.values())
        taken = await rec.wait_for("became-leader", token=2, within=5)
        assert taken.fields["cursor"] == "0"
        assert not rec.of("redis-state-lost")
        await a.shutdown()
        await b.shutdown()


async def test_acquire_says_state_lost_only_to_a_caller_that_saw_a_commit(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, job, timeout=0.25)
    grant = await store.acquire("a", 60_000)
    assert isinstance(grant, Acquired) and grant.token == 1
    held = await store.acquire("b", 60_000, known_token=1)
    assert isinstance(held, Held) and not held.committed
    assert await store.commit("a", 1, None, [Record("10", "{}")])
    held = await store.acquire("b", 60_000, known_token=1)
    assert isinstance(held, Held) and held.committed  # a standby learns that a commit exists
    redis_client.delete(*job_keys(job).values())
    lost = await store.acquire("b", 60_000, known_token=1, known_committed=True)
    assert lost == StateLost(counter=0, cursor=None)
    # A caller that never saw a commit: nothing provably lost; floored above its known token.
    fresh = await store.acquire("c", 60_000, known_token=1)
    assert isinstance(fresh, Acquired) and fresh.token == 2 and fresh.cursor is None


async def test_the_token_memory_of_one_redis_deployment_is_not_read_for_another(
    redis_server: LocalRedis, private_redis: LocalRedis, job: str, tmp_path: Path
) -> None:
    """Two deployments, one job name, one state directory on one host: a node of the second
    deployment must not take the first one's commit for its own (and refuse to lead a job that
    never existed on its Redis). The token floor is shared (the same Redis may be spelled two
    ways): its first token is above the first deployment's, which is harmless."""
    state = str(tmp_path / "state")
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        for _term in range(3):
            first = await start_node(nursery, rec, redis_server.url, job, "a", SLOW, state_dir=state)
            await rec.wait_for("committed", "a", count=len(rec.of("committed", "a")) + 2)
            await first.shutdown()
            await rec.wait_for("stopped", "a", count=_term + 1)
        assert rec.of("became-leader", "a")[-1].fields["token"] == 3
        other = await start_node(nursery, rec, private_redis.url, job, "b", SLOW, state_dir=state)
        taken = await rec.wait_for("became-leader", "b", within=5)
        assert taken.fields["token"] == 4 and taken.fields["cursor"] == "0"
        assert not rec.of("redis-state-lost")
        await other.shutdown()


def test_token_memory_names_its_deployment_and_remembers_a_commit(tmp_path: Path) -> None:
    one = TokenMemory("j", tmp_path, deployment="redis://127.0.0.1:6379/0")
    two = TokenMemory("j", tmp_path, deployment="redis://127.0.0.1:6380/0")
    assert one.raise_to(7) and one.saw_commit()
    assert not one.saw_commit()  # once is enough
    assert two.value == 0 and not two.committed
    again = TokenMemory("j", tmp_path, deployment="redis://127.0.0.1:6379/0")
    assert again.value == 7 and again.committed
    assert one.path is not None and two.path is not None and one.path != two.path
    assert "redis://127.0.0.1:6379/0" in one.path.read_text()


def test_preflight_reads_the_token_memory_of_the_configured_redis_and_refuses_a_corrupt_one(
    tmp_path: Path,
) -> None:
    """The node's own file (named by the deployment of ``redis.url``) is the one checked before
    the node starts: a corrupt one is a one-line configuration error, not a traceback later."""
    from ingestion.config import ConfigError, Settings
    from ingestion.node.preflight import preflight

    url = "redis://127.0.0.1:1/0"  # nothing listens: preflight must fail before any network
    settings = Settings.from_mapping({
        "redis": {"url": url}, "node": {"job": "j", "state_dir": str(tmp_path)},
    })  # fmt: skip
    memory = TokenMemory("j", tmp_path, deployment=deployment_of_url(url))
    assert memory.path is not None
    memory.path.write_text("not json\n")
    with pytest.raises(ConfigError, match=r"^node.state_dir: \S+ does not hold a fencing token"):
        preflight(settings)


def test_the_deployment_of_a_url_is_the_deployment_of_its_client() -> None:
    for url in (
        "redis://127.0.0.1:6379/0", "redis://u:secret@10.0.0.1:7000/3", "unix:///tmp/redis.sock?db=2",
        "redis+sentinel://s1:26379,s2:26380/mymaster/1",
    ):  # fmt: skip
        client = connect(url, timeout=0.1)
        try:
            assert deployment_of_url(url) == deployment_name(client)
        finally:
            client.close()
    assert deployment_of_url("redis+cluster://b:7001,a:7000") == "cluster:a:7000,b:7001"


async def test_a_standby_that_only_looks_at_the_lease_learns_its_token_and_the_commit(
    redis_server: LocalRedis, open_store: OpenStore, job: str
) -> None:
    """A node the balancer holds off never campaigns: its periodic look at the lease must still
    teach it the holder's token and that the job committed, so that a Redis that later loses the
    job stops it there too (redis-state-lost) instead of a restart from the start cursor."""
    import structlog

    from actors.elector import Elector
    from actors.observe import NodeObserver
    from tests.support.nodes import FAST_TIMING

    store = open_store(redis_server.url, job)
    granted = await store.acquire("a", 60_000)
    assert isinstance(granted, Acquired)
    await store.commit("a", granted.token, None, (), anchor="1")
    assert (await store.leader()).committed
    _inbox_send, inbox = trio.open_memory_channel[Any](1)
    heartbeat, _h = trio.open_memory_channel[Any](1)
    ingestor, _i = trio.open_memory_channel[Any](1)
    elector = Elector(
        store, "b", 1500, FAST_TIMING, 0.01, "0", inbox, heartbeat, ingestor,
        structlog.get_logger(), NodeObserver("b", job),
    )  # fmt: skip
    await elector._look_at_lease()
    assert (elector.known_token, elector.known_committed) == (granted.token, True)
