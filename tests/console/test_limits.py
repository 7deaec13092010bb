"""The console beside a busy node (issue 46): its Redis reads never wait for the threads the
node's renewals and commits use, and its live pages (server-sent event streams) are capped."""

from __future__ import annotations

import redis
import trio

from actors.lease_store import LeaseStore
from ingestion.testing.local_redis import LocalRedis
from tests.support.console_http import console


async def test_console_reads_do_not_wait_for_the_threads_renewals_use(
    redis_server: LocalRedis, job: str
) -> None:
    """Every thread of trio's default limiter (the renewals' and commits') taken: a job's page
    still answers, read on the console's own threads (before: 503, its read timed out waiting)."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True, socket_timeout=1.0)
    await LeaseStore(client, job).acquire("n1", 5000)
    async with console(client, {job: "horizon"}) as (_reader, http):
        limiter = trio.to_thread.current_default_thread_limiter()
        busy = [object() for _ in range(int(limiter.total_tokens))]
        for b in busy:
            await limiter.acquire_on_behalf_of(b)
        try:
            page = await http.get(f"/console/job/{job}/state")
            assert page.status_code == 200, page.text
            assert page.json()["leader"] == "n1"
        finally:
            for b in busy:
                limiter.release_on_behalf_of(b)
    client.close()


async def test_live_pages_past_the_cap_are_answered_503_and_a_closed_one_frees_its_place(
    redis_server: LocalRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    async with console(client, {}, streams=2) as (reader, http):
        async with (
            http.stream("GET", "/console/events") as first,
            http.stream("GET", "/console/events") as second,
        ):
            assert first.status_code == second.status_code == 200
            third = await http.get("/console/events")
            assert third.status_code == 503
            assert "2 live console pages already (observe.console_streams)" in third.text
            assert reader.streaming == 2
        with trio.fail_after(5):
            while reader.streaming:  # noqa: ASYNC110 (the server notices the closed streams)
                await trio.sleep(0.01)
        async with http.stream("GET", "/console/events") as again:
            assert again.status_code == 200
    client.close()
