"""The PostgreSQL sink's fence between terms, nodes and Redis deployments, against a real server:
a token opens for one node only, a node campaigns above the fence and steps down on its refusal,
a term that waited on the fence resumes after the commit it waited for, calls abandoned or timed
out leave nothing behind, and a job moves between Redis deployments by the step its refusal names."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
import structlog
import trio

from actors.lease_store import CommitRejected, Committed
from actors.observe import NodeObserver
from actors.sink import SinkUnavailable, TermOpened
from actors.source import SyntheticSource, TermContext
from ingestion.postgres import sql
from ingestion.postgres.connection import connect, ensure_schema
from ingestion.postgres.fence import FenceRejected, PostgresFence
from ingestion.postgres.readers import check_job, job_state, read_events
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until
from tests.support.nodes import lease_store
from tests.support.postgres_sink import SRC, events_of, node_spec, recs, start_on, waiting_on_a_lock


async def test_a_token_issued_twice_opens_in_postgres_for_one_node_only(url: str) -> None:
    """Redis issued token 5 twice (a Sentinel failover lost the grant): PostgreSQL lets only the
    node that opened it first commit under it, and refuses the other as stale."""
    a = PostgresSink(url, "twice", call_timeout=5)
    c = PostgresSink(url, "twice", call_timeout=5)
    assert await a.open_term("a", 5) == TermOpened(None, True)
    assert await a.open_term("a", 5) == TermOpened(None, True)  # the same node again: fine
    assert await c.open_term("c", 5) == CommitRejected(5, "stale-token", 5, None)
    refused = await c.commit("c", 5, None, recs(1, 2))
    assert isinstance(refused, CommitRejected) and refused.reason == "stale-token"
    assert await a.commit("a", 5, None, recs(1, 2)) == Committed(5, SRC.token_of(2), 2)
    fence = PostgresFence(url, "twice", call_timeout=5)
    with pytest.raises(FenceRejected):
        async with TermContext("c", 5).fenced(fence) as tx:
            await tx.execute("SELECT 1")
    assert job_state(url, "ingestion", "twice")["fence_node"] == "a"
    assert await c.probe() == 5  # what the Elector floors its next campaign above
    a.close()
    c.close()


async def test_a_node_campaigns_above_the_postgres_fence(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """PostgreSQL's fence is ahead of Redis's counter (a rolled-back or fresh Redis): the probe
    before the campaign raises the node's known token, so Redis never grants a token at or below
    the fence (which PostgreSQL would refuse, or, equal, share between two nodes)."""
    ahead = PostgresSink(pg.url, job, call_timeout=5)
    assert await ahead.open_term("z", 7) == TermOpened(None, True)
    ahead.close()
    sink = PostgresSink(pg.url, job, call_timeout=2.0)
    with lease_store(redis_server.url, job) as store, structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await start_on(nursery, store, job, sink)
            await wait_until(lambda: events_of(logs, "became-leader"), 10, what="a leader")
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > 0, 10,
                             what="rows")  # fmt: skip
            nursery.cancel_scope.cancel()
    assert events_of(logs, "became-leader")[0]["token"] == 8
    assert not events_of(logs, "fencing-token-rejected")
    sink.close()


async def test_a_postgres_fence_rejection_releases_the_redis_lease(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """A newer term raised PostgreSQL's fence while this node still holds the Redis lease: the
    node steps down *and* releases its lease (it is still its own), so it reports no
    duplicate-node-id and the next campaign does not wait out the TTL."""
    sink = PostgresSink(pg.url, job, call_timeout=2.0)
    with lease_store(redis_server.url, job) as store, structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await start_on(nursery, store, job, sink)
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > 0, 10,
                             what="rows")  # fmt: skip
            first = events_of(logs, "became-leader")[0]["token"]
            other = PostgresSink(pg.url, job, call_timeout=5)
            assert await other.open_term("b", first + 5) == TermOpened(
                job_state(pg.url, "ingestion", job)["cursor"], True
            )
            other.close()
            await wait_until(lambda: len(events_of(logs, "became-leader")) > 1, 10,
                             what="a new term")  # fmt: skip
            nursery.cancel_scope.cancel()
    assert events_of(logs, "fencing-token-rejected")
    assert [e["token"] for e in events_of(logs, "lease-released")][:1] == [first]
    assert not events_of(logs, "duplicate-node-id")
    assert events_of(logs, "became-leader")[1]["token"] == first + 6
    sink.close()


async def test_terms_that_keep_ending_commit_unknown_back_off(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """PostgreSQL answers the probe but every term's first transaction times out (its fence row
    locked): the node does not campaign again at once each time, burning a token per call bound;
    after the second such term in a row it waits a lease TTL."""
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")
    holder = psycopg.connect(pg.url)
    holder.execute(f"INSERT INTO ingestion.fences (job, token) VALUES ('{job}', 0)")
    holder.commit()
    holder.execute(f"SELECT * FROM ingestion.fences WHERE job = '{job}' FOR UPDATE")
    sink = PostgresSink(pg.url, job, call_timeout=0.3)
    try:
        with lease_store(redis_server.url, job) as store, structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await start_on(nursery, store, job, sink)
                await trio.sleep(5)  # real PostgreSQL timeouts: no mock clock here
                nursery.cancel_scope.cancel()
        unknown = events_of(logs, "term-open-unknown")
        assert 2 <= len(unknown) <= 5, len(unknown)
    finally:
        holder.close()
        sink.close()


async def test_sink_calls_do_not_need_trios_default_thread_slots(pg: LocalPostgres) -> None:
    """Abandoned PostgreSQL threads must not take the thread slots Redis calls need (and the
    other way round): the sink has a limiter of its own, and its connections keepalives and a
    TCP user timeout, so a dead peer ends a thread's wait."""
    limiter = trio.to_thread.current_default_thread_limiter()
    borrowers = [object() for _ in range(int(limiter.total_tokens))]
    for b in borrowers:
        limiter.acquire_on_behalf_of_nowait(b)
    sink = PostgresSink(pg.url, "limits", call_timeout=2)
    try:
        assert type(await sink.probe()) is int  # (None: no answer within the call bound)
    finally:
        for b in borrowers:
            limiter.release_on_behalf_of(b)
    with connect(pg.url, 1.0) as conn:
        params = conn.info.get_parameters()
    assert params["keepalives"] == "1" and int(params["tcp_user_timeout"]) > 0
    sink.close()


async def test_a_call_abandoned_while_connecting_neither_runs_nor_takes_over(pg: LocalPostgres) -> None:
    """A call that timed out while its thread was still connecting: when the connection comes
    up late, that thread closes it instead of publishing it as the sink's connection and running
    the abandoned statement."""
    pg.psql("CREATE TABLE IF NOT EXISTS public.late (v int)")
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")

    def sessions() -> int:
        with connect(pg.url, 5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'late-call'"
            ).fetchone()
        return int(row[0]) if row else 0

    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(pg.port).serve)
        proxy.set_mode("blackhole")
        url = pg.url.replace(f":{pg.port}/", f":{proxy.port}/")
        sink = PostgresSink(url, "late", call_timeout=0.5, application="late-call")
        with pytest.raises(SinkUnavailable):
            await sink.call(lambda c: c.execute("INSERT INTO public.late VALUES (1)"))
        proxy.set_mode("forward")
        await trio.sleep(1.5)  # the abandoned thread's connect completes meanwhile
        assert await trio.to_thread.run_sync(sessions) == 0
        nursery.cancel_scope.cancel()
    with connect(pg.url, 5) as conn:
        assert conn.execute("SELECT count(*) FROM public.late").fetchone() == (0,)
    sink.close()


def test_another_versions_functions_are_left_alone(pg: LocalPostgres) -> None:
    """In a mixed-version fleet each version calls functions of its own name: starting a node
    does not replace what an older (or newer) node runs."""
    old = (  # the previous version's, as a node of that version left it
        "CREATE SCHEMA mixed; CREATE FUNCTION mixed.open_term_v2(p_job text, p_token bigint, p_node text) "
        "RETURNS TABLE(ok boolean, fence bigint, cursor text) LANGUAGE plpgsql AS "
        "$$BEGIN RETURN QUERY SELECT true, p_token, 'old'::text; END$$"
    )
    pg.psql(old)
    assert sql.OPEN_TERM != "open_term_v2"
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "mixed")
        found = dict(conn.execute(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'mixed'"
        ).fetchall())  # fmt: skip
    assert "'old'" in found["open_term_v2"]
    assert found[sql.OPEN_TERM] == sql.function_body("mixed", sql.OPEN_TERM)
    assert found[sql.COMMIT_BATCH] == sql.function_body("mixed", sql.COMMIT_BATCH)


async def test_a_timed_out_fenced_statement_is_cancelled_before_its_connection_closes(
    url: str,
) -> None:
    """Job code's statement outlived the call bound: it is cancelled on the server (its thread
    lets go of the connection) before the connection is closed, so the fence row's lock goes at
    once rather than when ``statement_timeout`` ends the statement, and the next term writes."""
    fence = PostgresFence(url, "slow-job", call_timeout=0.5)
    with pytest.raises(SinkUnavailable):
        async with TermContext("a", 1).fenced(fence) as tx:
            await tx.execute("SELECT pg_sleep(30)")
    async with TermContext("b", 2).fenced(fence) as tx:  # within 0.5 s: the lock is gone
        assert await tx.execute("SELECT 1") == [(1,)]


async def test_a_term_that_waited_on_the_fence_resumes_after_the_commit_it_waited_for(url: str) -> None:
    """Term 2's ``open_term`` waits on the fence row while term 1's commit holds it: once that
    commit lands, term 2 reads the cursor and the last ``seq`` it left (whatever the database's
    default isolation level), so its first commit continues from there and ``terms`` is true."""
    a = PostgresSink(url, "waited", call_timeout=5)
    b = PostgresSink(url, "waited", call_timeout=5, application="waiting-term")
    await a.open_term("a", 1)
    assert await a.commit("a", 1, None, recs(1, 3)) == Committed(1, SRC.token_of(3), 3)
    held = connect(url, 5)  # term 1's next commit, its transaction held open: it holds the fence row
    held.execute("BEGIN")
    row = held.execute(
        f"SELECT ok FROM ingestion.{sql.COMMIT_BATCH}(%s, %s, %s, %s, %s, 0, %s::text[], %s::text[])",  # type: ignore[arg-type]
        ("waited", 1, "a", SRC.token_of(3), SRC.token_of(6),
         sql.text_array([r.paging_token for r in recs(4, 6)]), sql.text_array([r.body for r in recs(4, 6)])),
    ).fetchone()  # fmt: skip
    assert row == (True,)
    opened: list[object] = []

    async def open_b() -> None:
        opened.append(await b.open_term("b", 2))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_b)
        await wait_until(lambda: waiting_on_a_lock(url, "waiting-term"), 5, what="open_term waiting")
        held.execute("COMMIT")
    held.close()
    assert opened == [TermOpened(SRC.token_of(6), True)]
    assert await b.commit("b", 2, SRC.token_of(6), recs(7, 8)) == Committed(2, SRC.token_of(8), 2)
    assert job_state(url, "ingestion", "waited")["terms"] == [
        {"token": 1, "after_seq": 0}, {"token": 2, "after_seq": 6},
    ]  # fmt: skip
    assert check_job(url, "ingestion", "waited") == ([], 8)
    a.close()
    b.close()


async def test_fenced_job_code_that_waited_on_the_fence_sees_the_older_terms_writes(url: str) -> None:
    """Term 2's fenced transaction waits on the fence row while term 1's holds it: once term 1
    commits, term 2's statements see what it wrote (whatever the database's default isolation
    level), so job code that does a side effect once does it once."""
    with connect(url, 5) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.sent (k text, term bigint)")
    fence = PostgresFence(url, "mailer", call_timeout=5)

    async def send_once(term: TermContext) -> None:
        async with term.fenced(fence) as tx:
            if not await tx.execute("SELECT 1 FROM public.sent WHERE k = 'welcome'"):
                await tx.execute("INSERT INTO public.sent VALUES ('welcome', %s)", (term.token,))

    async with TermContext("a", 1).fenced(fence) as tx:  # term 1 opens its fence
        await tx.execute("SELECT 1")
    async with trio.open_nursery() as nursery:
        async with TermContext("a", 1).fenced(fence) as tx:
            await tx.execute("INSERT INTO public.sent VALUES ('welcome', 1)")
            nursery.start_soon(send_once, TermContext("b", 2))
            await wait_until(lambda: waiting_on_a_lock(url, "ingestion-job:mailer"), 5,
                             what="term 2's fenced transaction waiting")  # fmt: skip
    with connect(url, 5) as conn:
        assert conn.execute("SELECT term FROM public.sent").fetchall() == [(1,)]


def settings_for(job: str, redis_url: str, sink_url: str) -> Any:
    from ingestion.cli.run import parser as run_parser
    from ingestion.cli.usage import settings_of_flags
    from ingestion.config import load

    return load(None, {}, settings_of_flags(run_parser().parse_args(
        ["--job", job, "--redis", redis_url, "--sink", sink_url, "--horizon", "http://127.0.0.1:1"]
    )))  # fmt: skip


async def test_nodes_of_another_redis_deployment_are_refused_for_the_job_not_churned(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """Nodes on two Redis deployments (db 7 and db 8) lead the same job into one schema: the
    first term opened in PostgreSQL ties the job to its Redis deployment; the other's term is
    refused for good (one line naming both deployments and what to do), the job stops on that
    node after one term, and none of its rows land (before: the two alternated, a term each
    couple of seconds, each fencing the other out)."""
    from actors.supervisor import JobRun, run_jobs
    from ingestion.node.build import build_sink

    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")  # (for the reads below)
    home_url, other_url = redis_server.url[:-1] + "7", redis_server.url[:-1] + "8"
    fatal: list[tuple[str, str]] = []
    with (
        lease_store(home_url, job) as home, lease_store(other_url, job) as other,
        structlog.testing.capture_logs() as logs,
    ):  # fmt: skip
        home_settings = settings_for(job, home_url, pg.url)
        other_settings = settings_for(job, other_url, pg.url)
        home_sink = build_sink(home_settings, home_settings.jobs[0], home)
        other_sink = build_sink(other_settings, other_settings.jobs[0], other)
        assert isinstance(home_sink, PostgresSink) and isinstance(other_sink, PostgresSink)
        async with trio.open_nursery() as nursery:
            await start_on(nursery, home, job, home_sink)
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > 0, 10, what="rows")
            run = JobRun(other, SyntheticSource(total=None), node_spec("b", job),
                         structlog.get_logger().bind(n="b"), NodeObserver("b", job), other_sink)  # fmt: skip
            await nursery.start(functools.partial(
                run_jobs, [run], structlog.get_logger(), on_fatal=lambda j, e: fatal.append((j, e))
            ))  # fmt: skip
            await wait_until(lambda: fatal, 10, what="the other deployment's node refused")
            rows = job_state(pg.url, "ingestion", job)["events"]
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > rows + 10, 10,
                             what="the home node going on")  # fmt: skip
            nursery.cancel_scope.cancel()
    ((stopped, error),) = fatal
    assert stopped == job
    # the job's owner by its id, this node's Redis by its id and its URL
    assert await home.deployment_id() in error and await other.deployment_id() in error
    assert other.deployment in error and "UPDATE" in error
    theirs = [e for e in logs if e.get("n") == "b"]
    assert len([e for e in theirs if e["event"] == "became-leader"]) == 1
    mine = {e["token"] for e in logs if e["event"] == "became-leader" and e.get("n") != "b"}
    state = job_state(pg.url, "ingestion", job)
    assert state["fence_node"] == "a" and {t["token"] for t in state["terms"]} <= mine
    assert {t for _, _, t, _ in read_events(pg.url, "ingestion", job, limit=100_000)} <= mine
    assert not [e for e in logs if e["event"] == "fencing-token-rejected"]
    home_sink.close()
    other_sink.close()


async def test_became_leader_names_the_cursor_the_term_resumes_from_in_postgres(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """A PostgreSQL job's cursor is PostgreSQL's, not Redis's (which has none): ``became-leader``
    logs the one the term resumes from, read when it opened there (before: the start cursor,
    ``"0"``, whatever PostgreSQL held)."""
    earlier = PostgresSink(pg.url, job, call_timeout=5)
    assert await earlier.open_term("z", 1) == TermOpened(None, True)
    assert await earlier.commit("z", 1, None, recs(1, 3)) == Committed(1, SRC.token_of(3), 3)
    earlier.close()
    sink = PostgresSink(pg.url, job, call_timeout=2.0)
    with lease_store(redis_server.url, job) as store, structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await start_on(nursery, store, job, sink)
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > 3, 10, what="rows")
            nursery.cancel_scope.cancel()
    (became,) = events_of(logs, "became-leader")
    assert became["cursor"] == SRC.token_of(3)
    assert read_events(pg.url, "ingestion", job)[3][1] == SRC.token_of(4)  # resumed from there
    sink.close()


async def test_a_job_moves_to_another_redis_deployment_by_the_step_its_refusal_names(
    pg: LocalPostgres,
) -> None:
    """The refusal names the one SQL step that moves a job to another Redis on purpose; after
    it, the new deployment's first term owns the job and the old one's terms are refused."""
    from actors.sink import TermRefused

    home = PostgresSink(pg.url, "moved", call_timeout=5, domain="redis:10.0.0.1:6379/7")
    new = PostgresSink(pg.url, "moved", call_timeout=5, domain="redis:10.0.0.2:6379/0")
    assert await home.open_term("a", 1) == TermOpened(None, True)
    refused = await new.open_term("b", 2)
    assert isinstance(refused, TermRefused)
    assert refused.problem.startswith(f"sink.url {pg.url.replace(pg.password, '***')}: job 'moved'")
    assert "redis:10.0.0.1:6379/7" in refused.problem and "redis:10.0.0.2:6379/0" in refused.problem
    assert job_state(pg.url, "ingestion", "moved")["fence"] == 1  # nothing changed
    pg.psql(refused.problem.rsplit(" and run ", 1)[1])
    assert await new.open_term("b", 2) == TermOpened(None, True)
    assert isinstance(await home.open_term("a", 3), TermRefused)
    home.close()
    new.close()


def test_a_version_2_fences_table_gains_the_domain_column_and_its_jobs_are_adopted(
    pg: LocalPostgres,
) -> None:
    """The migration rule: a table of an earlier version gets the column this one added
    (nullable); a job fenced before it has no domain yet, and its next term records one."""
    pg.psql(
        "CREATE SCHEMA earlier; CREATE TABLE earlier.fences (job text PRIMARY KEY, token bigint "
        "NOT NULL, node text NOT NULL DEFAULT ''); INSERT INTO earlier.fences VALUES ('old', 4, 'a')"
    )
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "earlier")
        row = conn.execute("SELECT * FROM earlier.open_term_v3('old', 5, 'a', 'redis:h:1/0')").fetchone()
        assert row == (True, "", 5, None, "redis:h:1/0")
        assert conn.execute("SELECT token, node, domain FROM earlier.fences").fetchall() == [
            (5, "a", "redis:h:1/0")
        ]
