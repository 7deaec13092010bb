"""The console's I/O: the presence subscription, a job's detail read from Redis, the guarded actions."""

from __future__ import annotations

import contextlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import LeaseStore, RedisUnavailable, StateQuery, discover_jobs, job_keys, read_states
from ingestion.common.keyspace import PRESENCE_CHANNEL, PRESENCE_KEY, webhook_keys
from ingestion.common.redact import redact
from ingestion.serve.console.view import MAX_JOBS, ClusterView, why_leaderless
from ingestion.serve.presence import parse_entry, parse_message
from ingestion.webhook import admin

AUDIT_ON_PAGE = 50  # audit entries a job's page shows
REJECTIONS_ON_PAGE = 20
ATTEMPTS_ON_PAGE = 30
DEAD_LETTERS_ON_PAGE = 20
DISCOVER_EVERY = 5.0  # seconds: jobs no node reports are looked for at most this often (page loads)
READ_THREADS = 4  # the console's Redis reads run on threads of their own, never the renewals'
SILENCE = 6.0  # seconds without a report on the channel (its own node's included) before subscribing again
WEBHOOK_ACTIONS = ("pause", "resume", "replay-dead-letters")
ACTIONS = ("handover", *WEBHOOK_ACTIONS)

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
    api: Callable[[], dict[str, Any] | None] = lambda: None  # the events API it serves (ApiApp.console_view)
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
        """The cluster now, from the reports (no Redis command), and the events API this node
        serves (``api``: from its own metrics, None when it serves none)."""
        return {**self.view.state(trio.current_time()), "api": self.api()}

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
            return {
                s.job: {"leader": s.leader or "", "token": s.lease_token, "cursor": s.cursor or "",
                        "lease_ttl_ms_left": s.lease_ttl_ms_left}
                for s in read_states(self.client, names)
            }  # fmt: skip

        self.view.unreported = await self._store.run(read)

    async def job(self, name: str) -> dict[str, Any] | None:
        """One job's detail, read from Redis in one round trip; None when Redis holds nothing of
        it and no node reports it."""
        keys = job_keys(name)
        hook = webhook_keys(name)
        query = StateQuery(name, AUDIT_ON_PAGE)

        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(*keys.values(), *hook.values())
            query.queue(pipe)  # (the job's state, read as every reader reads it)
            pipe.xrevrange(keys["rejections"], count=REJECTIONS_ON_PAGE)
            pipe.hgetall(keys["health"])
            pipe.hgetall(hook["endpoint"])
            pipe.xrevrange(hook["attempts"], count=ATTEMPTS_ON_PAGE)
            pipe.hlen(hook["replayed"])
            pipe.time()
            return pipe.execute()  # type: ignore[no-any-return]

        replies = await self._store.run(read)
        exists, seen = replies[0], query.parse(replies[1 : 1 + query.replies])
        rejections, health, endpoint, attempts, replayed, (now_s, now_us) = replies[1 + query.replies :]
        reported = next((j for j in self.view.state(trio.current_time())["jobs"] if j["job"] == name), None)
        if not exists and reported is None:
            return None
        redis_now = int(now_s) * 1000 + int(now_us) // 1000
        leader = seen.leader or ""
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
                "position": seen.cursor or "", "dead_letters": seen.events,
                "dead_letters_replayed": int(replayed), "failing_record": endpoint.get("failing_record", ""),
                "last_status": endpoint.get("last_status", ""), "last_error": endpoint.get("last_error", ""),
                "last_request": json_object(endpoint.get("last_request")),
                "last_replay": json_object(endpoint.get("last_replay")),
                "lag_seconds": ((reported or {}).get("webhook") or {}).get("lag"),
                "attempts": [{"at_ms": _since_ms(i), **f} for i, f in attempts],
                "dead": [_dead_letter(i, f, f.get("paging_token") in done) for i, f in dead],
            }  # fmt: skip
        return {
            "job": name, "kind": kind, "leader": leader, "token": seen.lease_token,
            "lease_ttl_ms_left": seen.lease_ttl_ms_left,
            "leader_since_ms": (reported or {}).get("leader_since_ms"),
            "cursor": seen.cursor or "", "records": seen.events,
            "complete_through": seen.complete_through, "complete_held": seen.complete_held,
            "rate": (reported or {}).get("rate"), "lag_seconds": (reported or {}).get("lag_seconds"),
            "hosts": (reported or {}).get("hosts", []),
            "why": "" if seen.leader is not None else why_leaderless((reported or {}).get("hosts", [])),
            "healthy": sorted(n for n, ms in health.items()
                              if not n.startswith("failing:") and f"failing:{n}" not in health
                              and str(ms).isdigit() and redis_now - int(ms) <= 60_000),
            # (redacted again: an entry written before audit entries were, names a URL whole)
            "audit": [{"at_ms": _since_ms(e["id"]), **_redacted(e, but="id")} for e in reversed(seen.audit)],
            "rejections": [{"at_ms": _since_ms(i), **_redacted(f)} for i, f in rejections],
            "webhook": webhook, "backfill": backfill,
        }  # fmt: skip

    # -- actions --------------------------------------------------------------------------------

    def authorized(self, offered: str) -> bool:
        """The console token, compared in constant time (never when none is set)."""
        return bool(self.token) and hmac.compare_digest(offered.encode(), self.token.encode())

    async def act(self, action: str, job: str, by: str) -> tuple[int, str]:
        """Ask for ``action`` on ``job`` as ``by``: (HTTP status, what happened)."""
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


def json_object(raw: str | None) -> dict[str, Any] | None:
    """A JSON object kept in a hash field (a request's outcome); None when absent or not one."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _redacted(fields: Mapping[str, str], but: str = "") -> dict[str, str]:
    return {k: redact(v) for k, v in fields.items() if k != but}


def _since_ms(entry_id: str) -> int | None:
    """A stream entry's Redis time (its id's milliseconds)."""
    head = entry_id.partition("-")[0]
    return int(head) if head.isdigit() else None
