"""The console's pages, feed and actions over HTTP (a real Redis, the node's ASGI app served by
hypercorn on loopback): what every page carries and never renders, each node's presence report,
and the guard on every action."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import redis
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from actors.lease_store import LeaseStore, job_keys
from actors.observe import NodeObserver
from ingestion.serve.console import ClusterReader
from ingestion.serve.metrics import NodeMetrics, metrics_app
from ingestion.serve.presence import PRESENCE_KEY, keep_present, parse_entry
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from ingestion.webhook.source import webhook_keys

TOKEN = "s3cret-console-token"


class _Log:
    def debug(self, *_a: object, **_k: object) -> None:
        pass


@asynccontextmanager
async def console(
    client: redis.Redis, configured: dict[str, str], token: str = "", **options: Any
) -> AsyncIterator[tuple[ClusterReader, httpx.AsyncClient]]:
    """A node's console (its presence subscription running) served on loopback, and a client;
    ``options``: the reader's (``streams``)."""
    reader = ClusterReader(client, "n1", configured, token=token, **options)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    app = metrics_app(NodeMetrics(NodeObserver("n1", "j")), reader)
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.run)
        binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=str(binds[0]), timeout=5) as http:
            yield reader, http
        nursery.cancel_scope.cancel()


def leading(node: str, job: str, token: int) -> NodeObserver:
    observer = NodeObserver(node, job)
    observer.election_event("became-leader", token=token)
    observer.deadline(trio.current_time() + 30)
    return observer


async def test_pages_escape_redis_values_carry_the_headers_and_render_no_setting(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert (await LeaseStore(client, job).acquire("n1", 5000)).__class__.__name__ == "Acquired"
    redis_client.hset(job_keys(job)["cursor"], mapping={"cursor": "</td><script>x()</script>", "token": 1})
    async with console(client, {job: "horizon"}, token=TOKEN) as (_reader, http):
        page = await http.get("/")  # the job is in Redis, reported by no node: found by the page load
        assert page.status_code == 200
        assert f'<tr data-job="{job}" data-leader="n1">' in page.text
        assert "<script>x()" not in page.text and "&lt;/td&gt;&lt;script&gt;x()" in page.text
        assert redis_server.url not in page.text and f"127.0.0.1:{redis_server.port}" not in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "form-action 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        state = (await http.get("/console/state")).json()
        # every job in this Redis (the fixture's server is shared by the worker's tests), ours led
        mine = [j for j in state["jobs"] if j["job"] == job]
        assert len(mine) == 1 and mine[0]["leader"] == "n1"
        one = await http.get(f"/console/job/{job}")
        assert one.status_code == 200 and "became-leader" in one.text and TOKEN not in one.text
        assert 'data-action="handover"' in one.text and 'data-action="pause"' not in one.text
        detail = (await http.get(f"/console/job/{job}/state")).json()
        assert detail["leader"] == "n1" and detail["webhook"] is None and detail["audit"][0]["node"] == "n1"
        assert (await http.get("/console/job/nothing-here")).status_code == 404
        assert (await http.post("/")).status_code == 405
        assert (await http.get("/console/app.js")).headers["content-type"].startswith("text/javascript")
        assert (await http.get("/metrics")).status_code == 200  # the port's other paths stay
    client.close()


async def test_each_node_reports_its_presence_the_console_follows_it_and_a_node_that_stops_leaves(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    async with console(client, {}) as (reader, http):
        async with trio.open_nursery() as nodes:
            observers = [leading("n7", job, 4), NodeObserver("n7", f"{job}-b")]
            nodes.start_soon(keep_present, client, "n7", observers, {job: "rpc"}, 200, _Log())
            await wait_until(lambda: redis_client.hget(PRESENCE_KEY, "n7") is not None, 5, what="the report")
            parsed = parse_entry(redis_client.hget(PRESENCE_KEY, "n7"))  # type: ignore[arg-type]
            assert parsed is not None and parsed[1]["jobs"][job]["token"] == 4
            # the console hears it on the channel: no read of its own
            async with http.stream("GET", "/console/events") as feed:
                assert feed.headers["content-type"] == "text/event-stream"
                lines = feed.aiter_lines()
                while True:
                    line = await lines.__anext__()
                    if line.startswith("data: ") and '"leader": "n7"' in line:
                        break
            doc = await reader.state()
            mine = next(j for j in doc["jobs"] if j["job"] == job)
            assert mine["leader"] == "n7" and mine["token"] == 4 and mine["kind"] == "rpc"
            n7 = next(n for n in doc["nodes"] if n["node"] == "n7")
            assert n7["live"] and n7["hosts"] == sorted([job, f"{job}-b"]) and n7["share"] == "1 of 2"
            # an election event is reported at once, not at the next period
            observers[0].election_event("lost-leadership", token=4, reason="handed-over")
            await wait_until(lambda: not any(
                j["job"] == job and j["leader"] for j in reader.view.state(trio.current_time())["jobs"]
            ), 2, what="the lost term reported")  # fmt: skip
            nodes.cancel_scope.cancel()
        assert redis_client.hget(PRESENCE_KEY, "n7") is None  # left on the way out
        await wait_until(lambda: "n7" not in {n["node"] for n in reader.view.state(0)["nodes"]}, 2,
                         what="the console told n7 left")  # fmt: skip
    client.close()


async def post(http: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    default = {"content-type": "application/json", "authorization": f"Bearer {TOKEN}"}
    return await http.post("/console/action", content=json.dumps(body), headers={**default, **headers})


async def test_every_action_is_refused_without_the_token_and_asked_of_the_leader_with_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    granted = await LeaseStore(client, job).acquire("n2", 5000)
    hook = f"{job}-hook"
    redis_client.hset(webhook_keys(hook)["endpoint"], "state", "ok")
    handover = {"action": "handover", "job": job}
    async with console(client, {}) as (_reader, http):  # no token set: read-only
        refused = await post(http, handover)
        assert refused.status_code == 403 and "read-only" in refused.json()["message"]
        assert 'data-action="handover"' in (await http.get(f"/console/job/{job}")).text  # shown, refused
    async with console(client, {}, token=TOKEN) as (_reader, http):
        assert (await post(http, handover, authorization="Bearer wrong")).status_code == 401
        assert (await post(http, handover, authorization="")).status_code == 401
        assert (await post(http, handover, authorization=f"Basic {TOKEN}")).status_code == 401
        # what a cross-site form can send, and a request from another origin
        assert (await post(http, handover, **{"content-type": "text/plain"})).status_code == 415
        form = await http.post("/console/action", data={"action": "handover", "job": job},
                               headers={"authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert form.status_code == 415
        assert (await post(http, handover, origin="http://evil.example")).status_code == 403
        assert (await http.get("/console/action")).status_code == 405
        assert not redis_client.hexists(job_keys(job)["leader"], "handover_token")  # nothing asked yet
        assert (await post(http, {"action": "delete-everything", "job": job})).status_code == 400
        assert (await post(http, {"action": "pause", "job": job})).status_code == 409  # not a webhook job
        assert (await post(http, {"action": "handover", "job": "no-such-job-here"})).status_code == 404
        base = str(http.base_url).rstrip("/")
        asked = await post(http, {**handover, "operator": "alice"}, origin=base)
        assert asked.status_code == 202, asked.text
        leader = redis_client.hgetall(job_keys(job)["leader"])
        assert leader["handover_token"] == str(granted.token)  # type: ignore[union-attr]
        assert leader["handover_by"] == "console 127.0.0.1 via n1 (alice)"
        replay = await post(http, {"action": "replay-dead-letters", "job": hook})
        assert replay.status_code == 202, replay.text
        requests = [f for _id, f in redis_client.xrange(webhook_keys(hook)["requests"])]
        assert [(r["action"], r["dead_letters"], r["by"]) for r in requests] == [
            ("replay", "1", "console 127.0.0.1 via n1")
        ]
    client.close()
