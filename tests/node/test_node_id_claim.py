"""One running node per node id (ingestion/node/claim.py): a second process under a live node's
``--node-id`` is refused at start-up (one line, exit 2) and leaves the first alone; a node that
crashed is succeeded at once on its host, or once its claim expires elsewhere."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest
import redis
import structlog
import trio

from ingestion.common.keyspace import instance_key
from ingestion.node.claim import Holder, NodeClaim, pid_space, process_start
from ingestion.node.preflight import StartupError
from ingestion.testing.cluster import open_cluster
from ingestion.testing.launch import node_command
from ingestion.testing.local_redis import LocalRedis
from tests.support.cli import env

TTL_MS = 1500


def foreign(instance: str = "f00d", counter: int = 1, ttl_ms: int = TTL_MS) -> str:
    """A claim's value as a node on another machine writes it."""
    return Holder(instance, counter, ttl_ms, 4242, "777", "another-boot/4026531836", "elsewhere").value()


def exited_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.slow
async def test_a_second_node_under_a_live_nodes_id_is_refused_and_the_first_runs_on(job: str) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        await c.start_simulator()
        await c.start_node("n1")
        led = await c.log.wait_for("became-leader", "n1")
        since = trio.current_time()
        with trio.fail_after(TTL_MS / 1000 * 3 + 10):
            done = await trio.run_process(
                c.node_args("n1"), capture_stdout=True, capture_stderr=True, check=False, env=env()
            )
        took = trio.current_time() - since
        err = done.stderr.decode()
        lines = err.strip().splitlines()
        assert done.returncode == 2, err
        assert len(lines) == 1 and "Traceback" not in err, err
        refused = "ingestion: configuration error: node.id n1: in use by a running node ("
        assert lines[0].startswith(refused), err
        assert "give this node another --node-id" in lines[0]
        print(f"\nduplicate refused after {took * 1000:.0f} ms (ttl {TTL_MS} ms): {lines[0]}")
        out = done.stdout.decode()
        assert "releasing-orphaned-lease" not in out and "became-leader" not in out
        # The first node kept its term and its claim, and goes on.
        await c.wait_for_progress(20)
        assert not c.log.of("lost-leadership", "n1", since=since), c.log.tail()
        assert c.state()["lease"] == f"{led.fields['token']}|n1"
        held = Holder.parse(c.client.get(instance_key("n1")))
        assert held.pid == c.children["n1"].worker_pid


@pytest.mark.slow
async def test_a_stop_signal_while_waiting_out_a_claim_ends_start_up_at_once(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """A claim from elsewhere that nobody renews is waited out (up to a TTL); SIGTERM meanwhile
    ends the node within 2 s and leaves that claim alone."""
    node = f"{job}-n"
    value = foreign(ttl_ms=20_000)
    redis_client.set(instance_key(node), value, px=20_000)
    args = node_command(node, jobs=[job], redis_url=redis_server.url, horizon="http://127.0.0.1:9",
                        ttl_ms=20_000)  # fmt: skip
    proc = await trio.lowlevel.open_process(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    assert proc.stdout is not None
    seen = b""
    with trio.fail_after(20):
        while b'"node-id-held"' not in seen:
            chunk = await proc.stdout.receive_some()
            assert chunk, seen.decode()
            seen += chunk
    sent = trio.current_time()
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        status = await proc.wait()
    took = trio.current_time() - sent
    print(f"\nSIGTERM while waiting out a claim: exit after {took * 1000:.0f} ms")
    assert status == 0
    assert took < 2.0
    assert redis_client.get(instance_key(node)) == value


async def test_a_claim_from_elsewhere_that_is_renewed_is_a_live_node(
    redis_client: redis.Redis, job: str
) -> None:
    key = instance_key(job)
    redis_client.set(key, foreign(counter=1), px=TTL_MS)

    async def renew() -> None:
        await trio.sleep(TTL_MS / 1000 / 3)
        redis_client.set(key, foreign(counter=2), px=TTL_MS)

    claim = NodeClaim(redis_client, job, TTL_MS, structlog.get_logger())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(renew)
        with pytest.raises(StartupError, match=rf"node.id {job}: in use by a running node \(instance f00d, "
                           r"pid 4242 on elsewhere, refreshed \d+ ms ago\)"):  # fmt: skip
            with trio.fail_after(TTL_MS / 1000 * 2):
                await claim.claim()
    assert Holder.parse(redis_client.get(key)).counter == 2  # left alone


async def test_a_claim_from_elsewhere_that_expires_is_taken_once_it_has(
    redis_client: redis.Redis, job: str
) -> None:
    key = instance_key(job)
    redis_client.set(key, foreign(), px=600)
    claim = NodeClaim(redis_client, job, TTL_MS, structlog.get_logger())
    started = trio.current_time()
    with structlog.testing.capture_logs() as logs, trio.fail_after(5):
        await claim.claim()
    waited = trio.current_time() - started
    assert 0.45 < waited < 2.0, waited
    held = Holder.parse(redis_client.get(key))
    assert (held.instance, held.pid) == (claim.me.instance, os.getpid())
    assert [e["reason"] for e in logs if e["event"] == "node-id-claimed"] == ["expired"]


async def test_a_claim_of_a_process_of_this_host_that_has_exited_is_taken_at_once(
    redis_client: redis.Redis, job: str
) -> None:
    """The crash case: killed, restarted at once under the same id by its service manager."""
    key = instance_key(job)
    dead = Holder("dead", 7, 60_000, exited_pid(), "12345", pid_space(), socket.gethostname())
    assert dead.here() and not dead.alive()
    redis_client.set(key, dead.value(), px=60_000)
    claim = NodeClaim(redis_client, job, TTL_MS, structlog.get_logger())
    started = trio.current_time()
    with trio.fail_after(5):
        await claim.claim()
    assert trio.current_time() - started < 0.5
    assert Holder.parse(redis_client.get(key)).instance == claim.me.instance
    # A live process of this host (this one, as another instance would see it) is not dead.
    pid = os.getpid()
    live = Holder("live", 1, TTL_MS, pid, process_start(pid), pid_space(), socket.gethostname())
    assert live.here() and live.alive()


async def test_a_claim_is_renewed_while_kept_deleted_on_the_way_out_and_lost_to_another(
    redis_client: redis.Redis, job: str
) -> None:
    key = instance_key(job)
    ttl_ms = 600
    claim = NodeClaim(redis_client, job, ttl_ms, structlog.get_logger())
    await claim.claim()
    first = Holder.parse(redis_client.get(key)).counter
    async with trio.open_nursery() as nursery:
        await nursery.start(claim.keep)
        await trio.sleep(ttl_ms / 1000 * 1.5)  # past the TTL: kept alive by the renewals
        held = Holder.parse(redis_client.get(key))
        assert held.instance == claim.me.instance and held.counter > first
        nursery.cancel_scope.cancel()
    assert redis_client.get(key) is None  # a clean exit deletes it

    other = NodeClaim(redis_client, job, ttl_ms, structlog.get_logger())
    await other.claim()
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(other.keep)
            redis_client.set(key, foreign(), px=60_000)  # taken while this one was away
            with trio.fail_after(2):
                await other.lost.wait()
    assert [e["event"] for e in logs] == ["node-id-claim-lost"]
    assert redis_client.get(key) == foreign()  # not deleted: it is another's
    redis_client.delete(key)
