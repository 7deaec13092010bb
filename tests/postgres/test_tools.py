"""``verify``, ``inspect`` and ``tail`` on a job whose sink is PostgreSQL: the commands as
subprocesses against a real PostgreSQL server, a real redis-server and the (real, HTTP) simulator;
the rows are committed through :class:`~ingestion.postgres.sink.PostgresSink`, as a node does."""

from __future__ import annotations

import io
import json
import sys
import threading

import httpx
import pytest
import trio

from actors.source import Record
from ingestion.cli import tail
from ingestion.postgres.connection import connect
from ingestion.postgres.sink import PostgresSink
from ingestion.simulator.server import SimulatorConfig, open_simulator
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import child_env, wait_until


async def ingestion(*args: str) -> trio.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process(
            [sys.executable, "-m", "ingestion", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=child_env(),
        )  # fmt: skip


async def horizon_records(url: str, n: int) -> list[Record]:
    async with httpx.AsyncClient(timeout=5) as http:
        page = (await http.get(f"{url}/operations", params={"limit": str(n)})).json()
    return [Record(r["paging_token"], json.dumps(r)) for r in page["_embedded"]["records"]]


async def commit_in_terms(sink: PostgresSink, records: list[Record], cut: int) -> None:
    """``records[:cut]`` under token 1, the rest under token 2 (a failover between)."""
    assert await sink.open_term("a", 1)
    await sink.commit("a", 1, None, records[:cut])
    assert await sink.open_term("b", 2)
    await sink.commit("b", 2, records[cut - 1].paging_token, records[cut:])


async def test_verify_judges_a_postgres_job_against_the_source_and_its_fence_history(
    pg: LocalPostgres, redis_server: LocalRedis
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=6, ops_per_ledger=4)
    async with open_simulator(config) as sim:
        records = await horizon_records(sim.url, 20)
        sink = PostgresSink(pg.url, "pg-verify", call_timeout=5)
        await commit_in_terms(sink, records, 8)
        sink.close()
        flags = ("verify", "--redis", redis_server.url, "--sink", pg.url, "--job", "pg-verify",
                 "--horizon", sim.url, "--start-cursor", "0")  # fmt: skip
        done = await ingestion(*flags)
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        assert "20 records" in out and "fencing tokens 1..2" in out and "2 terms" in out
        assert "OK" in out and "secret" not in out

        # A row the source does not have there (a duplicate), written behind the fence's back.
        with connect(pg.url, 5) as conn:
            conn.execute(
                "INSERT INTO ingestion.events (job, seq, paging_token, token, record) "
                "SELECT job, 21, paging_token, 1, record FROM ingestion.events "
                "WHERE job = 'pg-verify' AND seq = 20"
            )
        bad = await ingestion(*flags)
        assert bad.returncode == 1
        text = bad.stdout.decode()
        assert "FAILED" in text and "duplicate" in text
        assert "token 1 committed after the fence rose to 2" in text

        missing = await ingestion("verify", "--redis", redis_server.url, "--sink", pg.url,
                                  "--job", "never", "--horizon", sim.url)  # fmt: skip
        assert missing.returncode == 2 and b"no job 'never'" in missing.stderr


async def test_inspect_reads_a_postgres_jobs_cursor_rows_and_fence_history(
    pg: LocalPostgres, redis_server: LocalRedis
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=4, ops_per_ledger=4)
    async with open_simulator(config) as sim:
        records = await horizon_records(sim.url, 10)
    sink = PostgresSink(pg.url, "pg-inspect", call_timeout=5)
    await commit_in_terms(sink, records, 4)
    sink.close()
    done = await ingestion("inspect", "--redis", redis_server.url, "--sink", pg.url,
                           "--job", "pg-inspect", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["cursor"] == records[-1].paging_token and doc["events"] == 10
    assert doc["stream"] is None
    assert doc["sink"]["fence"] == 2 and doc["sink"]["last_seq"] == 10
    assert doc["sink"]["terms"] == [{"token": 1, "after_seq": 0}, {"token": 2, "after_seq": 4}]
    assert "secret" not in doc["sink"]["url"]
    table = await ingestion("inspect", "--redis", redis_server.url, "--sink", pg.url, "--job", "pg-inspect")
    assert table.returncode == 0, table.stderr
    text = table.stdout.decode()
    assert "rows              10, seq 1..10" in text and "2 after seq 4" in text
    down = await ingestion("inspect", "--redis", redis_server.url, "--job", "pg-inspect",
                           "--sink", pg.url_for("postgres", "wrong"))  # fmt: skip
    assert down.returncode == 1 and b"sink.url" in down.stderr and b"wrong" not in down.stderr


async def test_tail_prints_a_postgres_jobs_rows_and_wakes_on_notify_not_on_its_poll(
    pg: LocalPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=4, ops_per_ledger=4)
    async with open_simulator(config) as sim:
        records = await horizon_records(sim.url, 12)
    sink = PostgresSink(pg.url, "pg-tail", call_timeout=5)
    assert await sink.open_term("a", 1)
    await sink.commit("a", 1, None, records[:5])

    # Everything so far, as a subprocess: one JSON record per line, in seq order.
    done = await ingestion("tail", "--sink", pg.url, "--job", "pg-tail", "--from", "0", "--count", "5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert [json.loads(x)["paging_token"] for x in lines] == [r.paging_token for r in records[:5]]
    group = await ingestion("tail", "--sink", pg.url, "--job", "pg-tail", "--group", "g")
    assert group.returncode == 2 and b"--group" in group.stderr

    # Following: the read-again bound is an hour, so only the commit's NOTIFY can wake it.
    monkeypatch.setattr(tail, "BLOCK_MS", 3_600_000)
    out = io.StringIO()
    reader = tail.PostgresTail(pg.url, "ingestion", "pg-tail", out)
    ns = tail.parser().parse_args(["--from", "$", "--count", "7"])
    finished = threading.Event()

    def follow() -> None:
        reader.run(ns)
        finished.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    with connect(pg.url, 5) as conn:
        await wait_until(  # the reader found nothing new: it waits (its LISTEN came first)
            lambda: conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'ingestion-tail' "
                "AND state = 'idle' AND query LIKE 'SELECT seq,%'"
            ).fetchone(),
            10, what="tail waiting for a NOTIFY",
        )  # fmt: skip
    await sink.commit("a", 1, records[4].paging_token, records[5:9])
    await sink.commit("a", 1, records[8].paging_token, records[9:12])
    with trio.fail_after(20):
        await trio.to_thread.run_sync(finished.wait)
    got = [json.loads(x)["paging_token"] for x in out.getvalue().splitlines()]
    assert got == [r.paging_token for r in records[5:12]]
    sink.close()
