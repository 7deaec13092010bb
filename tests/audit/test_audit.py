"""``ingestion audit``: a job's store against the lake read again. The stores are made by the real
path (the lake source, a backfill's bounded range jobs and the live job, committed through the
CursorWriter into PostgreSQL or Redis, in process), then damaged by hand; the audit must name
exactly the damage, and nothing on the clean store."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import structlog
import trio

from actors.lease_store import connect, job_keys
from actors.observe import NodeObserver
from actors.supervisor import JobRun, run_jobs
from ingestion.audit.compare import StoredRow, compare, differences
from ingestion.backfill.runner import range_job
from ingestion.cli import main as cli
from ingestion.common.keyspace import backfill_key
from ingestion.config import load
from ingestion.node.build import build_sink, build_source, build_store
from ingestion.node.worker import node_spec
from ingestion.postgres.connection import connect as pg_connect
from ingestion.postgres.readers import job_state
from ingestion.rpc.protocol import Cursor
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.lakes import long_lake

LIVE_FROM = LAST = 87  # the live job's first ledger, the lake's last; ranges 84..86 before it
RANGES = ((84, 85), (86, 86))  # (84 has no event, 85 to 87 a thousand each)


def settings_of(tmp_path: Path, job: str, redis_url: str, sink: str = "", extra: str = "") -> Any:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[node]\nid = "n1"\nsource = "lake"\n\n[redis]\nurl = "{redis_url}"\n\n'
        f'[lake]\nurl = "file://{tmp_path / "lake"}"\ndecode_processes = 0\n\n'
        f'[jobs."{job}"]\nkind = "lake"\nstart_cursor = "{LIVE_FROM}"\n{extra}'
        + (f'sink = "{sink}"\n' if sink else "")
    )
    return load(cfg, {}, {})


async def backfill_and_follow(settings: Any, job: Any) -> None:
    """The job follows the lake from LIVE_FROM to its tip, and its ranges RANGES (each a range
    job as a node runs it: bounded, its end recorded fenced) fill the ledgers before, all in
    this process; returns once every range is done and the job is at the tip."""
    client = connect(settings.redis.url, timeout=2.0)
    jobs = [job, *(range_job(job, a, b) for a, b in RANGES)]
    runs = []
    for j in jobs:
        store = build_store(settings, j.name, client)
        runs.append(JobRun(
            store, build_source(settings, j, store), node_spec(settings, j), structlog.get_logger(),
            NodeObserver(settings.node.id, j.name), build_sink(settings, j, store),
        ))  # fmt: skip
    tip = str(Cursor.through(LAST))

    def finished() -> bool:
        if job.sink:
            try:
                at = job_state(job.sink, "ingestion", job.name)["cursor"]
            except psycopg.errors.UndefinedTable:  # the sink has not made its tables yet
                return False
        else:
            at = client.hget(job_keys(job.name)["cursor"], "cursor")
        return at == tip and all(client.hexists(backfill_key(j.name), "done") for j in jobs[1:])

    try:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(run_jobs, runs, structlog.get_logger())
            await wait_until(finished, 60, what="the ranges done and the job at the lake's tip")
            await handle.shutdown("test-done")
    finally:
        for run in runs:
            if run.sink is not None:
                run.sink.close()  # type: ignore[attr-defined]
        client.close()


def audit(capsys: pytest.CaptureFixture[str], job: str, tmp_path: Path, *more: str) -> tuple[int, str, str]:
    code = cli(["audit", job, "--config", str(tmp_path / "config.toml"), "--from", "84", "--to", str(LAST),
                *(more if "--processes" in more else ("--processes", "0", *more))])  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def named(out: str) -> list[tuple[str, str]]:
    """The findings a report names: (kind, id)."""
    return re.findall(r"^  (missing|extra|duplicated|differing) (\d{19}-\d{10}):", out, re.M)


def altered(record: str) -> str:
    value = json.loads(record)
    value["value"] = "AAAAAw=="  # another ScVal (true)
    return json.dumps(value)


@pytest.mark.slow  # 21-118 s on the shared 2-core machine (load 8-40): a backfill, three audits
def test_the_audit_names_a_deleted_a_duplicated_and_an_altered_row_of_a_postgres_backfill(
    job: str, tmp_path: Path, pg: LocalPostgres, redis_server: LocalRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url, sink=pg.url)
    trio.run(backfill_and_follow, settings, settings.jobs[0])

    code, out, err = audit(capsys, job, tmp_path)
    assert (code, err) == (0, ""), out
    assert f"{len(ids)} records expected from the lake, {len(ids)} rows in the store (3 jobs" in out, out
    assert ": equal\n" in out

    gone, twice, changed = ids[10], ids[len(ids) // 2], ids[-3]  # a range's, another range's, the job's
    with pg_connect(pg.url, 5) as conn:
        conn.execute(
            "DELETE FROM ingestion.events WHERE paging_token = %s AND starts_with(job, %s)", (gone, job)
        )
        conn.execute(
            "INSERT INTO ingestion.events (job, seq, paging_token, token, record) "
            "SELECT job, seq + 100000, paging_token, token, record FROM ingestion.events "
            "WHERE paging_token = %s AND starts_with(job, %s)", (twice, job),
        )  # fmt: skip
        (record,) = conn.execute(
            "SELECT record::text FROM ingestion.events WHERE paging_token = %s AND job = %s", (changed, job)
        ).fetchone() or ("",)
        conn.execute(
            "UPDATE ingestion.events SET record = %s::json WHERE paging_token = %s AND job = %s",
            (altered(record), changed, job),
        )
    # on a decode worker process, in windows of 2 ledgers (the rows read once, window by window)
    code, out, err = audit(capsys, job, tmp_path, "--processes", "1", "--window", "2")
    assert code == 1, (out, err)
    assert named(out) == sorted(
        [("missing", gone), ("duplicated", twice), ("differing", changed)], key=lambda f: f[1]
    )
    assert "1 missing, 1 duplicated, 1 differing" in out
    assert re.search(
        rf"differing {changed}: {re.escape(job)} seq \d+: value is \"AAAAAw==\", expected ", out
    ), out


def test_the_audit_of_a_redis_stream_store_names_the_same_damage_and_applies_the_watch_list(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    ids = long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url)
    trio.run(backfill_and_follow, settings, settings.jobs[0])
    code, out, _ = audit(capsys, job, tmp_path, "--window", "3")
    assert code == 0 and f"{len(ids)} rows in the store (3 jobs" in out, out

    # the job's filters and watch list decide what it must hold: a watch list naming no address
    # of these events keeps none of them, so each of the job's rows is extra
    nobody = 'watch = ["GAAZI4TCR3TY5OJHCTJC2A4QSY6CJWJH5IAJTGKIN2ER7LBNVKOCCWN7"]\n'
    settings_of(tmp_path, job, redis_server.url, extra=nobody)
    code, out, _ = audit(capsys, job, tmp_path, "--from", str(LAST))
    assert code == 1 and "0 records expected from the lake" in out, out
    assert {kind for kind, _ in named(out)} == {"extra"} and len(named(out)) == 1000, out
    settings_of(tmp_path, job, redis_server.url)

    first_range = job_keys(f"{job}~84-85")["events"]
    entries = redis_client.xrange(first_range)
    (gone_entry, gone_fields) = entries[5]
    redis_client.xdel(first_range, gone_entry)
    (_, twice_fields) = entries[7]
    redis_client.xadd(job_keys(job)["events"], twice_fields)  # the same record again, in the live job
    live = job_keys(job)["events"]
    (changed_entry, changed_fields) = redis_client.xrange(live)[0]
    redis_client.xdel(live, changed_entry)
    redis_client.xadd(live, {**changed_fields, "record": altered(changed_fields["record"])})
    code, out, _ = audit(capsys, job, tmp_path, "--window", "3")
    assert code == 1
    found = {kind: id_ for kind, id_ in named(out)}
    assert found == {
        "missing": gone_fields["paging_token"], "duplicated": twice_fields["paging_token"],
        "differing": changed_fields["paging_token"],
    }  # fmt: skip


def test_usage_mistakes_exit_2_and_a_hole_in_the_lake_exits_1_naming_it(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    long_lake(tmp_path / "lake", LAST)
    settings_of(tmp_path, job, redis_server.url)
    assert audit(capsys, "nojob", tmp_path)[0] == 2
    assert audit(capsys, job, tmp_path)[0] == 2  # nothing committed for it: a wrong store, not "all missing"
    row = {"paging_token": str(Cursor(87, 1)), "token": "1", "node": "n1", "record": "{}"}
    redis_client.xadd(job_keys(job)["events"], row)  # type: ignore[arg-type]
    next((tmp_path / "lake").rglob("*--86.xdr.zst")).unlink()
    code, out, err = audit(capsys, job, tmp_path, "--from", "86", "--to", "86")
    assert (code, out) == (1, "") and "lacks ledgers 86 (no object " in err, err


def test_the_comparison_names_each_difference_once_and_ignores_a_store_s_spelling() -> None:
    expected = {"1": '{"a": 1, "b": [2]}', "2": '{"a": 2}', "3": '{"a": 3}'}
    stored = [
        StoredRow("j", "seq 1", "1", '{"b":[2],"a":1}'),  # the same value, spelt otherwise
        StoredRow("j", "seq 2", "2", '{"a": 2}'),
        StoredRow("j~1-2", "seq 1", "2", '{"a": 5}'),
        StoredRow("j", "seq 3", "4", '{"a": 4}'),
    ]
    tally = compare(expected, stored)
    assert [str(f) for f in tally.findings] == [
        "duplicated 2: 2 rows: j seq 2, j~1-2 seq 1",
        "differing 2: j~1-2 seq 1: a is 5, expected 2",
        "missing 3: in the source, not in the store",
        "extra 4: in the store (j seq 3), not in the source for this job",
    ]
    assert differences('{"a": 1}', '{"b": 1}') == "a absent (expected 1); b not expected (1)"


async def test_an_rpc_job_s_store_is_audited_against_the_rpc_in_its_window_and_against_the_lake(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The simulator serves Stellar RPC and writes the same chain into a lake: an rpc job's
    store equals both (the lake's derivation is RPC's), and a damaged row is named by both."""
    lake = tmp_path / "lake"
    config = SimulatorConfig(ledger_interval=None, history_ledgers=12, ops_per_ledger=6, rpc_port=0,
                             lake_dir=str(lake), seed=5)  # fmt: skip
    async with open_simulator(config) as sim:
        first, latest = sim.chain.first, sim.chain.latest
        (tmp_path / "config.toml").write_text(
            f'[node]\nid = "n1"\nsource = "rpc"\n\n[redis]\nurl = "{redis_server.url}"\n\n'
            f'[rpc]\nurls = ["{sim.rpc_url}"]\nlake = "{lake}"\n\n'
            f'[jobs."{job}"]\nkind = "rpc"\nstart_cursor = "{first}"\n'
        )
        settings = load(tmp_path / "config.toml", {}, {})
        client = connect(redis_server.url, timeout=2.0)
        store = build_store(settings, job, client)
        run = JobRun(store, build_source(settings, settings.jobs[0], store), node_spec(settings),
                     structlog.get_logger(), NodeObserver("n1", job))  # fmt: skip

        def at_latest() -> bool:
            cursor = client.hget(job_keys(job)["cursor"], "cursor")
            return cursor is not None and "-" in str(cursor) and Cursor.parse(str(cursor)).ledger >= latest

        async with trio.open_nursery() as nursery:
            handle = await nursery.start(run_jobs, [run], structlog.get_logger())
            await wait_until(at_latest, 30, what="the rpc job at the RPC's latest ledger")
            await handle.shutdown("test-done")
        client.close()
        span = ("--from", str(first), "--to", str(latest))

        def audit_against(*source: str) -> tuple[int, str, str]:
            return audit(capsys, job, tmp_path, *span, *source)

        code, out, err = await trio.to_thread.run_sync(audit_against, "--rpc", sim.rpc_url)
        assert code == 0 and f"expected from the RPC {sim.rpc_url}" in out and ": equal" in out, (out, err)
        stored = int(re.findall(r"(\d+) rows in the store", out)[0])
        assert stored > 0
        code, out, err = await trio.to_thread.run_sync(audit_against)  # rpc.lake
        assert code == 0 and f"{stored} records expected from the lake" in out, (out, err)

        entries = redis_client.xrange(job_keys(job)["events"])
        gone_entry, gone_fields = entries[len(entries) // 2]
        redis_client.xdel(job_keys(job)["events"], gone_entry)
        for source in (("--rpc", sim.rpc_url), ()):
            code, out, _ = await trio.to_thread.run_sync(audit_against, *source)
            assert code == 1 and named(out) == [("missing", gone_fields["paging_token"])], out
        code, out, err = await trio.to_thread.run_sync(
            audit_against, "--rpc", sim.rpc_url, "--to", str(latest + 5)
        )
        assert code == 1 and "not all in its window (audit them against the lake" in err, err
