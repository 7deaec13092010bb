"""What a job follows and where it commits, recorded in its cursor hash by its first term
(``ingestion/node/identity.py``), and the refusal of a node configured otherwise: at start-up
(exit 2, one line) and at each term (the job stops on that node, before anything is written).
Real Redis, real PostgreSQL, real node processes for the start-up refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import structlog
import trio

from actors.ingestor import Ingestor
from actors.lease_store import Acquired, LeaseStore, job_keys
from actors.messages import (
    CommitCursor,
    CursorCommitted,
    ElectorInput,
    IngestorInput,
    LeaseGranted,
    LeaseRevoked,
    TermEnded,
)
from actors.source import SyntheticSource
from ingestion.config.sections import JobSettings
from ingestion.node.identity import (
    IdentifiedSource,
    identity_conflict,
    sink_conflict,
    sink_identity,
    source_identity,
)
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from tests.support.cli import one_line, run
from tests.support.ports import closed_port

EVENT_ID = "0000000214748364800-0000000001"  # an RPC event id (a lake job's cursors are too)


def rpc_job(name: str, **fields: object) -> JobSettings:
    return JobSettings(name, "rpc", "", "0", (), rpc_urls=("http://127.0.0.1:1",), **fields)  # type: ignore[arg-type]


def lake_job(name: str, url: str = "s3://lake-bucket/pubnet/", **fields: object) -> JobSettings:
    return JobSettings(name, "lake", "", "0", (), lake_url=url, **fields)  # type: ignore[arg-type]


def horizon_job(name: str, **fields: object) -> JobSettings:
    return JobSettings(name, "horizon", "/operations", "0", ("http://127.0.0.1:1",), **fields)  # type: ignore[arg-type]


async def run_term(
    source: object, token: int, start: str = "0", until: Callable[[], bool] | None = None
) -> tuple[TermEnded, list[CommitCursor]]:
    """One term of node "a" under ``token`` with a writer that accepts every commit: how it
    ended (revoked once ``until`` holds) and what it asked to commit."""
    control_send, control_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[CommitCursor](0)
    elector_send, elector_recv = trio.open_memory_channel[ElectorInput](4)
    commits: list[CommitCursor] = []

    async def writer() -> None:
        async for msg in writer_recv:
            commits.append(msg)
            msg.reply.send_nowait(CursorCommitted(msg.token, msg.cursor, len(msg.records)))

    ingestor = Ingestor(source, "a", control_recv, writer_send, elector_send, structlog.get_logger())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(ingestor.run)
        nursery.start_soon(writer)
        await control_send.send(LeaseGranted(token, trio.current_time() + 30.0, start, None))
        with trio.fail_after(10):
            while until is not None and not until():
                with trio.move_on_after(0.05):
                    ended = await elector_recv.receive()
                    break
            else:
                if until is not None:
                    await control_send.send(LeaseRevoked(token, "test", graceful=True))
                ended = await elector_recv.receive()
        nursery.cancel_scope.cancel()
    assert isinstance(ended, TermEnded)
    return ended, commits


# --- the identities, pure ----------------------------------------------------------------------------


def test_a_lake_job_is_named_by_its_lake_and_its_filters() -> None:
    assert source_identity(lake_job("l")) == "lake s3://lake-bucket/pubnet (every event)"
    assert source_identity(lake_job("l", "s3://lake-bucket/pubnet")) == source_identity(lake_job("l"))
    assert source_identity(lake_job("l", "/srv/lake/")) == "lake file:///srv/lake (every event)"
    assert source_identity(lake_job("l", "file:///srv/lake")) == source_identity(lake_job("l", "/srv/lake"))
    typed = source_identity(lake_job("l", event_type="contract"))
    assert typed.startswith("lake s3://lake-bucket/pubnet [") and '"contract"' in typed


def test_a_lake_job_and_an_rpc_job_refuse_each_others_redis_state() -> None:
    lake, rpc = lake_job("j"), rpc_job("j")
    line = identity_conflict(rpc, source_identity(lake), EVENT_ID)
    assert line is not None and "follows lake s3://lake-bucket/pubnet" in line
    assert "configured for rpc (every event)" in line
    line = identity_conflict(lake, source_identity(rpc), EVENT_ID)
    assert line is not None and "follows rpc (every event)" in line
    # A job older than the record is judged by its cursor: an event id is either kind's ...
    assert identity_conflict(lake, None, EVENT_ID) is None
    # ... a Horizon paging token neither.
    assert identity_conflict(lake, None, "12884905985") is not None
    assert identity_conflict(lake, source_identity(lake), EVENT_ID) is None
    # The lake an RPC job backfills from (rpc.on_history_gap = "lake") is not what it follows:
    # its identity is its filters', lake phase or not, and its cursors are event ids throughout.
    assert identity_conflict(rpc, "rpc (every event)", EVENT_ID) is None


def test_the_sink_identity_names_database_and_schema_never_address_or_credentials() -> None:
    a = sink_identity(horizon_job("j", sink="postgresql://u:secret@DB.example:5432/app"), "ingestion")
    assert a == "postgres database app schema ingestion"
    # the same data: users, passwords, options, and the address a node reaches it by (a proxy
    # or pooler of its own) aside
    other_user = "postgres://other:pw@127.0.0.1:6432/app?sslmode=require"
    b = sink_identity(horizon_job("j", sink=other_user), "ingestion")
    assert a == b
    assert sink_identity(horizon_job("j", sink="postgresql://app@db.example"), "ingestion") == a
    assert sink_identity(horizon_job("j", sink="postgresql://u@db.example/app"), "other") != a
    assert sink_identity(horizon_job("j"), "ingestion") == "redis"
    assert "secret" not in a
    redis_job = horizon_job("j")
    line = sink_conflict(redis_job, "ingestion", a, None)
    assert line is not None and "commits to postgres database app schema ingestion" in line
    assert "this node is configured for redis" in line
    pg_job = horizon_job("j", sink="postgresql://u:secret@db.example/app")
    assert sink_conflict(pg_job, "ingestion", "redis", None) is not None
    # Older than the record: a cursor in Redis is the events stream's (a PostgreSQL job keeps
    # none there); without one, nothing says where the job committed.
    line = sink_conflict(pg_job, "ingestion", None, "12884905985")
    assert line is not None and "12884905985" in line and "secret" not in line
    assert sink_conflict(pg_job, "ingestion", None, None) is None
    assert sink_conflict(redis_job, "ingestion", None, "12884905985") is None


# --- at each term ------------------------------------------------------------------------------------


async def test_the_first_term_records_a_lake_jobs_source_and_the_sink(
    redis_server: LocalRedis, open_store: Callable[..., LeaseStore], job: str
) -> None:
    store = open_store(redis_server.url, job, timeout=1.0)
    granted = await store.acquire("a", 60_000)
    assert isinstance(granted, Acquired)
    key = store.keys["cursor"]
    source = IdentifiedSource(SyntheticSource(total=10), store, lake_job(job))
    ended, _ = await run_term(source, granted.token, until=lambda: bool(store.client.hget(key, "sink")))
    assert ended.reason == "revoked", ended
    assert store.client.hget(key, "source") == "lake s3://lake-bucket/pubnet (every event)"
    assert store.client.hget(key, "sink") == "redis"


@pytest.mark.parametrize("start", ["0", "now"])
async def test_a_node_with_another_sink_stops_the_job_at_its_term_before_writing(
    redis_server: LocalRedis, open_store: Callable[..., LeaseStore], job: str, start: str
) -> None:
    """The job's first term recorded the PostgreSQL sink; a node without ``--sink`` leads: its
    term ends ``source-fatal`` (the job stops on that node) before any commit, the pinning of a
    ``now`` start included."""
    store = open_store(redis_server.url, job, timeout=1.0)
    recorded = "postgres database postgres schema ingestion"
    store.client.hset(store.keys["cursor"], mapping={"sink": recorded})
    granted = await store.acquire("a", 60_000)
    assert isinstance(granted, Acquired)
    source = IdentifiedSource(SyntheticSource(total=10), store, horizon_job(job))
    ended, commits = await run_term(source, granted.token, start)
    assert ended.reason == "source-fatal" and commits == []
    assert f"node.job: job {job!r} in Redis commits to {recorded}" in ended.detail
    assert "this node is configured for redis" in ended.detail


async def test_a_postgres_node_stops_a_job_whose_records_are_in_redis(
    redis_server: LocalRedis, open_store: Callable[..., LeaseStore], job: str
) -> None:
    """A job written before the record, its cursor in Redis (the events stream holds its
    records), led by a node now configured with PostgreSQL: refused, not split between sinks."""
    store = open_store(redis_server.url, job, timeout=1.0)
    written = {"cursor": "12884905985", "source": "horizon /operations"}
    store.client.hset(store.keys["cursor"], mapping=written)
    granted = await store.acquire("a", 60_000)
    assert isinstance(granted, Acquired)
    pg_job = horizon_job(job, sink="postgresql://u:secret@127.0.0.1:1/app")
    ended, commits = await run_term(IdentifiedSource(SyntheticSource(total=10), store, pg_job), granted.token)
    assert ended.reason == "source-fatal" and commits == []
    assert "its cursor 12884905985 is in Redis" in ended.detail and "secret" not in ended.detail
    assert store.client.hget(store.keys["cursor"], "sink") is None


# --- at start-up ------------------------------------------------------------------------------------


def seed(redis_server: LocalRedis, job: str, fields: dict[str, str]) -> None:
    client: redis.Redis = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.hset(job_keys(job)["cursor"], mapping=fields)
    client.close()


def test_a_node_configured_for_another_sink_refuses_to_start(
    redis_server: LocalRedis, pg: LocalPostgres, job: str
) -> None:
    horizon = ["--horizon", f"http://127.0.0.1:{closed_port()}", "--log-format", "json"]
    seed(redis_server, job, {"source": "horizon /operations", "sink": "redis", "cursor": "12884905985"})
    done = run("--redis", redis_server.url, "--job", job, "--sink", pg.url, *horizon)
    line = one_line(done)
    assert line.startswith(f"ingestion: configuration error: node.job: job {job!r} in Redis commits to redis")
    assert "configured for postgres database postgres schema ingestion" in line
    assert pg.password not in line and "became-leader" not in done.stdout
    other = f"{job}-pg"
    seed(redis_server, other, {"sink": "postgres database postgres schema ingestion"})
    done = run("--redis", redis_server.url, "--job", other, *horizon)
    assert "this node is configured for redis" in one_line(done)


def test_a_node_configured_for_a_lake_refuses_an_rpc_job_at_start(
    redis_server: LocalRedis, job: str, tmp_path: Path
) -> None:
    """(An RPC node refused a job recorded otherwise already; a lake node recorded nothing and
    checked nothing: it led RPC jobs.)"""
    seed(redis_server, job, {"source": "rpc (every event)", "cursor": EVENT_ID})
    done = run("--redis", redis_server.url, "--job", job, "--source", "lake", "--lake", str(tmp_path),
               "--log-format", "json")  # fmt: skip
    line = one_line(done)
    assert line.startswith(f"ingestion: configuration error: node.job: job {job!r} in Redis follows rpc")
    assert f"this node is configured for lake file://{tmp_path} (every event)" in line
