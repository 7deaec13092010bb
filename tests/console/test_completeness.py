"""A job's completeness watermark on its console page (issue 49), over real HTTP from a real
redis-server: the ledger and why a gap holds it, escaped; nothing for a job without one."""

from __future__ import annotations

import redis

from actors.lease_store import LeaseStore, job_keys
from actors.source import Record, Watermark
from ingestion.testing.local_redis import LocalRedis
from tests.support.console_http import console


async def test_the_job_page_shows_the_watermark_and_why_a_gap_holds_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    store = LeaseStore(client, job)
    grant = await store.acquire("n1", 5000)
    assert grant.__class__.__name__ == "Acquired"
    async with console(client, {job: "rpc"}) as (_reader, http):
        await store.commit("n1", 1, None, [Record(str(5 << 32), "{}")], watermark=Watermark(4))
        page = (await http.get(f"/console/job/{job}")).text
        assert '<span id="complete-through">4</span>' in page and "Held there" not in page
        held = "history gap: <b>ledgers</b> before 9 are gone"
        await store.commit("n1", 1, str(5 << 32), [Record(str(9 << 32), "{}")], watermark=Watermark(4, held))
        page = (await http.get(f"/console/job/{job}")).text
        assert "Held there for good: history gap: &lt;b&gt;ledgers&lt;/b&gt; before 9 are gone." in page
        detail = (await http.get(f"/console/job/{job}/state")).json()
        assert (detail["complete_through"], detail["complete_held"]) == (4, held)
        redis_client.hdel(job_keys(job)["cursor"], "complete_through", "complete_held")
        assert 'id="complete"' not in (await http.get(f"/console/job/{job}")).text
    client.close()
