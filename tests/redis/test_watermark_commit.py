"""The completeness watermark committed beside the cursor (issue 49), by both sinks: the Redis
commit script against a real redis-server and ``commit_batch_v4`` against a real PostgreSQL. It
is fenced with the commit, only rises, and once a known gap holds it, never moves again."""

from __future__ import annotations

import psycopg
import redis

from actors.lease_store import CommitRejected, Committed, LeaseStore, connect
from actors.source import Record, Watermark
from ingestion.cli.completeness import postgres_decode_errors
from ingestion.postgres.readers import job_state
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis


def recs(*tokens: int) -> list[Record]:
    return [Record(str(t << 32), "{}") for t in tokens]


GAP = "history gap: ledgers before 40 are gone"


async def test_redis_keeps_the_watermark_beside_the_cursor_rising_fenced_and_held_at_a_gap(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    await store.acquire("a", 5000)
    first = await store.commit("a", 1, None, recs(5, 6), watermark=Watermark(5))
    assert first == Committed(1, str(6 << 32), 2, complete_through=5)
    assert (await store.state()).complete_through == 5
    # a batch without a watermark (a source that cannot say) leaves it as it is
    assert (await store.commit("a", 1, str(6 << 32), recs(7))).complete_through == 5
    # it only rises
    assert (await store.commit("a", 1, str(7 << 32), recs(8), watermark=Watermark(4))).complete_through == 5
    # a stale token's commit changes neither the cursor nor the watermark
    stale = await store.commit("b", 2, str(8 << 32), recs(9), watermark=Watermark(30))
    assert isinstance(stale, CommitRejected) and stale.reason == "stale-token"
    held = await store.commit("a", 1, str(8 << 32), recs(41), watermark=Watermark(8, GAP))
    assert held == Committed(1, str(41 << 32), 1, complete_through=8, held=GAP, newly_held=True)
    later = await store.commit("a", 1, str(41 << 32), recs(50), watermark=Watermark(49))
    assert later == Committed(1, str(50 << 32), 1, complete_through=8, held=GAP, newly_held=False)
    state = await store.state()
    assert (state.cursor, state.complete_through, state.complete_held) == (str(50 << 32), 8, GAP)
    assert redis_client.hget(store.keys["cursor"], "complete_through") == "8"


async def test_postgres_keeps_the_watermark_in_the_cursors_table_rising_fenced_and_held_at_a_gap(
    pg: LocalPostgres,
) -> None:
    url, job = pg.url, "watermarked"
    sink = PostgresSink(url, job, call_timeout=5)
    await sink.open_term("a", 1)
    first = await sink.commit("a", 1, None, recs(5, 6), watermark=Watermark(5))
    assert first == Committed(1, str(6 << 32), 2, complete_through=5)
    assert (await sink.commit("a", 1, str(6 << 32), recs(7))).complete_through == 5
    assert (await sink.commit("a", 1, str(7 << 32), recs(8), watermark=Watermark(4))).complete_through == 5
    other = PostgresSink(url, job, call_timeout=5)
    await other.open_term("b", 2)
    stale = await sink.commit("a", 1, str(8 << 32), recs(9), watermark=Watermark(30))
    assert isinstance(stale, CommitRejected) and stale.reason == "stale-token"
    held = await other.commit("b", 2, str(8 << 32), recs(41), watermark=Watermark(8, GAP))
    assert held == Committed(2, str(41 << 32), 1, complete_through=8, held=GAP, newly_held=True)
    later = await other.commit("b", 2, str(41 << 32), recs(50), watermark=Watermark(49))
    assert later == Committed(2, str(50 << 32), 1, complete_through=8, held=GAP, newly_held=False)
    with psycopg.connect(url) as conn:  # a reader's SQL joins the cursors table on the job
        row = conn.execute(
            "SELECT count(e.seq), c.complete_through, c.complete_held FROM ingestion.events e "
            "JOIN ingestion.cursors c USING (job) WHERE e.job = %s "
            "GROUP BY c.complete_through, c.complete_held",
            (job,),
        ).fetchone()
    assert row == (6, 8, GAP)
    # as inspect reads them: the watermark with the job's state, and the records not decoded
    state = job_state(url, "ingestion", job)
    assert (state["complete_through"], state["complete_held"]) == (8, GAP)
    bad = Record(str(51 << 32), '{"id":51,"decodeError":"bad ScVal"}')
    await other.commit("b", 2, str(50 << 32), [bad, *recs(52)])
    found = postgres_decode_errors(url, "ingestion", job, 5.0)
    assert found == [{"seq": 7, "paging_token": str(51 << 32), "decode_error": "bad ScVal"}]
