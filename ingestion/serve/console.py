"""The operator console: one page per node, showing the whole cluster from what Redis holds.

Served beside ``/metrics`` on the observe port (``ingestion/serve/metrics.py``), read-only:

- ``/`` the jobs (leader, token and since when, lease left, committed cursor, records) and the
  nodes (live by the registry's Redis-clock heartbeats, what each leads). Each job's row carries
  ``data-job="NAME"`` and ``data-leader="NODE"`` (empty when leaderless) for scripts and tests.
- ``/console/job/NAME`` one job: its state and its takeover audit (every term: who, when, why,
  and how long the job was leaderless before it).
- ``/console/state`` the same as JSON; ``/console/events`` as server-sent events (``state``, sent
  when it changes, at most every ``REFRESH`` seconds): the page updates itself without a reload.

Any node shows every job in its Redis, not only its own: the state is the cluster's, read from
the jobs' keys (``discover_jobs``) and the nodes' presence: every node, console or not, records
itself once a lease TTL (:func:`keep_present`) in ``ingestion:presence`` (a sorted set scored
with Redis's clock, like the balancer's registry but apart from it: joining it changes no
balancing) with its jobs and version in ``ingestion:presence:info``. A node is live while its
last record is younger than two TTLs; one that stopped gracefully leaves at once.

Nothing a source, an endpoint or Redis gave is trusted: the server escapes every value it writes
into HTML, and the page's script (``/console/app.js``, no inline script: the
Content-Security-Policy forbids it) sets text only. No setting is rendered (so no secret: Redis
and PostgreSQL URLs, webhook secrets).
"""

from __future__ import annotations

import html
import json
import time
import urllib.parse
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import attrs
import trio

from actors.lease_store import LeaseStore, NodeRegistry, RedisUnavailable, discover_jobs, job_keys
from ingestion import __version__
from ingestion.common.asgi import Receive, Scope, Send

PRESENCE_KEY = "ingestion:presence"  # node -> its last record's Redis time (ms)
PRESENCE_INFO_KEY = "ingestion:presence:info"  # node -> {"jobs": [...], "version": ...} (JSON)
REFRESH = 0.5  # seconds: the state is read from Redis at most this often, whoever asks
AUDIT_ON_PAGE = 50  # audit entries a job's page shows
EVENTS_FOR = 300.0  # seconds one events connection lasts (the browser reconnects by itself)
MAX_JOBS = 500  # jobs the console reads (a larger cluster shows the first, sorted, and says so)
HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
]


async def keep_present(client: Any, node: str, jobs: Sequence[str], ttl_ms: int, log: Any) -> None:
    """Record this node in the presence set once a TTL until cancelled, then leave it (shielded,
    bounded: a node that cannot reach Redis is simply not seen). Never raises for Redis."""
    registry = NodeRegistry(client, key=PRESENCE_KEY)
    store = LeaseStore(client, "-")
    info = json.dumps({"jobs": sorted(jobs), "version": __version__})
    said = False
    try:
        while True:
            try:
                await store.run(client.hset, PRESENCE_INFO_KEY, node, info)
                await registry.heartbeat(node, 2 * ttl_ms)
                said = False
            except RedisUnavailable as exc:
                if not said:
                    log.debug("presence-unrecorded", error=str(exc))
                said = True
            await trio.sleep(ttl_ms / 1000)
    finally:
        with trio.move_on_after(1.0, shield=True):
            try:
                await registry.leave(node)
            except RedisUnavailable:
                pass


def _since_ms(entry_id: str) -> int | None:
    """A stream entry's Redis time (its id's milliseconds)."""
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else None


@attrs.define
class ClusterReader:
    """The cluster's state from Redis, shared by every page and events connection of the node
    (one read every ``REFRESH`` at most). ``configured``: the node's own jobs and their kinds;
    ``live_ms``: how recent a registry heartbeat counts as live (the lease TTL)."""

    client: Any  # the node's synchronous redis-py client (its calls run in threads)
    node: str
    configured: dict[str, str]
    live_ms: int
    _store: LeaseStore = attrs.field(init=False)
    _cached: dict[str, Any] | None = None
    _read_at: float = -1e9
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    def __attrs_post_init__(self) -> None:
        self._store = LeaseStore(self.client, "-")

    async def state(self) -> dict[str, Any]:
        async with self._lock:
            if self._cached is None or trio.current_time() - self._read_at >= REFRESH:
                self._cached = await self._read()
                self._read_at = trio.current_time()
            return self._cached

    async def job(self, name: str) -> dict[str, Any] | None:
        """One job with its audit, or None when Redis holds nothing of it."""
        store = LeaseStore(self.client, name)
        if name not in self.configured and not await store.run(self.client.exists, *job_keys(name).values()):
            return None
        state = await store.state(AUDIT_ON_PAGE)
        return {**self._job_doc(state), "audit": _terms(state.audit)}

    async def _read(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"node": self.node, "error": None, "jobs": [], "nodes": [], "truncated": False}
        try:
            names = sorted(set(await self._store.run(discover_jobs, self.client)) | set(self.configured))
            doc["truncated"] = len(names) > MAX_JOBS
            for name in names[:MAX_JOBS]:
                doc["jobs"].append(self._job_doc(await LeaseStore(self.client, name).state(1)))
            now_s, now_us = await self._store.run(self.client.time)
            now_ms = int(now_s) * 1000 + int(now_us) // 1000
            beats = await self._store.run(self.client.zrange, PRESENCE_KEY, 0, -1, False, True)
            infos = await self._store.run(self.client.hgetall, PRESENCE_INFO_KEY)
        except RedisUnavailable as exc:
            doc["error"] = f"Redis cannot be read: {exc}"
            return doc
        leading: dict[str, list[str]] = {}
        for job in doc["jobs"]:
            if job["leader"]:
                leading.setdefault(job["leader"], []).append(job["job"])
        seen = {str(member): int(score) for member, score in beats}
        for node in sorted(set(seen) | set(leading) | {self.node}):
            age = now_ms - seen[node] if node in seen else None
            try:
                info = json.loads(infos.get(node) or "{}")
            except ValueError:
                info = {}
            doc["nodes"].append({
                "node": node, "leads": sorted(leading.get(node, [])),
                "hosts": [str(j) for j in info.get("jobs", [])], "version": str(info.get("version", "")),
                "heartbeat_ms_ago": age,
                "live": node == self.node or (age is not None and age <= 2 * self.live_ms),
            })  # fmt: skip
        return doc

    def _job_doc(self, state: Any) -> dict[str, Any]:
        last = state.audit[-1] if state.audit else None
        since = _since_ms(last["id"]) if last and last.get("event") == "became-leader" else None
        return {
            "job": state.job, "kind": self.configured.get(state.job, ""), "leader": state.leader or "",
            "token": state.token, "lease_ttl_ms_left": state.lease_ttl_ms_left,
            "leader_since_ms": since if state.leader else None, "cursor": state.cursor or "",
            "records": state.events,
        }  # fmt: skip


def _terms(audit: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
    """The audit stream's entries, newest first, each with its Redis time."""
    out = []
    for entry in reversed(audit):
        fields = {k: v for k, v in entry.items() if k != "id"}
        out.append({"at_ms": _since_ms(entry["id"]), **fields})
    return out


# -- rendering ------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _page(title: str, node: str, body: str) -> bytes:
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><link rel=\"stylesheet\" href=\"/console/console.css\">"
        "<script src=\"/console/app.js\" defer></script></head>"
        f"<body><header><a href=\"/\">ingestion</a> <span class=\"muted\">served by {_e(node)}</span>"
        "<span id=\"live\" class=\"muted\"></span></header>"
        f"<main>{body}</main></body></html>\n"
    ).encode()


def job_row(job: dict[str, Any]) -> str:
    cells = [
        f"<a href=\"/console/job/{_e(urllib.parse.quote(job['job'], safe=''))}\">{_e(job['job'])}</a>",
        _e(job["kind"]), _e(job["leader"] or "(none)"), _e(job["token"]),
        _e(_when(job["leader_since_ms"])),
        _e("" if job["lease_ttl_ms_left"] is None else f"{job['lease_ttl_ms_left']} ms"),
        _e(job["cursor"]), _e(job["records"]),
    ]  # fmt: skip
    names = ("job", "kind", "leader", "token", "since", "lease", "cursor", "records")
    tds = "".join(f"<td data-col=\"{n}\">{c}</td>" for n, c in zip(names, cells, strict=True))
    leaderless = "" if job["leader"] else " class=\"leaderless\""
    return f"<tr data-job=\"{_e(job['job'])}\" data-leader=\"{_e(job['leader'])}\"{leaderless}>{tds}</tr>"


def node_row(node: dict[str, Any]) -> str:
    age = node["heartbeat_ms_ago"]
    return (
        f"<tr data-node=\"{_e(node['node'])}\" data-live=\"{'yes' if node['live'] else 'no'}\">"
        f"<td>{_e(node['node'])}</td><td data-col=\"live\">{'live' if node['live'] else 'down'}</td>"
        f"<td data-col=\"heartbeat\">{_e('' if age is None else f'{age} ms ago')}</td>"
        f"<td data-col=\"leads\">{_e(', '.join(node['leads']))}</td>"
        f"<td data-col=\"hosts\">{_e(', '.join(node['hosts']))}</td>"
        f"<td data-col=\"version\">{_e(node['version'])}</td></tr>"
    )


def overview(state: dict[str, Any]) -> bytes:
    error = f"<p class=\"error\" id=\"error\">{_e(state['error'])}</p>" if state["error"] else (
        "<p class=\"error\" id=\"error\" hidden></p>"
    )
    more = f"<p>Showing the first {MAX_JOBS} jobs.</p>" if state["truncated"] else ""
    body = (
        f"{error}<h1>Jobs</h1>{more}<table id=\"jobs\"><thead><tr><th>job</th><th>kind</th><th>leader</th>"
        "<th>token</th><th>leader since (Redis time)</th><th>lease left</th><th>committed cursor</th>"
        "<th>records</th></tr></thead><tbody>"
        + "".join(job_row(j) for j in state["jobs"])
        + "</tbody></table><h1>Nodes</h1><table id=\"nodes\"><thead><tr><th>node</th><th>state</th>"
        "<th>last heartbeat</th><th>leads</th><th>hosts</th><th>version</th></tr></thead><tbody>"
        + "".join(node_row(n) for n in state["nodes"])
        + "</tbody></table>"
    )
    return _page("ingestion: cluster", state["node"], body)


def job_page(node: str, job: dict[str, Any]) -> bytes:
    rows = []
    for term in job["audit"]:
        rows.append(
            "<tr>" + "".join(f"<td>{_e(v)}</td>" for v in (
                _when(term.get("at_ms")), term.get("event", ""), term.get("node", ""), term.get("token", ""),
                term.get("previous_node", ""), term.get("previous_token", ""),
                term.get("takeover_ms", ""), term.get("reason", ""),
            )) + "</tr>"
        )  # fmt: skip
    body = (
        f"<h1>Job {_e(job['job'])}</h1><table id=\"jobs\"><tbody>{job_row(job)}</tbody></table>"
        "<h2>Takeover audit (newest first)</h2><table id=\"audit\"><thead><tr><th>when (Redis time)</th>"
        "<th>event</th><th>node</th><th>token</th><th>previous leader</th><th>previous token</th>"
        "<th>leaderless ms</th><th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    return _page(f"ingestion: {job['job']}", node, body)


# -- the HTTP side --------------------------------------------------------------------------------


def is_console_path(path: str) -> bool:
    return path in ("/", "/favicon.ico") or path.startswith("/console/")


def _asset(name: str) -> bytes:
    return resources.files("ingestion.serve").joinpath("assets", name).read_bytes()


async def serve_console(reader: ClusterReader, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one console request (``is_console_path``); GET or HEAD only."""
    path = scope["path"]
    head = scope["method"] == "HEAD"
    if scope["method"] not in ("GET", "HEAD"):
        await _reply(send, 405, "text/plain", b"method not allowed\n", head)
    elif path == "/favicon.ico":
        await _reply(send, 204, "image/x-icon", b"", head)  # none, and no 404 in the browser's console
    elif path == "/console/events":
        await _events(reader, receive, send)
    elif path == "/console/app.js":
        await _reply(send, 200, "text/javascript; charset=utf-8", _asset("console.js"), head)
    elif path == "/console/console.css":
        await _reply(send, 200, "text/css; charset=utf-8", _asset("console.css"), head)
    elif path == "/console/state":
        await _reply(send, 200, "application/json", json.dumps(await reader.state()).encode(), head)
    elif path == "/":
        await _reply(send, 200, "text/html; charset=utf-8", overview(await reader.state()), head)
    elif path.startswith("/console/job/"):
        name = urllib.parse.unquote(path[len("/console/job/"):])
        try:
            job = await reader.job(name)
        except RedisUnavailable as exc:
            await _reply(send, 503, "text/plain", f"Redis cannot be read: {exc}\n".encode(), head)
            return
        if job is None:
            await _reply(send, 404, "text/plain", b"no such job in this Redis\n", head)
        else:
            await _reply(send, 200, "text/html; charset=utf-8", job_page(reader.node, job), head)
    else:
        await _reply(send, 404, "text/plain", b"not found\n", head)


async def _reply(send: Send, status: int, ctype: str, body: bytes, head: bool = False) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode()), *HEADERS]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _events(reader: ClusterReader, receive: Receive, send: Send) -> None:
    """Server-sent events: ``state`` now and whenever it changes, until the client leaves or
    ``EVENTS_FOR`` has passed (the browser's EventSource then reconnects)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), *HEADERS]})  # fmt: skip

    async def until_gone(cancel: Callable[[], None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        cancel()

    async def push() -> None:
        last = None
        await send({"type": "http.response.body", "body": b"retry: 1000\n\n", "more_body": True})
        while True:
            text = json.dumps(await reader.state(), sort_keys=True)
            if text != last:
                last = text
                await send({"type": "http.response.body", "body": f"event: state\ndata: {text}\n\n".encode(),
                            "more_body": True})  # fmt: skip
            await trio.sleep(REFRESH)

    try:
        with trio.move_on_after(EVENTS_FOR):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_gone, nursery.cancel_scope.cancel)
                await push()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (OSError, RuntimeError, ExceptionGroup):
        return  # the client went away mid-send: nothing to end (Cancelled is not caught)

