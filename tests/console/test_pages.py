"""The console's pages, feed and actions over HTTP (a real Redis, the node's ASGI app served by
hypercorn on loopback): what every page carries and never renders, each node's presence report,
and the guard on every action."""

from __future__ import annotations

import json
from typing import Any

import httpx
import redis
import trio

from actors.lease_store import LeaseStore, job_keys
from actors.observe import NodeObserver
from ingestion.common.keyspace import PRESENCE_KEY, webhook_keys
from ingestion.serve.console import job_sections
from ingestion.serve.presence import keep_present, parse_entry
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.console_http import console

TOKEN = "s3cret-console-token"


class _Log:
    def debug(self, *_a: object, **_k: object) -> None:
        pass


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


async def test_an_audit_entry_is_shown_without_the_credentials_of_a_url(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """A history-gap entry written before entries were redacted (or by a path that forgot) names a
    source URL whole: the console masks it again on display."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert (await LeaseStore(client, job).acquire("n1", 5000)).__class__.__name__ == "Acquired"
    raw = "https://KEY123@rpc.example/?token=KEY123"
    entry = {"event": "history-gap", "node": "n1", "token": "1", "rpc": raw}
    redis_client.xadd(job_keys(job)["audit"], entry)  # type: ignore[arg-type]
    async with console(client, {job: "rpc"}) as (_reader, http):
        page = await http.get(f"/console/job/{job}")
        detail = await http.get(f"/console/job/{job}/state")
    assert page.status_code == detail.status_code == 200
    assert "KEY123" not in page.text and "KEY123" not in detail.text
    gap = next(e for e in detail.json()["audit"] if e["event"] == "history-gap")
    assert gap["rpc"] == "https://***@rpc.example/?token=***"
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


# -- a webhook job's page reads like the rest (issue 50, point 5): the operators' requests in the
# audit with what was asked and what came of it, the endpoint's fields under labels in words, no
# failure fields on a healthy endpoint, request outcomes in words, and no source health for a job
# that has no source of its own to probe
def webhook_job(**endpoint: Any) -> dict[str, Any]:
    hook = {
        "state": "ok", "position": "214748364800000", "dead_letters": 2, "dead_letters_replayed": 1,
        "failing_record": "", "last_status": "", "last_error": "", "last_request": None,
        "last_replay": None, "lag_seconds": 0.25, "attempts": [], "dead": [],
    } | endpoint  # fmt: skip
    return {
        "job": "hook", "kind": "webhook", "leader": "n1", "token": 3, "why": "", "healthy": [],
        "hosts": [{"node": "n1", "live": True, "role": "leader", "source_up": None, "held_off": None}],
        "audit": [], "rejections": [], "webhook": hook,
    }  # fmt: skip


def test_a_healthy_endpoint_shows_no_past_failure_and_its_fields_in_words() -> None:
    html = job_sections(webhook_job(state="ok", failing_record="214748364800001", last_error="HTTP 503",
                                    last_status="204"))  # fmt: skip
    assert "214748364800001" not in html and "HTTP 503" not in html  # a failure since mended
    for label in ("delivered through", "delivery lag", "dead letters replayed", "last HTTP status",
                  "last request", "last replay"):  # fmt: skip
        assert f"<th>{label}</th>" in html
    assert "lag_seconds</th>" not in html and "dead_letters_replayed</th>" not in html
    assert "0.25 s" in html and "none yet" in html
    # a webhook job has no source of its own: no "source up: unknown", no "none recorded"
    assert "source up" not in html and "none recorded" not in html and "unknown" not in html
    failing = job_sections(
        webhook_job(state="failing", failing_record="214748364800001", last_error="HTTP 503")
    )
    assert "<th>failing record</th>" in failing and "214748364800001" in failing and "HTTP 503" in failing


def test_request_outcomes_are_in_words() -> None:
    request = {"id": "1765000000000-0", "action": "replay", "sent": 0, "failed": 0, "by": "ana",
               "refused": "the endpoint is paused: resume it, then ask again"}  # fmt: skip
    replay = {"id": "1765000000001-0", "action": "replay-dead-letters", "sent": 3, "failed": 1}
    html = job_sections(webhook_job(last_request=request, last_replay=replay))
    assert "{&quot;" not in html and '{"' not in html  # no JSON on the page
    assert "1765000000000-0 replay by ana: refused: the endpoint is paused: resume it, then ask again" in html
    assert "1765000000001-0 replay-dead-letters: done; sent 3, failed 1" in html


async def test_the_audit_shows_what_each_operator_asked_and_what_came_of_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """Before: eight identical ``operator-request`` rows (event, node, token, by), though Redis
    holds the action and its result; and the endpoint's ``last_request`` as raw JSON."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    await LeaseStore(client, job).acquire("n1", 5000)
    audit = job_keys(job)["audit"]
    for action, result in (
        ("pause", {"action": "pause", "changed": True}),
        ("replay", {"action": "replay", "sent": 0, "failed": 0, "refused": "the endpoint is paused"}),
        ("resume", {"action": "resume", "changed": False}),
    ):
        entry = {"event": "operator-request", "node": "n1", "token": "1", "by": "ana", "action": action,
                 "request": "1-0", "result": json.dumps(result)}  # fmt: skip
        redis_client.xadd(audit, entry)
    redis_client.hset(webhook_keys(job)["endpoint"], mapping={
        "state": "ok", "failing_record": "99", "last_error": "timed out",
        "last_request": json.dumps({"id": "3-0", "action": "resume", "changed": False}),
    })  # fmt: skip
    async with console(client, {job: "webhook"}, token=TOKEN) as (_reader, http):
        page = (await http.get(f"/console/job/{job}")).text
    client.close()
    rows = page.split('<table id="audit">')[1].split("</table>")[0]
    assert '<td data-col="action">pause</td><td data-col="result">done</td>' in rows
    assert '<td data-col="result">refused: the endpoint is paused; sent 0, failed 0</td>' in rows
    assert '<td data-col="action">resume</td><td data-col="result">done (no change)</td>' in rows
    endpoint = page.split('<table id="endpoint">')[1].split("</table>")[0]
    assert "3-0 resume: done (no change)" in endpoint and "timed out" not in endpoint
    assert "&quot;" not in endpoint


async def test_an_action_whose_client_left_mid_body_is_not_carried_out(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """The action's body is read by the one ASGI body reader (``ingestion.common.asgi.read_body``):
    a client gone before its body was whole (``http.disconnect``) asked nothing, even when what
    came so far is a whole action (the reader of its own took it as the body and acted on it)."""
    from ingestion.serve.console.app import serve_console

    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    await LeaseStore(client, job).acquire("n2", 5000)
    whole = json.dumps({"action": "handover", "job": job}).encode()
    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {TOKEN}".encode())]
    scope = {"type": "http", "method": "POST", "path": "/console/action", "client": ("127.0.0.1", 1),
             "headers": headers}  # fmt: skip
    async with console(client, {}, token=TOKEN) as (reader, _http):
        for messages in (
            [{"type": "http.request", "body": whole, "more_body": True}, {"type": "http.disconnect"}],
            [{"type": "http.request", "body": b" " * 5000 + whole, "more_body": False}],
        ):
            sent: list[dict[str, Any]] = []
            inbox = iter(messages)

            async def receive() -> dict[str, Any]:
                return next(inbox)  # noqa: B023 (called within this round)

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)  # noqa: B023

            await serve_console(reader, scope, receive, send)
            statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
            assert statuses == ([] if len(messages) == 2 else [413]), statuses
        assert not redis_client.hexists(job_keys(job)["leader"], "handover_token")
    client.close()
