"""A Redis deployment has an identity of its own (``ingestion:deployment``, set once with SET NX),
and the PostgreSQL fence ties a job to it, not to how a node's Redis URL is spelled:

- one server reached as ``127.0.0.1`` by one node and ``localhost`` by another is one deployment
  (before: two, and the second node's term was refused for good);
- two servers reached by the same URL one after the other (the first gone, a new one in its
  place, without the first's data) are two (before: one, and the new one's tokens were compared
  with the old one's);
- a fence recorded under the deployment's former name (by a node of the earlier version) moves
  to the id on the first term of a node of that deployment, without a stop; a node of another
  deployment of another name is refused as before.

Real redis-servers and a real PostgreSQL, the sink as the node builds it.
"""

from __future__ import annotations

from typing import Any

from actors.lease_store import DEPLOYMENT_KEY
from actors.sink import TermOpened, TermRefused
from ingestion.node.build import build_sink
from ingestion.postgres.connection import connect, ensure_schema
from ingestion.postgres.readers import job_state
from ingestion.postgres.sink import PostgresSink
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import lease_store


def settings_for(job: str, redis_url: str, sink_url: str) -> Any:
    from ingestion.cli.run import parser as run_parser
    from ingestion.cli.usage import settings_of_flags
    from ingestion.config import load

    return load(None, {}, settings_of_flags(run_parser().parse_args(
        ["--job", job, "--redis", redis_url, "--sink", sink_url, "--horizon", "http://127.0.0.1:1"]
    )))  # fmt: skip


def sink_of(job: str, redis_url: str, pg: LocalPostgres, store: Any) -> PostgresSink:
    settings = settings_for(job, redis_url, pg.url)
    sink = build_sink(settings, settings.jobs[0], store)
    assert isinstance(sink, PostgresSink)
    return sink


def fence_domain(pg: LocalPostgres, job: str) -> str | None:
    with connect(pg.url, 5) as conn:
        row = conn.execute("SELECT domain FROM ingestion.fences WHERE job = %s", (job,)).fetchone()
    return None if row is None else row[0]


async def test_one_redis_reached_by_two_names_is_one_deployment(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    by_address = f"redis://127.0.0.1:{redis_server.port}/4"
    by_name = f"redis://localhost:{redis_server.port}/4"
    with lease_store(by_address, job) as one, lease_store(by_name, job) as other:
        assert one.deployment != other.deployment  # the URLs' spellings differ ...
        assert await one.deployment_id() == await other.deployment_id()  # ... the deployment does not
        first, second = sink_of(job, by_address, pg, one), sink_of(job, by_name, pg, other)
        try:
            assert await first.open_term("a", 1) == TermOpened(None, True)
            assert await second.open_term("b", 2) == TermOpened(None, True)
        finally:
            first.close()
            second.close()
    assert fence_domain(pg, job) == await one.deployment_id()
    assert job_state(pg.url, "ingestion", job)["fence"] == 2


async def test_two_redis_servers_reached_by_one_url_are_two_deployments(pg: LocalPostgres, job: str) -> None:
    before = LocalRedis().start()
    url = before.url
    try:
        with lease_store(url, job) as store:
            sink = sink_of(job, url, pg, store)
            assert await sink.open_term("a", 1) == TermOpened(None, True)
            first_id = await store.deployment_id()
            sink.close()
    finally:
        before.stop()
    after = LocalRedis(port=before.port).start()  # another server (its own data) at the same URL
    try:
        assert after.url == url
        with lease_store(url, job) as store:
            assert await store.deployment_id() != first_id
            sink = sink_of(job, url, pg, store)
            refused = await sink.open_term("b", 2)
            sink.close()
    finally:
        after.stop()
    assert isinstance(refused, TermRefused), refused
    assert first_id in refused.problem and "UPDATE" in refused.problem
    assert job_state(pg.url, "ingestion", job)["fence"] == 1  # nothing changed


async def test_a_fence_recorded_under_the_deployment_s_name_moves_to_its_id(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/5"
    with connect(pg.url, 5) as conn:
        ensure_schema(conn, "ingestion")
    with lease_store(url, job) as store, lease_store(url[:-1] + "6", job) as elsewhere:
        # a node of the earlier version recorded the deployment by its URL's spelling
        earlier = PostgresSink(pg.url, job, call_timeout=5, domain=store.deployment)
        assert await earlier.open_term("a", 1) == TermOpened(None, True)
        assert fence_domain(pg, job) == store.deployment
        # another deployment, named otherwise: refused, and the fence stays as it was
        other = sink_of(job, url[:-1] + "6", pg, elsewhere)
        assert isinstance(await other.open_term("c", 2), TermRefused)
        assert fence_domain(pg, job) == store.deployment
        # a node of this version on the same deployment: its first term moves the fence to the id
        sink = sink_of(job, url, pg, store)
        assert await sink.open_term("b", 3) == TermOpened(None, True)
        assert fence_domain(pg, job) == await store.deployment_id()
        assert job_state(pg.url, "ingestion", job)["fence"] == 3
        # from then on a node still naming the deployment by its URL is another domain
        assert isinstance(await earlier.open_term("a", 4), TermRefused)
        for s in (earlier, other, sink):
            s.close()
        assert store.client.get(DEPLOYMENT_KEY) == await store.deployment_id()  # kept in Redis
