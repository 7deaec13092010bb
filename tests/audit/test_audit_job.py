"""The elected audit job (``kind = "audit"``): a lake job's Redis store, made by the real path (the
lake source committed by the CursorWriter, in process), audited continuously behind its
watermark by an audit job run as a node runs it (elected, its runs committed, its writes fenced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import structlog
import trio
from prometheus_client import CollectorRegistry, generate_latest

from actors.lease_store import Acquired, connect, job_keys
from actors.observe import NodeObserver
from actors.source import TermContext
from actors.supervisor import JobRun, run_jobs
from ingestion.audit.job import AuditStep
from ingestion.audit.metrics import AuditCollector
from ingestion.common.keyspace import audit_keys
from ingestion.config import ConfigError, load
from ingestion.node.build import build_sink, build_source, build_store
from ingestion.node.worker import _job_source, audit_stats, node_spec
from ingestion.postgres.connection import connect as pg_connect
from ingestion.postgres.readers import job_state
from ingestion.rpc.protocol import Cursor
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.lakes import long_lake

FIRST, LAST = 84, 87  # the lake's ledgers (84 has no event, 85 to 87 a thousand each)


def settings_of(tmp_path: Path, job: str, redis_url: str, sink: str = "") -> Any:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[node]\nid = "n1"\nsource = "lake"\n\n[redis]\nurl = "{redis_url}"\n\n'
        f'[lake]\nurl = "file://{tmp_path / "lake"}"\ndecode_processes = 0\n\n'
        f'[jobs."{job}"]\nkind = "lake"\nstart_cursor = "{FIRST}"\n'
        + (f'sink = "{sink}"\n' if sink else "")
        + f'\n[jobs."{job}-audit"]\nkind = "audit"\naudits = "{job}"\nwindow = 2\nevery_ms = 20\n'
    )
    return load(cfg, {}, {})


def job_run(settings: Any, name: str, client: redis.Redis) -> JobRun:
    j = next(j for j in settings.jobs if j.name == name)
    store = build_store(settings, j.name, client)
    return JobRun(  # its source as a node runs it (behind its network guard and identity check)
        store, _job_source(settings, j, store), node_spec(settings, j), structlog.get_logger(),
        NodeObserver(settings.node.id, j.name), build_sink(settings, j, store),
    )  # fmt: skip


async def run_until(runs: list[JobRun], done: Any, what: str) -> None:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_jobs, runs, structlog.get_logger())
        await wait_until(done, 30, what=what)
        await handle.shutdown("test-done")


def follow_to_tip(settings: Any, job: str, client: redis.Redis) -> None:
    """The lake job follows the lake to its tip, its watermark at the lake's last ledger."""
    cursor = job_keys(job)["cursor"]
    trio.run(
        run_until, [job_run(settings, job, client)],
        lambda: client.hget(cursor, "complete_through") == str(LAST), "the job complete through the tip",
    )  # fmt: skip


def audit_to(settings: Any, job: str, client: redis.Redis) -> JobRun:
    """The audit job run until it has audited through the lake's last ledger."""
    run = job_run(settings, f"{job}-audit", client)
    audited = audit_keys(f"{job}-audit")["audited"]
    trio.run(
        run_until, [run], lambda: client.hget(audited, "audited_through") == str(LAST), "audited to the tip"
    )
    return run


def metrics(run: JobRun) -> str:
    registry = CollectorRegistry()
    registry.register(AuditCollector(audit_stats([run])))
    return generate_latest(registry).decode()


def test_a_clean_jobs_audit_advances_to_the_watermark_never_past_it_and_finds_nothing(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis
) -> None:
    long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url)
    client = connect(redis_server.url, timeout=2.0)
    keys = audit_keys(f"{job}-audit")
    seen: list[tuple[int, int]] = []  # (the audit's progress, the job's watermark) as they moved
    runs = [job_run(settings, job, client), job_run(settings, f"{job}-audit", client)]
    step = runs[1].source.action  # type: ignore[attr-defined]
    held: list[bool] = []  # whether the term's decode workers were open, once it had audited
    leading: list[str] = []

    def both_at_tip() -> bool:
        through = redis_client.hget(job_keys(job)["cursor"], "complete_through")
        audited = redis_client.hget(keys["audited"], "audited_through")
        if audited is not None:
            seen.append((int(audited), int(through or 0)))
            held.append(step.decoders is not None)
        if audited == str(LAST):  # the step sets its gauge just after its write: read until it shows
            text = metrics(runs[1])
            if f'ingestion_audit_ledger{{ingestion_job="{job}-audit"}} 87.0' in text:
                leading.append(text)  # while it leads
        return bool(leading)

    trio.run(run_until, runs, both_at_tip, "the job at the tip and audited through it")  # (side by side)
    assert all(audited <= through for audited, through in seen), seen
    assert held and all(held) and step.decoders is None  # kept for the term, closed with it
    assert redis_client.xlen(keys["findings"]) == 0
    runs_committed = redis_client.xrange(job_keys(f"{job}-audit")["events"])
    assert any('"last": 87' in fields["record"] for _, fields in runs_committed), runs_committed
    assert f'ingestion_audit_ledger{{ingestion_job="{job}-audit"}} 87.0' in leading[0], leading
    text = metrics(runs[1])  # its term over: the gauge is its leader's only, the counters stay
    assert "ingestion_audit_ledger{" not in text, text
    assert f'ingestion_audit_findings_total{{ingestion_job="{job}-audit",kind="missing"}} 0.0' in text
    client.close()


def test_a_row_deleted_behind_the_watermark_is_named_in_the_findings_and_the_metric(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis
) -> None:
    long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url)
    client = connect(redis_server.url, timeout=2.0)
    follow_to_tip(settings, job, client)
    events = job_keys(job)["events"]
    gone_entry, gone = next(
        (e, f) for e, f in redis_client.xrange(events) if Cursor.parse(f["paging_token"]).ledger == 86
    )
    redis_client.xdel(events, gone_entry)

    run = audit_to(settings, job, client)
    findings = [f for _, f in redis_client.xrange(audit_keys(f"{job}-audit")["findings"])]
    assert [(f["kind"], f["id"], f["audits"], f["first"], f["last"]) for f in findings] == [
        ("missing", gone["paging_token"], job, "85", "86")  # (from the first row's ledger, 85)
    ], findings
    assert findings[0]["event"] == "audit-finding" and int(findings[0]["token"]) >= 1
    text = metrics(run)
    assert f'ingestion_audit_findings_total{{ingestion_job="{job}-audit",kind="missing"}} 1.0' in text, text
    assert f'ingestion_audit_findings_total{{ingestion_job="{job}-audit",kind="extra"}} 0.0' in text
    client.close()


def test_a_postgres_stores_row_deleted_behind_its_watermark_is_named(
    job: str, tmp_path: Path, pg: LocalPostgres, redis_server: LocalRedis, redis_client: redis.Redis
) -> None:
    long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url, sink=pg.url)
    client = connect(redis_server.url, timeout=2.0)

    def complete() -> bool:
        try:
            return job_state(pg.url, "ingestion", job)["complete_through"] == LAST
        except psycopg.errors.UndefinedTable:  # the sink has not made its tables yet
            return False

    trio.run(run_until, [job_run(settings, job, client)], complete, "the job complete through the tip")
    assert redis_client.hget(job_keys(job)["cursor"], "complete_through") is None  # (in PostgreSQL)
    with pg_connect(pg.url, 5) as conn:
        (gone,) = conn.execute(
            "DELETE FROM ingestion.events WHERE job = %s AND paging_token = %s RETURNING paging_token",
            (job, str(Cursor(87, 1))),
        ).fetchone() or ("",)
    audit_to(settings, job, client)
    findings = [f for _, f in redis_client.xrange(audit_keys(f"{job}-audit")["findings"])]
    assert [(f["kind"], f["id"], f["first"], f["last"]) for f in findings] == [("missing", gone, "87", "87")]
    client.close()


def test_a_stale_term_records_neither_findings_nor_progress(
    job: str, tmp_path: Path, redis_server: LocalRedis, redis_client: redis.Redis
) -> None:
    long_lake(tmp_path / "lake", LAST)
    settings = settings_of(tmp_path, job, redis_server.url)
    client = connect(redis_server.url, timeout=2.0)
    follow_to_tip(settings, job, client)
    events = job_keys(job)["events"]
    entry, _ = next(
        (e, f) for e, f in redis_client.xrange(events) if Cursor.parse(f["paging_token"]).ledger == 85
    )
    redis_client.xdel(events, entry)  # the first window (85..86: from the first row) has a finding
    name = f"{job}-audit"
    audit = next(j for j in settings.jobs if j.name == name)
    store = build_store(settings, name, client)
    step = build_source(settings, audit, store).action  # type: ignore[attr-defined]
    assert isinstance(step, AuditStep)
    keys = audit_keys(name)

    async def terms() -> tuple[int, int]:
        old = await store.acquire("a", 60_000)
        assert isinstance(old, Acquired)
        await store.release("a", old.token)
        new = await store.acquire("b", 60_000)
        assert isinstance(new, Acquired)
        return old.token, new.token

    old, new = trio.run(terms)
    result = trio.run(step, 1, TermContext("a", old))
    assert result == {"audits": job, "stale": old}
    assert redis_client.xlen(keys["findings"]) == 0 and not redis_client.exists(keys["audited"])
    assert step.stats.ledger is None and sum(step.stats.findings.values()) == 0

    result = trio.run(step, 1, TermContext("b", new))  # the current term records both
    assert (result["first"], result["last"], result["counts"]["missing"]) == (85, 86, 1), result
    assert redis_client.xlen(keys["findings"]) == 1
    assert redis_client.hget(keys["audited"], "audited_through") == "86"
    client.close()


def test_an_audit_job_must_audit_an_rpc_or_lake_job_of_the_configuration(tmp_path: Path) -> None:
    def problems(table: str) -> str:
        cfg = tmp_path / "config.toml"
        cfg.write_text(
            f'[node]\nid = "n1"\nsource = "lake"\n\n[lake]\nurl = "file://{tmp_path}"\n\n'
            '[jobs.j]\nkind = "lake"\n\n[jobs.beat]\nkind = "scheduled"\n'
            'action = "ingestion.jobs:heartbeat"\nperiod_ms = 1000\n\n'
            f'[jobs.a]\nkind = "audit"\n{table}'
        )
        with pytest.raises(ConfigError) as caught:
            load(cfg, {}, {})
        return str(caught.value)

    assert "jobs.a.audits: must name an rpc or lake job of this configuration, got 'nojob'" in problems(
        'audits = "nojob"\n'
    )
    assert "got 'beat' (a scheduled job)" in problems('audits = "beat"\n')
    text = problems('audits = "j"\nwindow = 0\naction = "x:y"\n')
    assert (
        "jobs.a.window: must be at least 1, got 0" in text
        and "jobs.a.action: does not apply to an audit job" in text
    )
    cfg = tmp_path / "config.toml"
    cfg.write_text(cfg.read_text().replace('window = 0\naction = "x:y"\n', ""))
    audit = next(j for j in load(cfg, {}, {}).jobs if j.name == "a")
    assert (audit.audits, audit.audit_window, audit.period_ms, audit.sink) == ("j", 64, 10_000, "")
