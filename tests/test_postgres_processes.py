"""Three real node processes on a PostgreSQL sink through one fault after another (a partition
between the leader and PostgreSQL only, SIGSTOP past the TTL, SIGKILL, a PostgreSQL restart,
SIGTERM), then the table verified: exactly once, in order, tokens never decreasing along ``seq``
and never below the fence history. Plus the start-up refusals: one line naming the setting, exit 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from ingestion.postgres.local import LocalPostgres
from ingestion.postgres.sink import check_job, job_state
from tests.cluster import open_cluster
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow
JOB = "pg-ops"


@pytest.fixture
def pg() -> Iterator[LocalPostgres]:
    server = LocalPostgres().start()
    try:
        yield server
    finally:
        server.cleanup()


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
        proxy = await nursery.start(TcpProxy(pg.port).serve)
        via_proxy = pg.url.replace(f":{pg.port}/", f":{proxy.port}/")
        await c.start_node("a", extra=["--sink", via_proxy])
        await c.log.wait_for("became-leader", "a", within=20)
        await c.start_node("b", extra=["--sink", pg.url])
        await c.start_node("c", extra=["--sink", pg.url])
        await grows(pg)

        # 1. The leader loses PostgreSQL only: its commit is unknown, its term ends, another leads.
        proxy.set_mode("blackhole")
        await c.log.wait_for("term-ended", "a", within=10)
        proxy.set_mode("forward")
        await grows(pg)

        # 2. SIGSTOP the leader past the TTL: another leads; the paused one's late commit lands
        # nowhere (the fence rose with the new term's first transaction).
        leader = c.leaders()[-1].node
        c.signal(leader, signal.SIGSTOP)
        with trio.fail_after(10):
            while c.leaders()[-1].node == leader:
                await c.log.changed()
        await grows(pg)
        c.signal(leader, signal.SIGCONT)
        await trio.sleep(1.0)
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
        nursery.cancel_scope.cancel()

    problems, checked = check_job(pg.url, "ingestion", JOB)
    assert problems == [] and checked > 150
    state = job_state(pg.url, "ingestion", JOB)
    assert len(state["terms"]) >= 5  # one fence raise per term, never down


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
