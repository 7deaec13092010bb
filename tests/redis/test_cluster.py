"""Redis Cluster: URLs, the lease store on a real 3-master cluster, and many jobs on three node
processes through a master failover inside the cluster.

Every job's keys share the ``{J}`` hash tag, so each job lives on one master and every script
touches one slot; the node registry is a key of its own. A master failover is handled like the
Sentinel case: calls to the failed master are of unknown outcome, the node re-reads the slot map,
and the next term resumes from the cursor the promoted replica has.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import trio

from actors.lease_store import (
    Acquired,
    BadRedisUrl,
    ClusterTarget,
    Committed,
    LeaseStore,
    connect,
    job_keys,
    parse_cluster_url,
    stream_waits,
)
from actors.source import Record
from ingestion.testing.cluster import Cluster, figure, open_cluster
from tests.support.many_jobs import NODES, holders, job_flags, job_names, verify_all
from tests.support.redis_cluster import RedisClusterGroup, redis_cluster


def test_cluster_urls_parse_and_bad_ones_say_why() -> None:
    assert parse_cluster_url("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2") == ClusterTarget(
        (("10.0.0.1", 7000), ("10.0.0.2", 6379)), "u", "p@ss", False
    )
    assert parse_cluster_url("rediss+cluster://h:7000/").tls
    for url, says in (
        ("redis+cluster://", "names no node"),
        ("redis+cluster://h:x", "is not HOST:PORT"),
        ("redis+cluster://h:7000/3", "only database 0"),
    ):
        with pytest.raises(BadRedisUrl, match=says):
            parse_cluster_url(url)


@pytest.fixture(scope="module")
def cluster3() -> Iterator[RedisClusterGroup]:
    with redis_cluster(masters=3, replicas=1) as group:
        yield group


async def test_every_store_operation_works_on_a_cluster_and_jobs_spread_over_masters(
    cluster3: RedisClusterGroup, job: str
) -> None:
    client = connect(cluster3.url, timeout=5.0)
    masters = set()
    for i in range(6):
        name = f"{job}-{i}"
        store = LeaseStore(client, name, min_replicas_acked=1)
        grant = await store.acquire("n1", 5000)
        assert isinstance(grant, Acquired) and grant.token == 1
        result = await store.commit("n1", 1, None, [Record(str(1 << 32), "{}"), Record(str(2 << 32), "{}")])
        assert result == Committed(1, str(2 << 32), 2)
        assert await store.renew("n1", 1, 5000)
        state = await store.state()
        assert (state.leader, state.cursor, state.events) == ("n1", str(2 << 32), 2)
        notices = store.release_notices()
        async with trio.open_nursery() as nursery:

            async def release(store: LeaseStore) -> None:
                await trio.sleep(0.2)
                assert await store.release("n1", 1)

            nursery.start_soon(release, store)
            with trio.fail_after(5):
                assert await notices.wait(3) == "n1"
        notices.close()
        masters.add(cluster3.server_for(job_keys(name)["lease"]).port)
    assert len(masters) >= 2  # the jobs landed on several masters
    # the deployment's one id, whichever job's store asks (with a replica waited for)
    ids = {await LeaseStore(client, f"{job}-{i}", min_replicas_acked=1).deployment_id() for i in range(6)}
    assert len(ids) == 1 and next(iter(ids)).startswith("id:")
    client.close()


async def test_waits_for_stream_entries_are_read_per_slot_on_a_cluster(
    cluster3: RedisClusterGroup, job: str
) -> None:
    """The node's shared waits name one slot's streams per ``XREAD`` (a cluster refuses more): a
    commit to any of six jobs' streams, spread over the masters, wakes its waiter and no other."""
    client = connect(cluster3.url, timeout=1.0)
    stores = [LeaseStore(client, f"{job}-w{i}") for i in range(6)]
    waits = stream_waits(client, 1.0)
    woken: list[int] = []

    async def wait(i: int) -> None:
        if await waits.wait(stores[i].keys["events"], "0-0", 5.0):
            woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(wait, i)
        await trio.sleep(0.5)
        grant = await stores[4].acquire("n1", 5000)
        assert isinstance(grant, Acquired)
        await stores[4].commit("n1", grant.token, None, [Record(str(1 << 32), "{}")])
        with trio.fail_after(2):
            while not woken:  # noqa: ASYNC110 (the waiter's task says when it woke)
                await trio.sleep(0.01)
        assert woken == [4]
        nursery.cancel_scope.cancel()
    client.close()


async def test_inspect_lists_the_jobs_of_every_master(cluster3: RedisClusterGroup, job: str) -> None:
    client = connect(cluster3.url, timeout=5.0)
    names = [f"{job}-x{i}" for i in range(5)]
    for name in names:
        grant = await LeaseStore(client, name).acquire("n1", 60_000)
        assert isinstance(grant, Acquired)
    client.close()
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "ingestion", "inspect", "--redis", cluster3.url, "--json"],
            capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = {d["job"]: d["leader"] for d in json.loads(done.stdout)}
    assert all(listed.get(name) == "n1" for name in names)


@pytest.mark.slow
async def test_six_jobs_on_three_nodes_over_a_cluster_through_a_master_failover(job: str) -> None:
    with redis_cluster(masters=3, replicas=2, node_timeout_ms=1000) as group:
        async with open_cluster(job, ttl_ms=1500, redis_url=group.url) as c:
            c.node_env = {"INGESTION_REDIS_MIN_REPLICAS_ACKED": "1"}
            for name in NODES:
                await c.start_node(name, extra=job_flags(c.job), env=c.node_env)
            with trio.fail_after(20):
                while True:
                    now = holders(c)
                    if None not in now.values() and max(Counter(now.values()).values()) <= 2:
                        break
                    await trio.sleep(0.1)
            await c.wait_for_events(300)
            victim_job = job_names(c.job)[0]
            on_victim = [n for n in job_names(c.job) if _same_slot_master(group, n, victim_job)]
            killed_at = trio.current_time()
            group.kill_master_of(job_keys(victim_job)["lease"])
            # Ingestion of the failed master's jobs resumes once its replica is promoted.
            before = {n: await _events(c, n) for n in job_names(c.job)}
            with trio.fail_after(30):
                for n in job_names(c.job):
                    while await _events(c, n) < before[n] + 20:  # noqa: ASYNC110  (polling Redis)
                        await trio.sleep(0.2)
            figure("cluster-master-failover", resumed_ms=(trio.current_time() - killed_at) * 1000,
                   jobs_on_failed_master=len(on_victim))  # fmt: skip
            await verify_all(c)


async def _events(c: Cluster, name: str) -> int:
    """Entries ever added to a job's stream, asked until the cluster answers (through a failover)."""
    while True:
        try:
            info = c.client.xinfo_stream(job_keys(name)["events"])
            return int(info["entries-added"])
        except redis.RedisError:
            await trio.sleep(0.2)
            try:
                c.client.nodes_manager.initialize()  # type: ignore[attr-defined]
            except redis.RedisError:
                pass


def _same_slot_master(group: RedisClusterGroup, a: str, b: str) -> bool:
    try:
        return group.server_for(job_keys(a)["lease"]).port == group.server_for(job_keys(b)["lease"]).port
    except LookupError:
        return False


@pytest.mark.slow
async def test_a_node_started_while_every_cluster_node_is_down_waits_then_leads(job: str) -> None:
    """redis-py reads the slot map when a cluster client is built: with every node down that used
    to be a traceback at start. It is an outage like any other: ``redis-unavailable`` with
    backoff, SIGTERM stops the wait (exit 0), and once the cluster is back the node leads."""
    with redis_cluster(masters=3, replicas=0, node_timeout_ms=1000) as group:
        async with open_cluster(job, ttl_ms=1500, redis_url=group.url) as c:
            for server in group.servers:
                server.kill()
            waiting = await c.start_node("n1", wait=False)
            await c.log.wait_for("redis-unavailable", "n1", count=2, within=20)
            await c.start_node("n2", wait=False)
            await c.log.wait_for("redis-unavailable", "n2", within=20)
            waiting.process.send_signal(signal.SIGTERM)
            exited = await c.log.wait_for("process-exited", "n1", within=10)
            assert exited.fields["returncode"] == 0
            assert c.log.of("node-stopped", "n1")
            assert not c.log.of("worker-died")
            for server in group.servers:
                await trio.to_thread.run_sync(server.start)
            await trio.to_thread.run_sync(group.wait_ok)
            await c.log.wait_for("became-leader", "n2", within=30)
            await c.wait_for_events(50)
            assert not [line for _name, line in c.log.raw if "Traceback" in line], c.log.raw
            result = await c.verify()
            assert result.ok, result.summary()


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--job", "x"], ["tail"], ["verify"]])
def test_the_tools_say_in_one_line_that_no_cluster_node_answers(command: list[str]) -> None:
    from ingestion.testing.local_redis import free_port
    from ingestion.testing.wait import child_env

    url = f"redis+cluster://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", *command, "--redis", url],
        capture_output=True, text=True, timeout=60, env=child_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused" in lines[0] and url in lines[0], done.stderr
