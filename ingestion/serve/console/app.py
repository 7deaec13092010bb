"""The console's HTTP side: the ASGI routes, the guarded actions' checks and the server-sent events."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from importlib import resources
from typing import Any

import trio

from actors.lease_store import RedisUnavailable
from ingestion.common.asgi import BodyTooLarge, Disconnected, Receive, Scope, Send, read_body
from ingestion.serve.api_section import api_section
from ingestion.serve.console.pages import job_page, job_sections, overview
from ingestion.serve.console.reader import ClusterReader

EVENTS_FOR = 300.0  # seconds one events connection lasts (the browser reconnects by itself)
PUSH_EVERY = 1.0  # seconds: the state is pushed this often at most (and when it changes)
DETAIL_EVERY = 1.0  # seconds: a job's detail is read again at most this often while it changes
MAX_BODY = 4096  # bytes of an action's request body
HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
]

# -- the HTTP side --------------------------------------------------------------------------------


def is_console_path(path: str) -> bool:
    return path in ("/", "/favicon.ico") or path.startswith("/console/")


def _asset(name: str) -> bytes:
    return resources.files("ingestion.serve").joinpath("assets", name).read_bytes()


def _job_name(path: str, suffix: str = "") -> str:
    return urllib.parse.unquote(path[len("/console/job/"): len(path) - len(suffix)])


async def serve_console(reader: ClusterReader, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one console request (``is_console_path``)."""
    path = scope["path"]
    method = scope["method"]
    head = method == "HEAD"
    if path == "/console/action":
        await _action(reader, scope, receive, send)
        return
    if method not in ("GET", "HEAD"):
        await _reply(send, 405, "text/plain", b"method not allowed\n", head)
    elif path == "/favicon.ico":
        await _reply(send, 204, "image/x-icon", b"", head)  # none, and no 404 in the browser's console
    elif path == "/console/events" and reader.streaming >= reader.streams:
        why = f"{reader.streams} live console pages already (observe.console_streams): close one\n"
        await _reply(send, 503, "text/plain", why.encode(), head)
    elif path == "/console/events":
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode())
        reader.streaming += 1
        try:
            await _events(reader, receive, send, (query.get("job") or [""])[0])
        finally:
            reader.streaming -= 1
    elif path == "/console/app.js":
        await _reply(send, 200, "text/javascript; charset=utf-8", _asset("console.js"), head)
    elif path == "/console/console.css":
        await _reply(send, 200, "text/css; charset=utf-8", _asset("console.css"), head)
    elif path == "/console/state":
        await _reply(send, 200, "application/json", json.dumps(await reader.page_state()).encode(), head)
    elif path == "/":
        await _reply(send, 200, "text/html; charset=utf-8", overview(await reader.page_state()), head)
    elif path.startswith("/console/job/"):
        as_json = path.endswith("/state")
        name = _job_name(path, "/state" if as_json else "")
        try:
            job = await reader.job(name)
        except RedisUnavailable as exc:
            await _reply(send, 503, "text/plain", f"Redis cannot be read: {exc}\n".encode(), head)
            return
        if job is None:
            await _reply(send, 404, "text/plain", b"no such job in this Redis\n", head)
        elif as_json:
            await _reply(send, 200, "application/json", json.dumps(job).encode(), head)
        else:
            page = job_page(reader.node, job, bool(reader.token))
            await _reply(send, 200, "text/html; charset=utf-8", page, head)
    else:
        await _reply(send, 404, "text/plain", b"not found\n", head)


async def _reply(send: Send, status: int, ctype: str, body: bytes, head: bool = False) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode()), *HEADERS]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"ok": 200 <= status < 300, "message": message}).encode()
    await _reply(send, status, "application/json", body)


async def _action(reader: ClusterReader, scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /console/action`` with ``{"action": ..., "job": ..., "operator": ...}``, guarded."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    if scope["method"] != "POST":
        await _answer(send, 405, "actions are POSTed")
        return
    if not reader.token:
        await _answer(send, 403, "read-only: observe.console_token is not set on this node")
        return
    if headers.get("content-type", "").split(";")[0].strip() != "application/json":
        await _answer(send, 415, "an action is a JSON request (application/json)")
        return
    origin = headers.get("origin")
    if origin is not None and urllib.parse.urlsplit(origin).netloc != headers.get("host", ""):
        await _answer(send, 403, "an action must come from this console's own pages")
        return
    scheme, _, offered = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not reader.authorized(offered.strip()):
        await _answer(send, 401, "the console token is missing or wrong")
        return
    try:
        body = await read_body(receive, MAX_BODY)
    except BodyTooLarge:
        await _answer(send, 413, "request too large")
        return
    except Disconnected:
        return  # the client left mid-request: what came is not the action it sent
    try:
        asked = json.loads(body)
        action, job = str(asked["action"]), str(asked["job"])
        operator = str(asked.get("operator") or "")[:60]
    except (ValueError, KeyError, TypeError):
        await _answer(send, 400, 'expected {"action": ..., "job": ...}')
        return
    client = scope.get("client") or ("?", 0)
    by = f"console {client[0]} via {reader.node}" + (f" ({operator})" if operator else "")
    try:
        status, message_text = await reader.act(action, job, by)
    except RedisUnavailable as exc:
        status, message_text = 503, f"Redis cannot be written, the outcome is unknown: {exc}"
    await _answer(send, status, message_text)


async def _events(reader: ClusterReader, receive: Receive, send: Send, job: str) -> None:
    """Server-sent events: ``state`` now, whenever the cluster changes and every ``PUSH_EVERY``;
    with ``job``, that job's detail (``job``) now and whenever its reports change. Until the
    client leaves or ``EVENTS_FOR`` has passed (the browser's EventSource then reconnects)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), *HEADERS]})  # fmt: skip

    async def until_gone(cancel: Callable[[], None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        cancel()

    async def event(name: str, doc: Any) -> None:
        text = json.dumps(doc, sort_keys=True)
        await send({"type": "http.response.body", "body": f"event: {name}\ndata: {text}\n\n".encode(),
                    "more_body": True})  # fmt: skip

    async def push() -> None:
        await send({"type": "http.response.body", "body": b"retry: 1000\n\n", "more_body": True})
        last_report: Any = object()
        detail_at = -1e9
        while True:
            state = await reader.state()
            await event("state", {**state, "api_html": api_section(state.get("api"))})
            if job:
                mine = next((j for j in state["jobs"] if j["job"] == job), None) or {}
                stable = {k: v for k, v in mine.items() if k != "lease_ttl_ms_left"}
                report = json.dumps(stable, sort_keys=True, default=str)
                if report != last_report and trio.current_time() - detail_at >= DETAIL_EVERY:
                    last_report, detail_at = report, trio.current_time()
                    try:
                        detail = await reader.job(job)
                    except RedisUnavailable:
                        detail = None
                    if detail is not None:
                        await event("job", {"html": job_sections(detail), "job": detail})
            with trio.move_on_after(PUSH_EVERY):
                await reader.changed.wait()

    try:
        with trio.move_on_after(EVENTS_FOR):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_gone, nursery.cancel_scope.cancel)
                await push()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (OSError, RuntimeError, ExceptionGroup):
        return  # the client went away mid-send: nothing to end (Cancelled is not caught)
