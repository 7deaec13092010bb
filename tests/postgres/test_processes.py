"""Three real node processes on a PostgreSQL sink through one fault after another (a partition
between the leader and PostgreSQL only, SIGSTOP past the TTL with a commit in flight, SIGKILL, a
PostgreSQL restart, SIGTERM), then the table verified against the simulator's own records: every
record exactly once, in order, as Horizon serves it, tokens never decreasing along ``seq`` and
never below the fence history. Plus the start-up refusals: one line naming the setting, exit 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import trio

from ingestion.postgres.readers import job_state
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until
from ingestion.verify import check_stream, fetch_source, read_postgres_evidence

pytestmark = pytest.mark.slow
JOB = "pg-ops"



def rows(pg: LocalPostgres) -> int:
    return int(job_state(pg.url, "ingestion", JOB)["events"])


async def grows(pg: LocalPostgres, more: int = 30, within: float = 20.0) -> int:
    start = await trio.to_thread.run_sync(rows, pg)
    with trio.fail_after(within):
        while True:
            now = await trio.to_thread.run_sync(rows, pg)
            if now >= start + more:
                return now
            await trio.sleep(0.1)  # polling another process's table


async def test_three_nodes_on_postgres_survive_every_fault_exactly_once(pg: LocalPostgres) -> None:
    async with open_cluster(JOB, ttl_ms=1500) as c, trio.open_nursery() as nursery:
        # Each node reaches PostgreSQL through a proxy of its own: a fault for one node only.
        proxies: dict[str, TcpProxy] = {}
        for name in ("a", "b", "c"):
            proxies[name] = await nursery.start(TcpProxy(pg.port).serve)
            via = pg.url.replace(f":{pg.port}/", f":{proxies[name].port}/")
            await c.start_node(name, extra=["--sink", via])
            if name == "a":
                await c.log.wait_for("became-leader", "a", within=20)
        await grows(pg)

        # 1. The leader loses PostgreSQL only: its commit is unknown, its term ends, another leads
        # (the cut-off node holds off its campaigns while it cannot reach PostgreSQL).
        proxies["a"].set_mode("blackhole")
        await c.log.wait_for("term-ended", "a", within=10)
        proxies["a"].set_mode("forward")
        await grows(pg)

        # 2. SIGSTOP the leader past the TTL while one of its commits is on its way (held at its
        # proxy from its first bytes: sent, not yet arrived; a commit's records carry
        # "paging_token", no other statement does). Another node leads and raises the fence; then
        # the paused leader's commit arrives, after the fence rose, and PostgreSQL refuses it:
        # certain, not a matter of when the pause fell (nor of whether the leader's call timed out
        # and ended its term first).
        leader = c.leaders()[-1].node
        proxy = proxies[leader]
        proxy.watch(b"stale-token")
        held_before = proxy.held  # a node cut off in step 1 may lead again: count from here
        proxy.blackhole_at(b"paging_token")
        await wait_until(lambda: proxy.held > held_before, 10, what=f"a commit of {leader} held at its proxy")
        c.signal(leader, signal.SIGSTOP)
        with trio.fail_after(10):
            while c.leaders()[-1].node == leader:
                await c.log.changed()
        await grows(pg)  # the new term's rows: its first transaction raised the fence
        proxy.set_mode("forward")
        try:
            await wait_until(lambda: proxy.seen[b"stale-token"], 10,
                             what=f"PostgreSQL refusing {leader}'s late commit (stale-token)")  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nheld: {proxy.held_chunks}\n{c.log.tail(80)}") from None
        c.signal(leader, signal.SIGCONT)
        await grows(pg)

        # 3. SIGKILL the leader.
        await c.kill(c.leaders()[-1].node)
        await grows(pg)

        # 4. PostgreSQL restarts under load.
        await trio.to_thread.run_sync(pg.stop)
        await trio.sleep(0.5)
        await trio.to_thread.run_sync(pg.start)
        await grows(pg)

        # 5. SIGTERM the leader: a graceful hand-over.
        assert await c.terminate(c.leaders()[-1].node) == 0
        await grows(pg)

        # The rows against the simulator's own records, and the fence history.
        entries, trimmed, fence_problems, terms = await read_postgres_evidence(pg.url, "ingestion", JOB)
        source = await fetch_source(c.horizon, "/operations", "0", through=entries[-1].paging_token)
        result = check_stream(entries, source, None, trimmed)
        assert result.ok, result.summary()
        assert fence_problems == [] and result.count > 150 and trimmed == 0
        assert terms >= 5  # one fence raise per term, never down
        nursery.cancel_scope.cancel()


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingestion", "--node-id", "x", "--redis", "redis://127.0.0.1:1/0",
         "--horizon", "http://127.0.0.1:1", "--log-format", "json", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_sink_refusals_name_the_setting_and_exit_2(pg: LocalPostgres) -> None:
    wrong = start("--sink", pg.url_for("postgres", "nope"))
    assert wrong.returncode == 2, wrong.stderr
    assert "sink.url" in wrong.stderr and "nope" not in wrong.stderr
    pg.psql("CREATE ROLE weak LOGIN PASSWORD 'weak'; REVOKE CREATE ON DATABASE postgres FROM PUBLIC")
    weak = start("--sink", pg.url_for("weak", "weak"))
    assert weak.returncode == 2 and "sink.url" in weak.stderr and "permission denied" in weak.stderr
    pg.psql("CREATE SCHEMA other; CREATE TABLE other.cursors (job int)")
    odd = start("--sink", pg.url, env={"INGESTION_SINK_SCHEMA": "other"})
    assert odd.returncode == 2 and "sink.schema: table other.cursors" in odd.stderr
