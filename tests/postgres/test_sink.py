"""The PostgreSQL sink against a real server (Debian's postgres, started here), and its pure parts
(continuity, the fence-history check, the column contract) alone: what a commit writes, keeps and
notifies, what it refuses, and the server's notification queue. The fence between terms, nodes and
Redis deployments is tests/postgres/test_sink_terms.py's."""

from __future__ import annotations

import functools
import json
from typing import Any

import psycopg
import pytest
import structlog
import trio

from actors.cursor_writer import CursorWriter
from actors.lease_store import CommitRejected, Committed, job_keys
from actors.messages import CommitCursor, CommitRefused, CursorCommitted, OpenTerm, SinkOpened
from actors.observe import NodeObserver
from actors.sink import TermOpened, continuation
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
from tests.support.postgres_sink import SRC, recs


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
