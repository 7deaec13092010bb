"""The PostgreSQL sink against a real server (Debian's postgres, started here), and its pure parts
(continuity, the fence-history check, the column contract) alone."""

from __future__ import annotations

import functools
import json
from typing import Any

import psycopg
import pytest
import structlog
import trio

from actors.cursor_writer import CursorWriter
from actors.lease_store import CommitRejected, Committed, LeaseStore, job_keys
from actors.messages import CommitCursor, CommitRefused, CursorCommitted, OpenTerm, SinkOpened
from actors.observe import NodeObserver
from actors.sink import SinkUnavailable, TermOpened, continuation
from actors.source import Record, SyntheticSource, TermContext
from actors.supervisor import NodeSpec, run_node
from ingestion.postgres import sql
from ingestion.postgres.connection import connect, ensure_schema
from ingestion.postgres.fence import FenceRejected, PostgresFence
from ingestion.postgres.readers import EventsFollower, check_job, job_state, read_events
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from ingestion.testing.wait import wait_until
from tests.support.nodes import FAST_TIMING, lease_store

SRC = SyntheticSource(total=None)


def recs(first: int, last: int) -> list[Record]:
    return [SRC.record(i) for i in range(first, last + 1)]


@pytest.fixture(scope="module")
def repeatable_read_url(pg: LocalPostgres) -> str:
    """A database of the module's server whose sessions default to REPEATABLE READ (``ALTER
    DATABASE``, as an operator may have set it): the sink must pin its own isolation level."""
    pg.psql("CREATE DATABASE repeatable_read")
    pg.psql("ALTER DATABASE repeatable_read SET default_transaction_isolation = 'repeatable read'")
    return pg.url_for("postgres", pg.password, "repeatable_read")


@pytest.fixture(params=["server-default", "repeatable-read-default"])
def url(request: pytest.FixtureRequest, pg: LocalPostgres) -> str:
    """The sink's URL: the server's default database (READ COMMITTED), then one whose default
    isolation level is REPEATABLE READ."""
    if request.param == "server-default":
        return pg.url
    return str(request.getfixturevalue("repeatable_read_url"))


def waiting_on_a_lock(url: str, application: str) -> int:
    """How many sessions of ``application`` wait for a lock (a fence row's)."""
    with connect(url, 5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'", (application,),
        ).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


def test_continuation_is_the_redis_scripts_rule() -> None:
    assert continuation(None, recs(1, 3), None) == SRC.token_of(3)
    assert continuation(SRC.token_of(3), [], SRC.token_of(9)) == SRC.token_of(9)
    with pytest.raises(ValueError, match="not-after-cursor"):
        continuation(SRC.token_of(3), recs(3, 4), None)
    with pytest.raises(ValueError, match="not-after-cursor"):
        continuation(None, recs(1, 2), SRC.token_of(1))
    with pytest.raises(ValueError, match="bad-paging-token"):
        continuation(None, [Record("x", "{}")], None)


def test_fence_history_judges_rows_by_when_the_fence_rose() -> None:
    # term 2 opened after row 2; a stale term-1 row before the raise is fine, after it is not
    assert sql.verify_fences([(1, 1), (2, 1), (3, 2)], [(1, 0), (2, 2)]) == []
    assert sql.verify_fences([(1, 1), (2, 2), (3, 1)], [(1, 0), (2, 1)]) != []
    assert sql.verify_fences([(1, 1), (3, 1)], [(1, 0)]) == ["seq 3 follows 1: a gap"]


def test_a_table_with_other_columns_breaks_the_contract() -> None:
    assert sql.column_problem("ingestion", "events", []) is None
    line = sql.column_problem("ingestion", "events", [("job", "text"), ("id", "integer")])
    assert line is not None and line.startswith("sink.schema: table ingestion.events")


async def test_commits_are_fenced_continuous_and_notified(url: str) -> None:
    sink = PostgresSink(url, "j1", call_timeout=5)
    assert await sink.open_term("a", 1) == TermOpened(None, True)
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN ingestion_events")
    done = await sink.commit("a", 1, None, recs(1, 3))
    assert done == Committed(token=1, cursor=SRC.token_of(3), count=3)
    note = next(listener.notifies(timeout=2, stop_after=1))
    assert json.loads(note.payload) == {"job": "j1", "seq": 3, "cursor": SRC.token_of(3)}
    listener.close()
    # a replayed batch: the stored cursor moved on
    replay = await sink.commit("a", 1, None, recs(1, 3))
    assert isinstance(replay, CommitRejected) and replay.reason == "cursor-moved"
    # a new term raises the fence and reads the cursor there ...
    other = PostgresSink(url, "j1", call_timeout=5)
    assert await other.open_term("b", 2) == TermOpened(SRC.token_of(3), True)
    # ... after which the old term's commit changes nothing
    stale = await sink.commit("a", 1, SRC.token_of(3), recs(4, 5))
    assert stale == CommitRejected(1, "stale-token", 2, SRC.token_of(3))
    assert await sink.open_term("a", 1) == CommitRejected(1, "stale-token", 2, None)
    assert await other.commit("b", 2, SRC.token_of(3), recs(4, 5)) == Committed(2, SRC.token_of(5), 2)
    rows = read_events(url, "ingestion", "j1")
    assert [(s, p, t) for s, p, t, _ in rows] == [
        (i, SRC.token_of(i), 1 if i <= 3 else 2) for i in range(1, 6)
    ]
    assert json.loads(rows[0][3]) == json.loads(SRC.record(1).body)
    assert check_job(url, "ingestion", "j1") == ([], 5)
    sink.close()
    other.close()


async def test_retention_keeps_the_newest_max_len_rows(url: str) -> None:
    sink = PostgresSink(url, "kept", call_timeout=5, events_max_len=4)
    await sink.open_term("a", 1)
    cursor = None
    for first in range(1, 20, 3):
        done = await sink.commit("a", 1, cursor, recs(first, first + 2))
        assert isinstance(done, Committed)
        cursor = done.cursor
    rows = read_events(url, "ingestion", "kept")
    assert [s for s, *_ in rows] == [18, 19, 20, 21]
    sink.close()


async def test_the_cursor_writer_steps_down_on_a_postgres_fence(url: str) -> None:
    sink = PostgresSink(url, "w", call_timeout=5)
    inbox_send, inbox = trio.open_memory_channel[CommitCursor | OpenTerm](0)
    elector_send, elector_recv = trio.open_memory_channel[object](4)
    observer = NodeObserver("a", "w")
    writer = CursorWriter(None, "a", inbox, elector_send, structlog.get_logger(), observer, sink=sink)  # type: ignore[arg-type]
    reply_send, reply_recv = trio.open_memory_channel[object](1)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await inbox_send.send(OpenTerm(1, reply_send))  # type: ignore[arg-type]
            assert await reply_recv.receive() == SinkOpened(1, None)
            await inbox_send.send(CommitCursor(1, None, tuple(recs(1, 2)), reply_send))  # type: ignore[arg-type]
            assert await reply_recv.receive() == CursorCommitted(1, SRC.token_of(2), 2)
            assert await PostgresSink(url, "w", call_timeout=5).open_term("b", 7) == TermOpened(
                SRC.token_of(2), True
            )
            await inbox_send.send(CommitCursor(1, SRC.token_of(2), tuple(recs(3, 3)), reply_send))  # type: ignore[arg-type]
            assert await reply_recv.receive() == CommitRefused(1, "stale-token", 7)
            assert (await elector_recv.receive()).current_token == 7  # type: ignore[attr-defined]
            inbox_send.close()
    fenced = [e for e in logs if e["event"] == "fencing-token-rejected"]
    assert fenced and fenced[0]["sink"] == "postgres" and fenced[0]["checked_by"] == "postgres"
    sink.close()


async def test_job_code_writes_only_under_the_current_fence(url: str) -> None:
    with connect(url, 5) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.notes (k text PRIMARY KEY, v int)")
    fence = PostgresFence(url, "proj", call_timeout=5)
    async with TermContext("a", 3).fenced(fence) as tx:
        await tx.execute("INSERT INTO public.notes VALUES ('x', 3)")
    with pytest.raises(FenceRejected):
        async with TermContext("old", 2).fenced(fence) as tx:
            await tx.execute("UPDATE public.notes SET v = 2")
    with connect(url, 5) as conn:
        assert conn.execute("SELECT v FROM public.notes").fetchall() == [(3,)]


def test_an_existing_table_with_other_columns_is_refused(pg: LocalPostgres) -> None:
    pg.psql("CREATE SCHEMA odd; CREATE TABLE odd.events (id int)")
    with connect(pg.url, 5) as conn:
        with pytest.raises(sql.SchemaMismatch, match=r"sink\.schema: table odd\.events"):
            ensure_schema(conn, "odd")


async def test_the_payment_projector_is_fenced_and_idempotent_by_paging_token(url: str) -> None:
    from ingestion.postgres.projector import projector

    def payment(i: int, to: str, amount: str) -> Record:
        token = SRC.token_of(i)
        body = json.dumps({"id": token, "paging_token": token, "type": "payment", "to": to, "amount": amount})
        return Record(token, body)

    sink = PostgresSink(url, "payments", call_timeout=5)
    await sink.open_term("a", 1)
    first = [payment(1, "GA", "1.5"), payment(2, "GB", "2"), payment(3, "GA", "0.5")]
    await sink.commit("a", 1, None, first)
    action = projector(url, "payments", "totals")
    assert (await action(1, TermContext("a", 4)))["rows"] == 3
    assert (await action(2, TermContext("a", 4)))["rows"] == 0  # nothing new: no double count
    await sink.commit("a", 1, SRC.token_of(3), [payment(4, "GB", "3")])
    with pytest.raises(FenceRejected):
        await action(3, TermContext("old", 3))  # a stale leader projects nothing
    assert (await action(3, TermContext("b", 5)))["rows"] == 1
    with connect(url, 5) as conn:
        totals = conn.execute(
            "SELECT account, total, payments FROM ingestion.payment_totals ORDER BY 1"
        ).fetchall()
    assert [(a, str(t), n) for a, t, n in totals] == [("GA", "2.0", 2), ("GB", "5", 2)]
    sink.close()


async def test_a_node_that_cannot_reach_its_postgres_sink_holds_off_and_uses_no_token(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    """PostgreSQL out of reach (e.g. at start-up): the node does not campaign, so no term ends
    commit-unknown and no token is used up; it says so once, and leads once PostgreSQL answers."""
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")  # (for the reads below)
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(pg.port).serve)
        proxy.set_mode("refuse")
        sink = PostgresSink(pg.url.replace(f":{pg.port}/", f":{proxy.port}/"), job, call_timeout=1.0)
        spec = NodeSpec("a", job, 1500, FAST_TIMING, 0.01, "0")
        with lease_store(redis_server.url, job) as store, structlog.testing.capture_logs() as logs:
            await nursery.start(functools.partial(
                run_node, store, SyntheticSource(total=None), spec, structlog.get_logger(), sink=sink,
            ))  # fmt: skip

            def held_off() -> list[Any]:
                return [e for e in logs if e["event"] == "campaign-held-off"]

            await wait_until(held_off, 10, what="campaign-held-off")
            await trio.sleep(2 * FAST_TIMING.ttl)  # before, a term (and a token) per attempt
            assert held_off()[0]["reason"] == "sink-unreachable" and len(held_off()) == 1
            # with its cause, as Redis trouble is said: the address and what went wrong, no password
            cause = held_off()[0]["error"]
            assert f"@127.0.0.1:{proxy.port}/" in cause and "connection failed" in cause, cause
            assert ":***@" in cause  # the password blanked
            assert store.client.get(job_keys(job)["token"]) is None
            assert not [e for e in logs if e["event"] == "became-leader"]

            proxy.set_mode("forward")
            await wait_until(lambda: job_state(pg.url, "ingestion", job)["events"] > 0, 15,
                             what="rows committed once PostgreSQL answers")  # fmt: skip
            assert int(store.client.get(job_keys(job)["token"])) == 1
            nursery.cancel_scope.cancel()
    sink.close()


def test_a_text_array_literal_round_trips_every_character(pg: LocalPostgres) -> None:
    values = ['{"a": "q\\"uote", "b": "back\\\\slash\\n"}', "{x,y}", "", "NULL", "ünï\tcode ,} \\"]
    with connect(pg.url, 5) as conn:
        row = conn.execute("SELECT %s::text[]", (sql.text_array(values),)).fetchone()
    assert row is not None and row[0] == values


# --- review findings: each test failed before its fix ----------------------------------------------


def node_spec(node: str, job: str) -> NodeSpec:
    return NodeSpec(node, job, 1500, FAST_TIMING, 0.01, "0")


async def start_on(nursery: trio.Nursery, store: LeaseStore, job: str, sink: PostgresSink) -> None:
    """Node "a" of ``job`` on a synthetic source, committing into ``sink``."""
    await nursery.start(functools.partial(
        run_node, store, SyntheticSource(total=None), node_spec("a", job), structlog.get_logger(),
        sink=sink,
    ))  # fmt: skip


def events_of(logs: list[Any], name: str) -> list[Any]:
    return [e for e in logs if e["event"] == name]


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


async def test_a_record_jsonb_would_refuse_is_stored_as_sent(url: str) -> None:
    """A Horizon memo can carry the JSON escape \\u0000, which jsonb refuses: the record is
    stored as sent (json keeps the text)."""
    sink = PostgresSink(url, "nul", call_timeout=5)
    await sink.open_term("a", 1)
    token = SRC.token_of(1)
    body = json.dumps({"id": token, "memo": "a\x00b"})  # the escape \u0000 in the text
    assert "\\u0000" in body
    assert await sink.commit("a", 1, None, [Record(token, body)]) == Committed(1, token, 1)
    assert read_events(url, "ingestion", "nul")[0][3] == body
    sink.close()


async def test_a_batch_postgres_refuses_is_a_definite_refusal_not_an_outage(url: str) -> None:
    """The server answered an error for the one autocommit statement (data or integrity,
    SQLSTATE classes 22 and 23): it was rolled back, so the commit is refused (``bad-batch``,
    as the Redis path reports a batch it cannot take), not of unknown outcome."""
    sink = PostgresSink(url, "bad", call_timeout=5)
    await sink.open_term("a", 1)
    with pytest.raises(ValueError, match=r"sink\.url"):
        await sink.commit("a", 1, None, [Record(SRC.token_of(1), "not json")])
    # the connection is fine and nothing was written
    assert await sink.commit("a", 1, None, recs(1, 1)) == Committed(1, SRC.token_of(1), 1)
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


async def test_commit_batch_itself_refuses_a_batch_that_does_not_continue_the_cursor(url: str) -> None:
    """A direct call of ``commit_batch`` (not through the sink, which checks the batch before
    sending it) is held to the Redis script's rule: paging tokens well formed and strictly
    rising, the first after the stored cursor, the new cursor the last token or an anchor after
    it. Each refusal is definite and changes nothing."""
    sink = PostgresSink(url, "direct", call_timeout=5)
    await sink.open_term("a", 1)
    assert await sink.commit("a", 1, None, recs(1, 3)) == Committed(1, SRC.token_of(3), 3)
    t = SRC.token_of

    def commit(tokens: list[str], cursor: str | None, previous: str = t(3)) -> tuple[bool, str]:
        with connect(url, 5) as conn:
            row = conn.execute(
                f"SELECT ok, reason FROM ingestion.{sql.COMMIT_BATCH}"  # type: ignore[arg-type]
                "(%s, 1, 'a', %s, %s, 0, %s::text[], %s::text[])",
                ("direct", previous, cursor, sql.text_array(tokens), sql.text_array(["{}"] * len(tokens))),
            ).fetchone()
        assert row is not None
        return bool(row[0]), str(row[1])

    refused = {
        "out of order": (commit([t(5), t(4)], t(4)), "not-after-cursor"),
        "a repeated token": (commit([t(4), t(4)], t(4)), "not-after-cursor"),
        "first not after the cursor": (commit([t(3), t(4)], t(4)), "not-after-cursor"),
        "first before the cursor": (commit([t(2)], t(2)), "not-after-cursor"),
        "cursor before the last token": (commit([t(4), t(5)], t(4)), "not-after-cursor"),
        "cursor back, no records": (commit([], t(2)), "not-after-cursor"),
        "cursor unchanged, no records": (commit([], t(3)), "not-after-cursor"),
        "no cursor": (commit([t(4)], None), "bad-paging-token"),
        "a malformed token": (commit([t(4), "x5"], t(6)), "bad-paging-token"),
        "a malformed anchor": (commit([t(4)], "5x"), "bad-paging-token"),
        "a comma in a token": (commit([t(4), f"{t(5)},{t(6)}"], t(7)), "bad-paging-token"),
        "a position beyond int64": (commit([f"{1 << 63}"], f"{1 << 63}"), "bad-paging-token"),
        "a sub-position beyond uint32": (commit([f"{t(4)}-{1 << 32}"], t(5)), "bad-paging-token"),
    }  # fmt: skip
    assert {k: answer for k, (answer, _) in refused.items()} == {
        k: (False, reason) for k, (_, reason) in refused.items()
    }
    state = job_state(url, "ingestion", "direct")
    assert (state["cursor"], state["last_seq"]) == (t(3), 3)
    # what continues the cursor lands: numbers compare as numbers, sub-positions after them,
    # an anchor after the last token, then Stellar RPC's fixed-width ids
    assert commit([t(4), f"{t(4)}-1", f"{t(4)}-10"], t(5)) == (True, "")
    assert commit([], t(6), t(5)) == (True, "")
    rpc = [f"{p:019d}-{n:010d}" for p, n in ((100, 9), (100, 10), (101, 0))]
    assert commit(rpc[:2], rpc[1], t(6)) == (False, "not-after-cursor")  # t(6) is far above 100
    assert commit(["99999999999999"], "99999999999999", t(6)) == (True, "")
    assert commit(rpc[1:2], rpc[1], "99999999999999") == (False, "not-after-cursor")
    rpc_start = f"{99:019d}-{1:010d}"
    with connect(url, 5) as conn:  # a job moved to Stellar RPC's ids
        conn.execute("UPDATE ingestion.cursors SET cursor = %s WHERE job = 'direct'", (rpc_start,))
    assert commit(rpc, rpc[2], rpc_start) == (True, "")
    assert commit([rpc[1]], rpc[1], rpc[2]) == (False, "not-after-cursor")
    assert job_state(url, "ingestion", "direct")["cursor"] == rpc[2]
    sink.close()


# --- PostgreSQL's notification queue: one per server, held behind its slowest listener ------------

NOTICE_FILL = (  # 4000 notices of about 8 KB on the sink's channel for another job: 32 MB
    "SELECT pg_notify('ingestion_events', json_build_object('job', 'other', 'pad', "
    "repeat('x', 7800) || i)::text) FROM generate_series(1, 4000) i"
)


def queue_usage(url: str) -> float:
    """``pg_notification_queue_usage()`` after one more notice (PostgreSQL advances the queue's
    tail as notifiers write)."""
    with connect(url, 5) as conn:
        conn.execute("SELECT pg_notify('unheard', 'x')")
        row = conn.execute("SELECT pg_notification_queue_usage()").fetchone()
    return float(row[0]) if row else 0.0


async def test_a_paused_tail_does_not_hold_the_servers_notification_queue(pg: LocalPostgres) -> None:
    """``tail``'s consumer stops reading (its output paused in a pager, or a full pipe) while
    commits go on: its listening connection is drained by a thread of its own, so its backend
    never stalls writing to it and PostgreSQL's queue, which every NOTIFY on the server needs,
    is not held behind it."""
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")
    follower = EventsFollower(pg.url, "ingestion", "paused", timeout=5)
    try:
        assert follower.last_seq() == 0  # listening from here on; then the consumer pauses
        with connect(pg.url, 5) as conn:
            conn.execute(NOTICE_FILL)  # more than a stalled backend's socket buffers hold
        await wait_until(lambda: queue_usage(pg.url) == 0.0, 5, what="the queue drained")
        with connect(pg.url, 5) as conn:
            stalled = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ingestion-tail%%' "
                "AND wait_event = 'ClientWrite'"
            ).fetchone()
        assert stalled == (0,)
        assert follower.wait(0.5) is True  # the first notice after connecting: read again
        assert follower.wait(0.1) is False  # none of the 4000 was for this job
    finally:
        follower.close()


async def test_a_commit_past_the_notification_queue_limit_lands_without_its_notice(pg: LocalPostgres) -> None:
    """A listener that stopped reading holds PostgreSQL's notification queue; full, it fails every
    transaction that notifies, at COMMIT. Past ``ingestion.notify_queue_limit`` (here 0.1 % of the
    queue: PostgreSQL 15's is 8 GB and cannot be made smaller) a commit lands without its NOTIFY;
    below it again, commits notify again."""
    sink = PostgresSink(pg.url, "crowded", call_timeout=5)
    await sink.open_term("a", 1)
    listener = psycopg.connect(pg.url, autocommit=True)
    listener.execute("LISTEN ingestion_events")  # and reads nothing until the end: it stalls
    conn = connect(pg.url, 5)

    def commit(first: int, last: int, previous: str | None) -> bool:
        tokens, bodies = [r.paging_token for r in recs(first, last)], [r.body for r in recs(first, last)]
        row = conn.execute(
            f"SELECT ok FROM ingestion.{sql.COMMIT_BATCH}(%s, 1, 'a', %s, %s, 0, %s::text[], %s::text[])",  # type: ignore[arg-type]
            ("crowded", previous, tokens[-1], sql.text_array(tokens), sql.text_array(bodies)),
        ).fetchone()  # fmt: skip
        return bool(row and row[0])

    def notified() -> list[int]:
        seqs = [json.loads(n.payload) for n in listener.notifies(timeout=1)]
        return [p["seq"] for p in seqs if p.get("job") == "crowded"]

    try:
        conn.execute("SET ingestion.notify_queue_limit = 'not a number'")  # the default then, 0.5
        assert commit(1, 1, None)
        conn.execute("SET ingestion.notify_queue_limit = 0.001")
        conn.execute(NOTICE_FILL)
        assert queue_usage(pg.url) > 0.001
        assert commit(2, 2, SRC.token_of(1))  # the queue past the limit: no notice, no failure
        assert notified() == [1]  # reading them all releases the queue
        assert queue_usage(pg.url) == 0.0
        assert commit(3, 3, SRC.token_of(2))
        assert notified() == [3]
        assert [s for s, *_ in read_events(pg.url, "ingestion", "crowded")] == [1, 2, 3]
    finally:
        listener.close()
        conn.close()
        sink.close()


def settings_for(job: str, redis_url: str, sink_url: str) -> Any:
    from ingestion.cli.run import _flags_layer
    from ingestion.cli.run import parser as run_parser
    from ingestion.config import load

    return load(None, {}, _flags_layer(run_parser().parse_args(
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
    from actors.observe import NodeObserver
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
    (stopped, error), = fatal
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
        row = conn.execute(
            "SELECT * FROM earlier.open_term_v3('old', 5, 'a', 'redis:h:1/0')"
        ).fetchone()
        assert row == (True, "", 5, None, "redis:h:1/0")
        assert conn.execute("SELECT token, node, domain FROM earlier.fences").fetchall() == [
            (5, "a", "redis:h:1/0")
        ]
