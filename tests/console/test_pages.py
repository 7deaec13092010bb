"""The console's pages and feed over HTTP (real Redis, the node's ASGI app served by hypercorn on
loopback): what every page carries, what it never renders, and each node's presence record."""

from __future__ import annotations

import functools

import httpx
import redis
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from actors.lease_store import LeaseStore, job_keys
from actors.observe import NodeObserver
from ingestion.serve.console import PRESENCE_INFO_KEY, PRESENCE_KEY, ClusterReader, keep_present
from ingestion.serve.metrics import NodeMetrics, metrics_app
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until


class _Log:
    def debug(self, *_a: object, **_k: object) -> None:
        pass


async def _served(nursery: trio.Nursery, reader: ClusterReader) -> str:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    app = metrics_app(NodeMetrics(NodeObserver("n1", "j")), reader)
    binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
    return str(binds[0])


async def test_pages_escape_redis_values_carry_the_headers_and_render_no_setting(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert (await LeaseStore(client, job).acquire("n1", 5000)).__class__.__name__ == "Acquired"
    redis_client.hset(job_keys(job)["cursor"], mapping={"cursor": "</td><script>x()</script>", "token": 1})
    reader = ClusterReader(client, "n1", {job: "horizon"}, 1500)
    async with trio.open_nursery() as nursery:
        base = await _served(nursery, reader)
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:
            page = await http.get("/")
            assert page.status_code == 200
            assert f'<tr data-job="{job}" data-leader="n1">' in page.text
            assert "<script>x()" not in page.text and "&lt;/td&gt;&lt;script&gt;x()" in page.text
            assert redis_server.url not in page.text and f"127.0.0.1:{redis_server.port}" not in page.text
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert page.headers["x-content-type-options"] == "nosniff"
            state = (await http.get("/console/state")).json()
            # every job in this Redis (the fixture's server is shared by the worker's tests), ours led
            mine = [j for j in state["jobs"] if j["job"] == job]
            assert len(mine) == 1 and mine[0]["leader"] == "n1" and mine[0]["kind"] == "horizon"
            one = await http.get(f"/console/job/{job}")
            assert one.status_code == 200 and "became-leader" in one.text
            assert (await http.get("/console/job/nothing-here")).status_code == 404
            assert (await http.post("/")).status_code == 405
            assert (await http.get("/console/app.js")).headers["content-type"].startswith("text/javascript")
            async with http.stream("GET", "/console/events") as feed:
                assert feed.headers["content-type"] == "text/event-stream"
                lines = feed.aiter_lines()
                while not (line := await lines.__anext__()).startswith("data: "):
                    pass
                assert f'"job": "{job}"' in line
            assert (await http.get("/metrics")).status_code == 200  # the port's other paths stay
        nursery.cancel_scope.cancel()
    client.close()


async def test_each_node_records_its_presence_and_leaves_when_it_stops(
    redis_server: LocalRedis, redis_client: redis.Redis
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_present, client, "n7", ["a", "b"], 200, _Log())
        await wait_until(lambda: redis_client.zscore(PRESENCE_KEY, "n7") is not None, 5, what="the record")
        assert redis_client.hget(PRESENCE_INFO_KEY, "n7").startswith('{"jobs": ["a", "b"]')
        doc = await ClusterReader(client, "n1", {}, 200).state()
        nodes = {n["node"]: n for n in doc["nodes"]}
        assert nodes["n1"]["live"] and nodes["n7"]["live"] and nodes["n7"]["hosts"] == ["a", "b"]
        nursery.cancel_scope.cancel()
    assert redis_client.zscore(PRESENCE_KEY, "n7") is None  # left on the way out
    client.close()
