"""The operator console: one page per node, showing the whole cluster.

Served beside ``/metrics`` on the observe port (``ingestion/serve/metrics.py``):

- ``/`` the jobs (kind, leader, token and since when, lease left, committed cursor, records/s,
  lag; for a job without a leader, why: who hosts it and why each holds off) and the nodes (live
  or down by their reports, version, what each hosts and leads, its share, its source health per
  job). Each job's row carries ``data-job="NAME"`` and ``data-leader="NODE"`` (empty when
  leaderless) for scripts and tests.
- ``/console/job/NAME`` one job: its state, its hosts, its takeover audit (every term: who, when,
  why, how long the job was leaderless), its recent fencing rejections and, for a webhook job, the
  endpoint (state, position, recent attempts with status and latency, dead letters).
- ``/console/state`` the cluster as JSON; ``/console/job/NAME/state`` one job's detail as JSON;
  ``/console/events`` (``?job=NAME`` on a job's page) server-sent events: ``state`` whenever the
  cluster changes, ``job`` when that job's detail does. The pages update without a reload.
- ``POST /console/action`` the guarded actions (below).

**What it reads.** The cluster comes from the nodes' presence reports
(``ingestion/serve/presence.py``): one subscription to their channel, so an open page costs no
Redis command per second, whatever the number of jobs and viewers. A page load also looks for jobs
in Redis that no live node reports (one ``SCAN``, at most every ``DISCOVER_EVERY``). A job's page
reads that job's keys in one round trip when it loads and when the job's reports change.

**Actions**, read-only unless ``observe.console_token`` is set: hand a job over (its leader's
next renewal takes the request and ends the term gracefully), pause or resume a webhook endpoint,
replay its dead letters. The console only asks; the job's leader carries each out under its own
fencing token and writes it to the job's audit with who asked. A request must be a JSON ``POST``
(a cross-site form cannot send one without the browser asking first, which this server never
allows), from the console's own origin when the browser names one, with the token as a bearer
token, compared in constant time.

Nothing a source, an endpoint or Redis gave is trusted: the server escapes every value it writes
into HTML, and the page's script (``/console/app.js``, no inline script: the
Content-Security-Policy forbids it) sets text only. No setting is rendered (so no secret: the
Redis URL, webhook URLs and secrets, the console token; a PostgreSQL sink's URL appears only in a
node's held-off reason, with its password blanked, as in its log line).
"""

from __future__ import annotations

import contextlib
import hmac
import html
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import LeaseStore, RedisUnavailable, discover_jobs, job_keys, parse_lease_value
from ingestion.common.asgi import Receive, Scope, Send
from ingestion.common.redact import redact
from ingestion.serve.backfill_section import backfill_section
from ingestion.serve.completeness_section import completeness_section, watermark_of
from ingestion.serve.presence import PRESENCE_CHANNEL, PRESENCE_KEY, parse_entry, parse_message
from ingestion.webhook.admin import outcome_text, outcome_words

AUDIT_ON_PAGE = 50  # audit entries a job's page shows
REJECTIONS_ON_PAGE = 20
ATTEMPTS_ON_PAGE = 30
DEAD_LETTERS_ON_PAGE = 20
EVENTS_FOR = 300.0  # seconds one events connection lasts (the browser reconnects by itself)
PUSH_EVERY = 1.0  # seconds: the state is pushed this often at most (and when it changes)
DETAIL_EVERY = 1.0  # seconds: a job's detail is read again at most this often while it changes
DISCOVER_EVERY = 5.0  # seconds: jobs no node reports are looked for at most this often (page loads)
MAX_JOBS = 500  # jobs the console shows (a larger cluster shows the first, sorted, and says so)
LIVE_REPORTS = 2.5  # a node is live while its last report is younger than this many report periods
CLAIM_SLACK = 0.25  # seconds a leader's claim outlives the lease it reported (the report's travel)
CLAIM_REPORTS = 1.5  # a leader's claim holds this many report periods whatever lease it reported
MAX_BODY = 4096  # bytes of an action's request body
READ_THREADS = 4  # the console's Redis reads run on threads of their own, never the renewals'
SILENCE = 6.0  # seconds without a report on the channel (its own node's included) before subscribing again
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
WEBHOOK_ACTIONS = ("pause", "resume", "replay-dead-letters")
ACTIONS = ("handover", *WEBHOOK_ACTIONS)


# -- the pure core: reports in, the cluster out ----------------------------------------------------


@attrs.define
class Seen:
    at_ms: int  # the report's Redis time
    seen_at: float  # when it was made, on this process's trio clock
    report: dict[str, Any] | None  # None: the node left


@attrs.define
class ClusterView:
    """The nodes' latest reports and what they say of the cluster (no I/O: times are given)."""

    node: str
    nodes: dict[str, Seen] = attrs.Factory(dict)
    unreported: dict[str, dict[str, Any]] = attrs.Factory(dict)  # job -> lease read from Redis
    error: str | None = None
    version: int = 0  # moves with every report taken (the events feed pushes when it moves)

    def heard(self, node: str, at_ms: int, report: dict[str, Any] | None, seen_at: float) -> None:
        """A report (None: the node left) made at Redis time ``at_ms``, ``seen_at`` on our clock."""
        old = self.nodes.get(node)
        if old is not None and old.at_ms > at_ms:
            return  # an older report than the one held (a seed read after a message)
        self.nodes[node] = Seen(at_ms, seen_at, report)
        self.version += 1

    def _live(self, seen: Seen, now: float) -> bool:
        if seen.report is None:
            return False
        every = float(seen.report.get("every_ms", 2000)) / 1000
        return now - seen.seen_at <= LIVE_REPORTS * every

    def state(self, now: float) -> dict[str, Any]:
        jobs: dict[str, dict[str, Any]] = {}
        hosts: dict[str, list[dict[str, Any]]] = {}
        for name, seen in sorted(self.nodes.items()):
            if seen.report is None:
                continue
            live = self._live(seen, now)
            for job, r in (seen.report.get("jobs") or {}).items():
                if not isinstance(r, dict):
                    continue
                job = str(job)
                hosts.setdefault(job, []).append({
                    "node": name, "live": live, "role": str(r.get("role", "")),
                    "source_up": r.get("source_up"), "held_off": r.get("held_off") or "",
                })  # fmt: skip
                entry = jobs.setdefault(job, _empty_job(job))
                if r.get("kind") and not entry["kind"]:
                    entry["kind"] = str(r["kind"])
                claim = self._claim(seen, r, now)
                if claim is not None and (entry["token"] is None or claim["token"] > entry["token"]):
                    entry.update(claim, leader=name)
        for job, lease in self.unreported.items():
            if job not in jobs:
                jobs[job] = {**_empty_job(job), **lease}
        out = []
        for name in sorted(jobs)[:MAX_JOBS]:
            job = jobs[name]
            job["hosts"] = hosts.get(name, [])
            job["why"] = "" if job["leader"] else why_leaderless(job["hosts"])
            out.append(job)
        nodes = []
        for name, seen in sorted(self.nodes.items()):
            if seen.report is None and name != self.node:
                continue  # left gracefully: gone from the picture
            report = seen.report or {}
            hosted = sorted(str(j) for j in (report.get("jobs") or {}))
            leads = sorted(j["job"] for j in out if j["leader"] == name)
            job_reports = report.get("jobs") or {}
            nodes.append({
                "node": name, "live": self._live(seen, now), "version": str(report.get("version", "")),
                "heartbeat_ms_ago": max(0, round(1000 * (now - seen.seen_at))),
                "hosts": hosted, "leads": leads, "share": f"{len(leads)} of {len(hosted)}",
                "health": {j: _health(job_reports[j]) for j in hosted},
                "held_off": {j: str(job_reports[j].get("held_off")) for j in hosted
                             if isinstance(job_reports[j], dict) and job_reports[j].get("held_off")},
            })  # fmt: skip
        return {
            "node": self.node, "error": self.error, "jobs": out, "nodes": nodes,
            "truncated": len(jobs) > MAX_JOBS,
        }  # fmt: skip

    def _claim(self, seen: Seen, r: dict[str, Any], now: float) -> dict[str, Any] | None:
        """A report's claim to lead its job, while the lease it reported lasts."""
        if r.get("role") != "leader" or not isinstance(r.get("token"), int):
            return None
        left = r.get("lease_ms_left")
        if not isinstance(left, int | float):
            return None
        # A leader renews between its reports: its claim holds until its next report is overdue,
        # and no longer than the lease it reported once its reports stop (a SIGKILLed leader).
        since = now - seen.seen_at
        remaining = left / 1000 - since
        overdue = since > CLAIM_REPORTS * float((seen.report or {}).get("every_ms", 2000)) / 1000
        if overdue and remaining + CLAIM_SLACK < 0:
            return None
        return {
            "token": r["token"], "lease_ttl_ms_left": max(0, round(remaining * 1000)),
            "leader_since_ms": r.get("since_ms"), "cursor": str(r.get("cursor") or ""),
            "rate": r.get("rate"), "lag_seconds": r.get("lag_seconds"),
            "webhook": {k: r[k] for k in ("delivery", "delivered", "dead_letters", "lag") if k in r},
        }  # fmt: skip


def _empty_job(job: str) -> dict[str, Any]:
    return {
        "job": job, "kind": "", "leader": "", "token": None, "lease_ttl_ms_left": None,
        "leader_since_ms": None, "cursor": "", "rate": None, "lag_seconds": None, "webhook": {},
    }  # fmt: skip


def _health(r: Any) -> str:
    if not isinstance(r, dict) or r.get("source_up") is None:
        return "unknown"
    return "up" if r["source_up"] else "down"


def why_leaderless(hosts: Sequence[dict[str, Any]]) -> str:
    """Why a job has no leader, from its hosts' reports, in an operator's words."""
    live = [h for h in hosts if h["live"]]
    if not live:
        if hosts:
            return "no live node hosts it (hosted by " + ", ".join(h["node"] for h in hosts) + ", all down)"
        return "no live node hosts it"
    parts = []
    for h in live:
        if h["held_off"]:
            parts.append(f"{h['node']}: held off: {h['held_off']}")
        elif h["source_up"] is False:
            parts.append(f"{h['node']}: its source is unreachable")
        elif h["role"] in ("starting", "stopped"):
            parts.append(f"{h['node']}: {h['role']}")
        else:
            parts.append(f"{h['node']}: about to campaign ({h['role'] or 'standby'})")
    return "; ".join(parts)


# -- the I/O: the presence subscription, a job's detail, the actions ------------------------------


@attrs.define
class ClusterReader:
    """The cluster for this node's console: the presence subscription (:meth:`run`, in the node's
    nursery), a job's detail read on demand, and the guarded actions. ``configured``: this node's
    jobs and their kinds; ``token``: ``observe.console_token`` (empty: read-only)."""

    client: Any  # the node's synchronous redis-py client (its calls run in threads)
    node: str
    configured: dict[str, str]
    token: str = attrs.field(default="", repr=False)
    discover: Callable[[Any], list[str]] = discover_jobs  # Redis's jobs to list (the node's: no done range)
    backfill: Callable[[Any, str], Any] = lambda _client, _job: None  # a job's, as inspect --json's
    streams: int = 32  # live pages (events connections) served at once: observe.console_streams
    streaming: int = 0
    view: ClusterView = attrs.field(init=False)
    changed: trio.Event = attrs.Factory(trio.Event)
    _store: LeaseStore = attrs.field(init=False)
    _discovered_at: float = -1e9
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _closing: bool = False
    _busy: bool = False  # a worker thread is reading the subscription
    _pubsub: Any = None
    _waits: trio.CapacityLimiter = attrs.Factory(lambda: trio.CapacityLimiter(2))

    def __attrs_post_init__(self) -> None:
        self._store = LeaseStore(self.client, "-", limiter=trio.CapacityLimiter(READ_THREADS))
        self.view = ClusterView(self.node)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the presence channel until cancelled: subscribe, read the hash once, then take
        every report as it comes; on trouble, say so on the page and subscribe again."""
        task_status.started()
        try:
            while True:
                pubsub = None
                try:
                    pubsub = self._pubsub = await self._store.run(self._subscribe)
                    await self._seed()
                    self.view.error = None
                    self._changed()
                    heard_at = trio.current_time()
                    while True:
                        got = await trio.to_thread.run_sync(
                            self._messages, pubsub, abandon_on_cancel=True, limiter=self._waits
                        )  # (a thread of its own: a wait must not take one of the short calls')
                        if got is None:
                            raise RedisUnavailable("the presence subscription failed")
                        now = trio.current_time()
                        if got:
                            heard_at = now
                        elif now - heard_at > SILENCE:
                            # This node itself reports every 2 s: silence means a subscription
                            # that hears nothing (a former primary after a failover, a half-open
                            # connection). Subscribe again, where the client now points.
                            self._close(pubsub)
                            break
                        for data in got:
                            parsed = parse_message(data)
                            if parsed is not None:
                                self.view.heard(parsed[0], parsed[1], parsed[2], now)
                        if got:
                            self._changed()
                except RedisUnavailable as exc:
                    self.view.error = f"Redis cannot be read: {exc}"
                    self._changed()
                    self._close(pubsub)
                    await trio.sleep(1.0)
        finally:
            with self._lock:
                self._closing = True
                if not self._busy:  # (else the thread still reading closes it when it returns)
                    self._close(self._pubsub)

    def _subscribe(self) -> Any:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(PRESENCE_CHANNEL)
        return pubsub

    def _messages(self, pubsub: Any) -> list[str] | None:
        """What the channel brings within a second (in a worker thread; None: it failed)."""
        out: list[str] = []
        end = time.monotonic() + 1.0
        with self._lock:
            if self._closing:
                return out
            self._busy = True
        try:
            while (left := end - time.monotonic()) > 0 and len(out) < 1000:
                msg = pubsub.get_message(timeout=left if not out else 0)
                if msg is None:
                    if out:
                        break
                    continue
                if msg.get("type") == "message":
                    out.append(str(msg.get("data", "")))
        except (redis.RedisError, OSError):
            return None
        finally:
            with self._lock:
                self._busy = False
                if self._closing:
                    self._close(pubsub)
        return out

    @staticmethod
    def _close(pubsub: Any) -> None:
        if pubsub is None:
            return
        try:
            pubsub.close()
        except (redis.RedisError, OSError):
            pass

    async def _seed(self) -> None:
        def read() -> tuple[Any, Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(PRESENCE_KEY)
            return tuple(pipe.execute())  # type: ignore[return-value]

        (now_s, now_us), entries = await self._store.run(read)
        redis_now = int(now_s) * 1000 + int(now_us) // 1000
        now = trio.current_time()
        for node, value in entries.items():
            parsed = parse_entry(value)
            if parsed is not None:
                self.view.heard(str(node), parsed[0], parsed[1], now - (redis_now - parsed[0]) / 1000)

    async def state(self) -> dict[str, Any]:
        """The cluster now, from the reports (no Redis command)."""
        return self.view.state(trio.current_time())

    async def page_state(self) -> dict[str, Any]:
        """The cluster for a page load: the reports, and jobs in Redis that no live node reports
        (looked for at most every ``DISCOVER_EVERY``)."""
        if trio.current_time() - self._discovered_at >= DISCOVER_EVERY:
            self._discovered_at = trio.current_time()
            try:
                await self._discover()
            except RedisUnavailable as exc:
                self.view.error = f"Redis cannot be read: {exc}"
        return await self.state()

    async def _discover(self) -> None:
        reported = {j["job"] for j in self.view.state(trio.current_time())["jobs"] if j["hosts"]}
        names = sorted(set(await self._store.run(self.discover, self.client)) - reported)[:MAX_JOBS]

        def read() -> dict[str, dict[str, Any]]:  # every such job's lease, in one round trip
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                keys = job_keys(name)
                pipe.get(keys["lease"])
                pipe.pttl(keys["lease"])
                pipe.hget(keys["cursor"], "cursor")
            answers = pipe.execute() if names else []
            found = {}
            for i, name in enumerate(names):
                lease, ttl, cursor = answers[3 * i : 3 * i + 3]
                token, leader = parse_lease_value(lease) if lease else (None, "")
                left = int(ttl) if lease and int(ttl) >= 0 else None
                found[name] = {
                    "leader": leader, "token": token, "cursor": cursor or "", "lease_ttl_ms_left": left,
                }  # fmt: skip
            return found

        self.view.unreported = await self._store.run(read)

    async def job(self, name: str) -> dict[str, Any] | None:
        """One job's detail, read from Redis in one round trip; None when Redis holds nothing of
        it and no node reports it."""
        keys = job_keys(name)
        hook = _webhook_keys(name)

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(*keys.values(), *hook.values())
            pipe.get(keys["lease"])
            pipe.pttl(keys["lease"])
            pipe.hgetall(keys["cursor"])
            pipe.xlen(keys["events"])
            pipe.xrevrange(keys["audit"], count=AUDIT_ON_PAGE)
            pipe.xrevrange(keys["rejections"], count=REJECTIONS_ON_PAGE)
            pipe.hgetall(keys["health"])
            pipe.hgetall(hook["endpoint"])
            pipe.xrevrange(hook["attempts"], count=ATTEMPTS_ON_PAGE)
            pipe.hlen(hook["replayed"])
            pipe.time()
            return pipe.execute()  # type: ignore[no-any-return]

        (exists, lease, ttl, cursor, records, audit, rejections, health, endpoint, attempts, replayed,
         (now_s, now_us)) = await self._store.run(read)  # fmt: skip
        reported = next((j for j in self.view.state(trio.current_time())["jobs"] if j["job"] == name), None)
        if not exists and reported is None:
            return None
        redis_now = int(now_s) * 1000 + int(now_us) // 1000
        token, leader = parse_lease_value(lease) if lease else (None, "")
        kind = (reported or {}).get("kind") or self.configured.get(name, "")
        backfill = None
        if kind in ("rpc", "lake"):
            with contextlib.suppress(RedisUnavailable):  # (its sink slow: the page goes on without it)
                backfill = await self._store.run(self.backfill, self.client, name)
        webhook = None
        if kind == "webhook" or endpoint:
            kind = kind or "webhook"
            dead: Any = await self._store.run(
                lambda: self.client.xrevrange(keys["events"], count=DEAD_LETTERS_ON_PAGE)
            )
            done = set()
            if dead:
                flags = await self._store.run(
                    lambda: self.client.hmget(hook["replayed"], [f.get("paging_token", "") for _i, f in dead])
                )
                done = {f.get("paging_token") for (_i, f), flag in zip(dead, flags, strict=True) if flag}
            state = endpoint.get("state", "ok" if leader else "idle")
            webhook = {
                "state": "paused" if endpoint.get("paused") == "1" and state != "disabled" else state,
                "position": cursor.get("cursor", ""), "dead_letters": int(records),
                "dead_letters_replayed": int(replayed), "failing_record": endpoint.get("failing_record", ""),
                "last_status": endpoint.get("last_status", ""), "last_error": endpoint.get("last_error", ""),
                "last_request": _json_object(endpoint.get("last_request")),
                "last_replay": _json_object(endpoint.get("last_replay")),
                "lag_seconds": ((reported or {}).get("webhook") or {}).get("lag"),
                "attempts": [{"at_ms": _since_ms(i), **f} for i, f in attempts],
                "dead": [_dead_letter(i, f, f.get("paging_token") in done) for i, f in dead],
            }  # fmt: skip
        return {
            "job": name, "kind": kind, "leader": leader or "", "token": token,
            "lease_ttl_ms_left": int(ttl) if lease and int(ttl) >= 0 else None,
            "leader_since_ms": (reported or {}).get("leader_since_ms"),
            "cursor": cursor.get("cursor", ""), "records": int(records), **watermark_of(cursor),
            "rate": (reported or {}).get("rate"), "lag_seconds": (reported or {}).get("lag_seconds"),
            "hosts": (reported or {}).get("hosts", []),
            "why": "" if lease else why_leaderless((reported or {}).get("hosts", [])),
            "healthy": sorted(n for n, ms in health.items()
                              if not n.startswith("failing:") and f"failing:{n}" not in health
                              and str(ms).isdigit() and redis_now - int(ms) <= 60_000),
            # (redacted again: an entry written before audit entries were, names a URL whole)
            "audit": [{"at_ms": _since_ms(i), **_redacted(f)} for i, f in audit],
            "rejections": [{"at_ms": _since_ms(i), **_redacted(f)} for i, f in rejections],
            "webhook": webhook, "backfill": backfill,
        }  # fmt: skip

    # -- actions --------------------------------------------------------------------------------

    def authorized(self, offered: str) -> bool:
        """The console token, compared in constant time (never when none is set)."""
        return bool(self.token) and hmac.compare_digest(offered.encode(), self.token.encode())

    async def act(self, action: str, job: str, by: str) -> tuple[int, str]:
        """Ask for ``action`` on ``job`` as ``by``: (HTTP status, what happened)."""
        from ingestion.webhook import admin

        if action not in ACTIONS:
            return 400, f"unknown action {action!r}: one of {', '.join(ACTIONS)}"
        detail = await self.job(job)
        if detail is None:
            return 404, f"no job {job!r} in this Redis"
        if action == "handover":
            if detail["token"] is None:
                return 409, f"{job} has no leader to hand over"
            await LeaseStore(self.client, job).request_handover(int(detail["token"]), by)
            return 202, (f"asked {detail['leader']} to hand {job} over (term {detail['token']}): it does "
                         "at its next renewal, and the audit shows who asked")  # fmt: skip
        if detail["webhook"] is None:
            return 409, f"{job} is not a webhook job"
        client = self.client
        if action == "replay-dead-letters":
            rid = await self._store.run(lambda: admin.request_replay(client, job, dead_letters=True, by=by))
            what = "replay its dead letters"
        else:
            rid = await self._store.run(lambda: admin.request_pause(client, job, action == "pause", by=by))
            what = action
        return 202, f"asked the leader of {job} to {what} (request {rid}); the audit shows it when done"


def _webhook_keys(job: str) -> dict[str, str]:
    from ingestion.webhook.source import webhook_keys

    return webhook_keys(job)


def _dead_letter(entry_id: str, fields: Mapping[str, str], replayed: bool) -> dict[str, Any]:
    try:
        letter = json.loads(fields.get("record", "{}"))
    except ValueError:
        letter = {}
    letter = letter if isinstance(letter, dict) else {}
    return {
        "at_ms": _since_ms(entry_id), "record": fields.get("paging_token", ""),
        "attempts": letter.get("attempts"), "status": letter.get("status"),
        "error": letter.get("error") or "", "answer": str(letter.get("answer") or "")[:200],
        "replayed": replayed,
    }  # fmt: skip


def _json_object(raw: str | None) -> dict[str, Any] | None:
    """A JSON object kept in a hash field (a request's outcome); None when absent or not one."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _redacted(fields: Mapping[str, str]) -> dict[str, str]:
    return {k: redact(v) for k, v in fields.items()}


def _since_ms(entry_id: str) -> int | None:
    """A stream entry's Redis time (its id's milliseconds)."""
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else None


# -- rendering ------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _num(value: Any, unit: str = "") -> str:
    if value is None or value == "":
        return ""
    return f"{value}{unit}"


def _page(title: str, node: str, body: str, job: str = "") -> bytes:
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title><link rel=\"stylesheet\" href=\"/console/console.css\">"
        "<script src=\"/console/app.js\" defer></script></head>"
        f"<body data-page-job=\"{_e(job)}\"><header><a href=\"/\">ingestion</a> "
        f"<span class=\"muted\">served by {_e(node)}</span>"
        "<span id=\"live\" class=\"muted\"></span></header>"
        f"<main>{body}</main></body></html>\n"
    ).encode()


JOB_COLUMNS = ("job", "kind", "leader", "token", "since", "lease", "cursor", "rate", "lag", "why")


def job_row(job: dict[str, Any]) -> str:
    cells = [
        f"<a href=\"/console/job/{_e(urllib.parse.quote(job['job'], safe=''))}\">{_e(job['job'])}</a>",
        _e(job["kind"]), _e(job["leader"] or "(none)"), _e(job["token"]), _e(_when(job["leader_since_ms"])),
        _e(_num(job["lease_ttl_ms_left"], " ms")), _e(job["cursor"]), _e(_num(job.get("rate"), "/s")),
        _e(_num(job.get("lag_seconds"), " s")), _e(job.get("why", "")),
    ]  # fmt: skip
    tds = "".join(f"<td data-col=\"{n}\">{c}</td>" for n, c in zip(JOB_COLUMNS, cells, strict=True))
    leaderless = "" if job["leader"] else " class=\"leaderless\""
    return f"<tr data-job=\"{_e(job['job'])}\" data-leader=\"{_e(job['leader'])}\"{leaderless}>{tds}</tr>"


def node_row(node: dict[str, Any]) -> str:
    health = ", ".join(f"{j}: {h}" for j, h in node["health"].items())
    held = ", ".join(f"{j}: {r}" for j, r in node["held_off"].items())
    return (
        f"<tr data-node=\"{_e(node['node'])}\" data-live=\"{'yes' if node['live'] else 'no'}\">"
        f"<td>{_e(node['node'])}</td><td data-col=\"live\">{'live' if node['live'] else 'down'}</td>"
        f"<td data-col=\"heartbeat\">{_e(str(node['heartbeat_ms_ago']) + ' ms ago')}</td>"
        f"<td data-col=\"leads\">{_e(', '.join(node['leads']))}</td>"
        f"<td data-col=\"share\">{_e(node['share'])}</td>"
        f"<td data-col=\"health\">{_e(health)}</td><td data-col=\"held\">{_e(held)}</td>"
        f"<td data-col=\"version\">{_e(node['version'])}</td></tr>"
    )


def _table(table_id: str, heads: Sequence[str], rows: str) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in heads)
    return f"<table id=\"{table_id}\"><thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>"


JOB_HEADS = ("job", "kind", "leader", "token", "leader since (UTC)", "lease left", "committed cursor",
             "records/s", "lag", "why no leader")  # fmt: skip
NODE_HEADS = ("node", "state", "last report", "leads", "share", "source health", "held off", "version")


def overview(state: dict[str, Any]) -> bytes:
    error = f"<p class=\"error\" id=\"error\">{_e(state['error'])}</p>" if state["error"] else (
        "<p class=\"error\" id=\"error\" hidden></p>"
    )
    more = f"<p>Showing the first {MAX_JOBS} jobs.</p>" if state["truncated"] else ""
    body = (
        f"{error}<h1>Jobs</h1>{more}"
        + _table("jobs", JOB_HEADS, "".join(job_row(j) for j in state["jobs"]))
        + "<h1>Nodes</h1>"
        + _table("nodes", NODE_HEADS, "".join(node_row(n) for n in state["nodes"]))
    )
    return _page("ingestion: cluster", state["node"], body)


def _rows(
    items: Sequence[dict[str, Any]], cols: Sequence[str], fmt: Mapping[str, Callable[[Any], str]]
) -> str:
    out = []
    for item in items:
        cells = []
        for c in cols:
            value = fmt[c](item.get(c)) if c in fmt else item.get(c, "")
            cells.append(f"<td data-col=\"{_e(c)}\">{_e(value)}</td>")
        out.append(f"<tr>{''.join(cells)}</tr>")
    return "".join(out)


AUDIT_COLS = (
    "at_ms", "event", "node", "token", "previous_node", "previous_token", "takeover_ms", "reason", "by",
    "action", "result",
)  # fmt: skip
REJECTION_COLS = ("at_ms", "node", "token", "current_token", "rejection", "checked_by", "cursor")
ATTEMPT_COLS = ("at_ms", "record", "outcome", "status", "latency_ms", "error", "answer", "replay")
DEAD_COLS = ("at_ms", "record", "attempts", "status", "error", "answer", "replayed")
def _yes(value: Any) -> str:
    """A flag as an operator reads it (``1``/true: yes, ``0``/false: no, nothing: unknown)."""
    if value is None or value == "":
        return "unknown"
    return "yes" if value is True or value == "1" else "no"


def _result(value: Any) -> str:
    """An operator request's result as the audit keeps it (a JSON object), in words."""
    found = _json_object(value) if isinstance(value, str) else None
    return outcome_words(found) if found is not None else str(value or "")


def _request(value: Any) -> str:
    return outcome_text(value) if isinstance(value, dict) else "none yet"


WHEN = {"at_ms": _when}
FLAGS = {"live": _yes, "source_up": _yes}
# A webhook endpoint's fields as its page shows them: (field, label, in words); the failure's
# own fields only while the endpoint is failing (after a recovery they name a past failure).
ENDPOINT_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("state", "state", str),
    ("position", "delivered through", str),
    ("lag_seconds", "delivery lag", lambda v: _num(v, " s") or "none"),
    ("dead_letters", "dead letters", str),
    ("dead_letters_replayed", "dead letters replayed", str),
    ("failing_record", "failing record", str),
    ("last_error", "last error", str),
    ("last_status", "last HTTP status", str),
    ("last_request", "last request", _request),
    ("last_replay", "last replay", _request),
)
FAILURE_ONLY = frozenset({"failing_record", "last_error"})


def job_sections(job: dict[str, Any]) -> str:
    """The parts of a job's page below its row (the events feed replaces them when they change)."""
    hook = job["webhook"]
    # A webhook job's source is another job's store, not a service it probes: no source health.
    host_cols = ("node", "live", "role", *(() if hook else ("source_up",)), "held_off")
    host_heads = [c.replace("_", " ") for c in host_cols]
    healthy = "" if hook else (
        f"<p>Healthy for this job by Redis's record (source answered within a minute): "
        f"<span id=\"healthy\">{_e(', '.join(job['healthy']) or 'none recorded')}</span></p>"
    )
    parts = [
        f"<p id=\"why\">{_e(job['why'])}</p>" if job["why"] else "", healthy,
        "<h2>Hosts</h2>", _table("hosts", host_heads, _rows(job["hosts"], host_cols, FLAGS)),
        "<h2>Takeover audit (newest first)</h2>",
        _table("audit", ("when (UTC)", "event", "node", "token", "previous leader", "previous token",
                         "leaderless ms", "reason", "by", "request", "result"),
               _rows(job["audit"], AUDIT_COLS, {**WHEN, "result": _result})),
        "<h2>Recent fencing rejections</h2>",
        _table("rejections", ("when (UTC)", "node", "token", "current token", "why", "checked by", "cursor"),
               _rows(job["rejections"], REJECTION_COLS, WHEN)),
    ]  # fmt: skip
    parts += [completeness_section(job), backfill_section(job.get("backfill"))]
    if hook is not None:
        shown = [row for row in ENDPOINT_ROWS if row[0] not in FAILURE_ONLY or hook["state"] == "failing"]
        parts += [
            "<h2>Webhook endpoint</h2><table id=\"endpoint\"><tbody>",
            *(f"<tr><th>{_e(label)}</th><td data-col=\"{_e(k)}\">{_e(words(hook.get(k)))}</td></tr>"
              for k, label, words in shown),
            "</tbody></table><h2>Recent attempts (newest first)</h2>",
            _table("attempts", ("when (UTC)", "record", "outcome", "status", "latency ms", "error", "answer",
                                "replay"), _rows(hook["attempts"], ATTEMPT_COLS, {**WHEN, "replay": _yes})),
            "<h2>Dead letters (newest first)</h2>",
            _table("dead", ("when (UTC)", "record", "attempts", "status", "error", "answer", "replayed"),
                   _rows(hook["dead"], DEAD_COLS, {**WHEN, "replayed": _yes})),
        ]  # fmt: skip
    return "".join(parts)


def job_page(node: str, job: dict[str, Any], token_set: bool) -> bytes:
    actions = ["handover"] + (list(WEBHOOK_ACTIONS) if job["webhook"] is not None else [])
    labels = {"handover": "Hand over", "pause": "Pause delivery", "resume": "Resume delivery",
              "replay-dead-letters": "Replay dead letters"}  # fmt: skip
    buttons = "".join(f"<button type=\"button\" data-action=\"{a}\">{labels[a]}</button>" for a in actions)
    guard = (
        "<label>Console token <input type=\"password\" id=\"token\" autocomplete=\"off\"></label> "
        "<label>Your name <input type=\"text\" id=\"operator\" maxlength=\"60\"></label>"
        if token_set else "<p class=\"muted\">Read-only: observe.console_token is not set on this node.</p>"
    )
    body = (
        f"<h1>Job {_e(job['job'])}</h1>" + _table("jobs", JOB_HEADS, job_row(job))
        + f"<section id=\"actions\">{guard}<div>{buttons}</div>"
        + "<p id=\"result\" role=\"status\"></p></section>"
        + f"<div id=\"detail\">{job_sections(job)}</div>"
    )
    return _page(f"ingestion: {job['job']}", node, body, job["job"])


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
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            await _answer(send, 413, "request too large")
            return
        if not message.get("more_body"):
            break
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
            await event("state", state)
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
