"""``ingestion cursor reset`` for a job whose cursor the PostgreSQL sink keeps (issue 49): refused
while a node leads the job; else fenced (the sink's fence rises to a token taken in Redis: the
term before is refused at its next commit), the cursor and the completeness watermark moved in the
sink, the reset mark cleared in Redis and the move audited with its seam. Real Redis, real
PostgreSQL."""

from __future__ import annotations

import redis
import trio

from actors.lease_store import CommitRejected, job_keys
from actors.sink import TermOpened
from actors.source import Watermark
from ingestion.cli.cursor import main as cursor_main
from ingestion.postgres.connection import connect
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from tests.support.postgres_sink import SRC, recs


def sink_state(url: str, job: str) -> tuple[object, ...]:
    with connect(url, 5) as conn:
        cursor = conn.execute(
            "SELECT cursor, token, complete_through FROM ingestion.cursors WHERE job = %s", (job,)
        ).fetchone()
        fence = conn.execute("SELECT token, node FROM ingestion.fences WHERE job = %s", (job,)).fetchone()
        terms = conn.execute(
            "SELECT token, after_seq FROM ingestion.terms WHERE job = %s ORDER BY token", (job,)
        ).fetchall()
    return cursor, fence, terms


async def test_the_cursor_command_moves_a_postgresql_jobs_cursor_fenced_and_audited(
    pg: LocalPostgres, redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    keys = job_keys(job)
    sink = PostgresSink(pg.url, job, call_timeout=5)
    assert await sink.open_term("a", 1) == TermOpened(None, True)
    await sink.commit("a", 1, None, recs(1, 3), watermark=Watermark(7))
    redis_client.set(keys["token"], 1)
    redis_client.hset(keys["cursor"], mapping={
        "sink": "postgres database postgres schema ingestion", "network_reset": "reset detected",
        "network_ledger": "7", "network_ledger_hash": "aa",
    })  # fmt: skip
    flags = ["reset", job, "--to", "start", "--redis", redis_server.url, "--sink", pg.url]
    before = sink_state(pg.url, job)
    assert before[0] == (SRC.token_of(3), 1, 7)

    redis_client.set(keys["lease"], "1|a", px=60_000)
    assert await trio.to_thread.run_sync(cursor_main, flags) == 1  # led: no reset was detected
    assert sink_state(pg.url, job) == before and redis_client.hget(keys["cursor"], "network_reset")
    redis_client.delete(keys["lease"])
    stale_flags = [*flags, "--from", SRC.token_of(2)]
    assert await trio.to_thread.run_sync(cursor_main, stale_flags) == 1  # not the cursor the operator saw
    assert sink_state(pg.url, job)[0] == before[0] and redis_client.hget(keys["cursor"], "network_reset")

    assert await trio.to_thread.run_sync(cursor_main, [*flags, "--from", SRC.token_of(3)]) == 0
    token = int(redis_client.get(keys["token"]))
    cursor, fence, terms = sink_state(pg.url, job)
    assert cursor is None  # --to start: the job starts again at its start_cursor
    assert fence is not None and fence[0] == token and str(fence[1]).startswith("cli ")
    assert (token, 3) in terms
    assert redis_client.hgetall(keys["cursor"]) == {"sink": "postgres database postgres schema ingestion"}
    moved = [f for _id, f in redis_client.xrange(keys["audit"]) if f["event"] == "cursor-reset"]
    assert len(moved) == 1 and moved[0]["from"] == SRC.token_of(3) and moved[0]["to"] == ""
    assert (
        moved[0]["token"] == str(token)
        and moved[0]["seam"] == "seq 3"
        and moved[0]["why"] == "reset detected"
    )

    # the term from before is fenced: its next commit changes nothing
    stale = await sink.commit("a", 1, SRC.token_of(3), recs(4, 5))
    assert isinstance(stale, CommitRejected) and stale.reason == "stale-token"
    # the next term starts from the start cursor, with no watermark
    redis_client.set(keys["token"], token + 1)  # (the next campaign's grant)
    nxt = PostgresSink(pg.url, job, call_timeout=5)
    assert await nxt.open_term("b", token + 1) == TermOpened(None, True)
    # a move to a given cursor sets it there, the watermark cleared
    await nxt.commit("b", token + 1, None, recs(10, 11), watermark=Watermark(9))
    to = SRC.token_of(20)
    assert await trio.to_thread.run_sync(cursor_main, ["reset", job, "--to", to, "--redis", redis_server.url,
                                                       "--sink", pg.url]) == 0  # fmt: skip
    assert sink_state(pg.url, job)[0] == (to, token + 2, None)
