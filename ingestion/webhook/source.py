"""The webhook job: delivers another job's committed records to one endpoint, signed, in order.

:class:`WebhookSource` is a :class:`~actors.source.Source` whose "records" are delivery outcomes:
after an endpoint acknowledged a record (2xx), the source hands the Ingestor a batch that only
moves the job's cursor to that record's paging token (``Batch((), through=token)``), which the
CursorWriter commits with the term's fencing token like any cursor. A record whose retries are
exhausted is handed on as a *record* of the webhook job: its dead letter, appended to the job's own
events stream in the same fenced commit that moves the position past it. So the delivery position
and the dead-letter list are Redis's, fenced, and a paused or partitioned former deliverer can move
neither.

Ordered delivery (``concurrency = 1``, the default) waits for each position commit before the next
POST (``Batch.committed``): a record is sent again only when its acknowledgement was not committed,
and never after a later record was acknowledged. With ``concurrency`` > 1, up to that many POSTs are
in flight and the position moves over the finished prefix (:class:`~ingestion.webhook.core.Window`).

Operators' requests (``ingestion webhooks replay|enable``) arrive in the job's ``requests`` stream;
the leader carries them out under its token and records them done in the ``endpoint`` hash.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import random
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import attrs
import httpx
import orjson
import trio

from actors.cursor_order import token_key
from actors.lease_store import CommitRejected, LeaseStore, RedisUnavailable
from actors.sink import SinkUnavailable
from actors.source import Batch, Record, TermContext, TermFenced, current_term
from ingestion.common.http import describe, ssl_context
from ingestion.common.retry import parse_retry_after
from ingestion.webhook.core import (
    DELIVERED,
    EXCERPT_BYTES,
    GONE,
    RetrySchedule,
    Window,
    envelope,
    event_time,
    event_type,
    judge,
    message_id,
    outcome_label,
    sign,
)
from ingestion.webhook.records import RecordStore, Stored

USER_AGENT = "ingestion-webhooks/1"
READ_PAGE = 1000  # records read from the source job's store at a time
IDLE_WAIT = 5.0  # seconds an idle reader waits for the next record before it reads again anyway
REQUESTS_EVERY = 1.0  # seconds between looks at the operators' requests while delivering
DISABLED_POLL = 1.0  # seconds between looks while the endpoint is disabled
ATTEMPTS_KEPT = 200  # recent attempts kept in the job's attempts stream (approximately)
ATTEMPT_SAMPLE = 1.0  # seconds: every failed attempt is kept, a delivered one at most this often
HOLD_EVERY = 1.0  # seconds between moves of the source stream's retention floor (one call)
CLOCK_REFRESH = 30.0  # seconds between reads of Redis's clock (carried by the monotonic clock between)
SKEW_WARN = 5.0  # seconds: a node's wall clock further off Redis's than this is logged, once per term


@attrs.define
class ServerClock:
    """The wall clock a signature's ``webhook-timestamp`` is taken from: Redis's ``TIME``, carried
    forward by the node's monotonic clock between reads (every :data:`CLOCK_REFRESH` s).

    Receivers refuse a timestamp more than a few minutes off their own clock (``standardwebhooks``:
    five), so a node whose wall clock is wrong (an NTP step, a VM restored from a snapshot) would
    sign every POST in a way the endpoint rejects (401), and delivery would stall for as long as it
    led. Every node of a deployment shares Redis's clock, whatever its own says. Until Redis has
    answered once (its outage is the lease's matter) the node's own wall clock stands in.
    """

    read: Callable[[], Awaitable[float]]  # Redis's TIME in seconds
    log: Any
    _anchor: tuple[float, float] | None = None  # (Redis seconds, trio time at that reading)
    _warned: bool = False

    async def now(self) -> float:
        before = trio.current_time()
        if self._anchor is None or before - self._anchor[1] >= CLOCK_REFRESH:
            try:
                server = await self.read()
            except RedisUnavailable:
                pass  # the last reading carries on; none yet: the node's own clock
            else:
                self._anchor = (server, (before + trio.current_time()) / 2)
                skew = time.time() - server
                if abs(skew) > SKEW_WARN and not self._warned:
                    self._warned = True
                    self.log.warning("wall-clock-skew", skew_s=round(skew, 1), signing_with="redis")
        if self._anchor is None:
            return time.time()
        return self._anchor[0] + trio.current_time() - self._anchor[1]

    def reset(self) -> None:
        """A new term: read Redis's clock again before the first signature (say a skew again)."""
        self._anchor = None
        self._warned = False


def webhook_keys(job: str) -> dict[str, str]:
    """The webhook job's own keys beside its lease store's (same hash tag, same cluster slot)."""
    prefix = f"ingestion:{{{job}}}"
    return {name: f"{prefix}:{name}" for name in ("endpoint", "requests", "replayed", "attempts")}


@attrs.define
class WebhookStats:
    """What the node's metrics and status show of one webhook job (this node's view)."""

    delivered: int = 0  # records acknowledged (2xx) and committed
    attempts: dict[str, int] = attrs.Factory(dict)  # by outcome: 2xx, 3xx, 4xx, 429, 5xx, timeout, error
    dead_letters: int = 0
    state: str = "idle"  # idle (not leading), ok, failing, disabled
    oldest_undelivered_ms: int | None = None  # commit time of the next record to deliver
    last_delivered_ms: int | None = None

    def lag_seconds(self, now_ms: int) -> float:
        if self.oldest_undelivered_ms is None:
            return 0.0
        return max(0.0, (now_ms - self.oldest_undelivered_ms) / 1000)


@attrs.frozen
class Unit:
    """What one POST carries: one record, or a batch of records (a JSON array)."""

    stored: tuple[Stored, ...]
    msg_id: str
    body: bytes

    @property
    def key(self) -> str:
        return self.stored[0].record.paging_token

    @property
    def last(self) -> str:
        return self.stored[-1].record.paging_token


Done = tuple[Unit, str, dict[str, Any]]  # a unit, its outcome (delivered or dead), the dead letter's detail


@attrs.frozen
class Attempt:
    status: int | None
    error: str
    retry_after: float | None
    excerpt: str
    latency_ms: int = 0  # from the request to the answer (or the failure)


@attrs.define
class WebhookSource:
    """Deliver the records of ``from_job`` (of kind ``from_kind``), read from ``records``, to
    ``url``; ``store`` is the webhook job's own lease store (fenced writes of its endpoint state)."""

    job: str
    from_job: str
    from_kind: str
    records: RecordStore
    store: LeaseStore
    url: str
    keys: tuple[bytes, ...]
    schedule: RetrySchedule
    log: Any
    on_exhausted: str = "dead-letter"
    batch: int = 1
    concurrency: int = 1
    connect_timeout: float = 2.0
    timeout: float = 15.0
    verify: ssl.SSLContext | bool = attrs.Factory(ssl_context)  # one context per process (http.py)
    stats: WebhookStats = attrs.Factory(WebhookStats)
    rng: random.Random = attrs.Factory(random.Random)
    # commit time of each unit read and not yet committed (the delivery lag), in source order
    _waiting: collections.deque[int] = attrs.field(factory=collections.deque, init=False)
    # the store position of the last record whose outcome is committed (this term)
    _delivered_through: str | None = attrs.field(default=None, init=False)
    _clock: ServerClock = attrs.field(init=False)
    # The endpoint's state, three things apart: delivery ok or failing, disabled by a 410 (until
    # an enable), paused by an operator (until a resume); ``stats.state`` shows the one that holds.
    _delivery: str = attrs.field(default="ok", init=False)
    _disabled: bool = attrs.field(default=False, init=False)
    _paused: bool = attrs.field(default=False, init=False)  # an operator paused delivery (fenced, kept)
    _resumed: trio.Event = attrs.field(factory=trio.Event, init=False)  # set when not paused
    _last_kept: float = attrs.field(default=-1e9, init=False)  # when a delivered attempt was last kept

    def __attrs_post_init__(self) -> None:
        self._clock = ServerClock(self.store.server_time, self.log)

    async def resolve_start(self, cursor: str) -> str:
        """``now``: the newest record the source job holds (``0`` when it holds none)."""
        if cursor != "now":
            return cursor
        return await self.records.newest() or "0"

    # -- the term ---------------------------------------------------------------------------------

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        term = current_term.get()
        self._delivery, self._disabled, self._paused = "ok", False, False
        self._show()
        self._waiting.clear()
        self._delivered_through = None
        self.stats.oldest_undelivered_ms = None
        self._clock.reset()
        try:
            position = await self.records.locate(cursor)
            await self.records.hold(position)  # retention keeps what this term has yet to deliver
            keys = webhook_keys(self.job)
            endpoint = await self.store.run(lambda: self.store.client.hgetall(keys["endpoint"]))
            self._disabled = _text(endpoint.get(b"state", endpoint.get("state", b""))) == "disabled"
            self._paused = _text(endpoint.get(b"paused", endpoint.get("paused", b""))) == "1"
            self._resumed = trio.Event()
            if not self._paused:
                self._resumed.set()
            self._show()
            limits = httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            )
            timeout = httpx.Timeout(self.timeout, connect=self.connect_timeout)
            client = httpx.AsyncClient(
                timeout=timeout, limits=limits, verify=self.verify, follow_redirects=False,
                headers={"user-agent": USER_AGENT, "content-type": "application/json"},
            )  # fmt: skip
            async with client, _plain_errors(), trio.open_nursery() as nursery:
                units_send, units_recv = trio.open_memory_channel[Unit](max(2, 2 * self.concurrency))
                nursery.start_soon(self._read, position, units_send)
                nursery.start_soon(self._serve_requests, client, term)
                next_done: Callable[[], Awaitable[list[Done]]]
                if self.concurrency == 1:
                    next_done = functools.partial(self._next_in_order, client, term, units_recv)
                else:
                    next_done = self._side_by_side(client, term, units_recv, nursery)
                next_hold = trio.current_time() + HOLD_EVERY
                while True:
                    done = await next_done()
                    batch = _commit_batch(done)
                    yield batch
                    assert batch.committed is not None
                    await batch.committed.wait()  # (in order: the next POST only after this)
                    self._committed(done)
                    if trio.current_time() >= next_hold:  # the retention floor, behind what is committed
                        await self.records.hold(done[-1][0].stored[-1].position)
                        next_hold = trio.current_time() + HOLD_EVERY
        finally:
            self.stats.state = "idle"
            self.stats.oldest_undelivered_ms = None  # a standby shows no lag of its own

    async def _next_in_order(
        self, client: httpx.AsyncClient, term: TermContext, units: trio.MemoryReceiveChannel[Unit]
    ) -> list[Done]:
        """The next unit, delivered or given up (``concurrency = 1``): one POST at a time."""
        try:
            unit = await units.receive()
        except trio.EndOfChannel:
            # The reader stops only when it fails or is cancelled (the term ends): let that
            # ending, already on its way, be what ends this task too.
            await trio.sleep_forever()
        outcome, detail = await self._deliver(client, unit, term)
        return [(unit, outcome, detail)]

    def _side_by_side(
        self, client: httpx.AsyncClient, term: TermContext, units: trio.MemoryReceiveChannel[Unit],
        nursery: trio.Nursery,
    ) -> Callable[[], Awaitable[list[Done]]]:  # fmt: skip
        """Up to ``concurrency`` units delivered side by side; the returned function answers the
        next finished prefix (the position moves over nothing still in flight)."""
        window = Window()
        slots = trio.Semaphore(self.concurrency)
        outcomes: dict[str, Done] = {}
        done_send, done_recv = trio.open_memory_channel[None](float("inf"))

        async def deliver(unit: Unit) -> None:
            outcome, detail = await self._deliver(client, unit, term)
            outcomes[unit.key] = (unit, outcome, detail)
            window.finished(unit.key, outcome)
            slots.release()
            done_send.send_nowait(None)

        async def dispatch() -> None:
            async with units:
                async for unit in units:
                    await slots.acquire()
                    window.opened(unit.key)
                    nursery.start_soon(deliver, unit)

        nursery.start_soon(dispatch)

        async def next_done() -> list[Done]:
            while True:
                await done_recv.receive()
                finished = window.take_done()
                if finished:
                    return [outcomes.pop(key) for key, _ in finished]

        return next_done

    def _committed(self, done: Sequence[tuple[Unit, str, dict[str, Any]]]) -> None:
        self._delivered_through = done[-1][0].stored[-1].position
        for _ in done:
            if self._waiting:
                self._waiting.popleft()
        self.stats.oldest_undelivered_ms = self._waiting[0] if self._waiting else None
        for unit, outcome, _ in done:
            if outcome == DELIVERED:
                self.stats.delivered += len(unit.stored)
                self.stats.last_delivered_ms = unit.stored[-1].committed_ms
            else:
                self.stats.dead_letters += len(unit.stored)

    async def _read(self, position: str, units: trio.MemorySendChannel[Unit]) -> None:
        """Read the source job's records after ``position`` and hand them on as units, waiting at
        the end for more."""
        async with units:
            at_end = False  # the last read came short: the next record is waited for, not read for
            while True:
                if at_end:
                    # Wait for the next record (read again anyway after IDLE_WAIT), moving the
                    # retention floor up to what is committed meanwhile (a call only when it moved).
                    idle_until = trio.current_time() + IDLE_WAIT
                    while trio.current_time() < idle_until:
                        if self._delivered_through is not None:
                            await self.records.hold(self._delivered_through)
                        if await self.records.wait(position, HOLD_EVERY):
                            break
                page = await self.records.read(position, READ_PAGE)
                at_end = len(page) < READ_PAGE
                for i in range(0, len(page), self.batch):
                    unit = self._unit(page[i : i + self.batch], as_batch=self.batch > 1)
                    self._waiting.append(unit.stored[0].committed_ms)
                    if self.stats.oldest_undelivered_ms is None:
                        self.stats.oldest_undelivered_ms = unit.stored[0].committed_ms
                    await units.send(unit)
                if page:
                    position = page[-1].position

    def _unit(self, stored: Sequence[Stored], *, as_batch: bool) -> Unit:
        """What one POST carries: one record, or (``as_batch``) a JSON array of them."""
        bodies = []
        for s in stored:
            try:
                parsed = orjson.loads(s.record.body)
            except orjson.JSONDecodeError:
                parsed = {}
            record = parsed if isinstance(parsed, dict) else {}
            when = event_time(record) or _iso(s.committed_ms)
            bodies.append(envelope(event_type(self.from_kind, record), when, s.record.body))
        first, last = stored[0].record.paging_token, stored[-1].record.paging_token
        if not as_batch:
            return Unit(tuple(stored), message_id(self.from_job, first), bodies[0].encode())
        return Unit(tuple(stored), message_id(self.from_job, first, last), f"[{','.join(bodies)}]".encode())

    # -- one unit, until it is delivered or given up ----------------------------------------------

    async def _deliver(
        self, client: httpx.AsyncClient, unit: Unit, term: TermContext
    ) -> tuple[str, dict[str, Any]]:
        failures = 0
        first_failure = 0.0
        first_attempt = time.time()
        while True:
            await self._while_disabled(term)
            paused_for = await self._while_paused()
            first_failure += paused_for  # (the retry schedule's age counts no time paused)
            attempt = await self._post(client, unit, term.token)
            label = outcome_label(attempt.status, attempt.error)
            self.stats.attempts[label] = self.stats.attempts.get(label, 0) + 1
            verdict = judge(attempt.status)
            await self._keep_attempt(term, unit, attempt, label, delivered=verdict == DELIVERED)
            if verdict == DELIVERED:
                if failures or self._delivery == "failing":
                    # the endpoint answers again: said once, not per record
                    await self._set_endpoint(term, state="ok", attempts="0", last_status=str(attempt.status))
                    self.log.info("webhook-recovered", record=unit.key, attempts=failures + 1)
                    self._delivery = "ok"
                    self._show()
                return DELIVERED, {}
            if verdict == GONE:
                self._disabled = True
                self._show()
                self.log.error("webhook-endpoint-disabled", url=self.url, record=unit.key, status=410,
                               answer=attempt.excerpt)  # fmt: skip
                await self._set_endpoint(term, state="disabled", last_status="410", disabled_at_ms=_now_ms())
                continue
            failures += 1
            now = trio.current_time()
            if failures == 1:
                first_failure = now
            exhausted = self.schedule.exhausted(failures, now - first_failure)
            if exhausted and self.on_exhausted == "dead-letter":
                detail = {
                    "attempts": failures, "status": attempt.status, "error": attempt.error,
                    "answer": attempt.excerpt, "first_attempt_at": _iso(int(first_attempt * 1000)),
                    "last_attempt_at": _iso(_now_ms()),
                }  # fmt: skip
                self.log.error("webhook-dead-lettered", record=unit.key, records=len(unit.stored),
                               **{k: v for k, v in detail.items() if k != "answer"})  # fmt: skip
                return "dead", detail
            if exhausted:  # on_exhausted = "block": on at the schedule's last interval, in order
                delay = self.schedule.delays[-1] if self.schedule.delays else 1.0
                delay = max(delay, attempt.retry_after or 0.0)
            else:
                delay = self.schedule.delay(failures, self.rng.random(), attempt.retry_after) or 0.0
            self._delivery = "failing"
            self._show()
            self.log.warning(
                "webhook-failed", record=unit.key, attempt=failures, status=attempt.status,
                error=attempt.error, answer=attempt.excerpt, retry_in_s=round(delay, 3),
            )  # fmt: skip
            await self._set_endpoint(
                term, state="failing", attempts=str(failures), last_status=str(attempt.status or ""),
                last_error=attempt.error[:200], next_attempt_at_ms=str(_now_ms() + int(delay * 1000)),
                failing_record=unit.key,
            )  # fmt: skip
            await trio.sleep(delay)

    async def _post(self, client: httpx.AsyncClient, unit: Unit, token: int) -> Attempt:
        now = await self._clock.now()
        ts = int(now)
        headers = {
            "webhook-id": unit.msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(self.keys, unit.msg_id, ts, unit.body),
            "webhook-fencing-token": str(token),
        }
        status: int | None = None
        excerpt = b""
        retry_after: float | None = None
        started = trio.current_time()

        def took() -> int:
            return round(1000 * (trio.current_time() - started))

        with trio.move_on_after(self.timeout) as scope:  # the total timeout: a slow endpoint is cut
            try:
                async with client.stream("POST", self.url, content=unit.body, headers=headers) as resp:
                    status = resp.status_code
                    # Read the answer to its end when it is small (a connection whose answer was
                    # left unread is closed, not reused: every POST would connect anew), never
                    # more than EXCERPT_BYTES of it.
                    async for chunk in resp.aiter_raw():
                        excerpt += chunk
                        if len(excerpt) >= EXCERPT_BYTES:
                            break
                    if status in (429, 503):
                        retry_after = parse_retry_after(resp.headers.get("retry-after"), now)
            except httpx.HTTPError as exc:
                if status is None:
                    return Attempt(None, describe(exc), None, "", took())
        if scope.cancelled_caught and status is None:
            return Attempt(None, f"timed out: no answer within {self.timeout:g} s", None, "", took())
        ok = status is not None and 200 <= status < 300
        text = "" if ok else excerpt[:EXCERPT_BYTES].decode("utf-8", "replace")
        return Attempt(status, "" if status else "no answer", retry_after, text, took())

    # -- the endpoint's state and the operators' requests -----------------------------------------

    async def _set_endpoint(self, term: TermContext, **fields: Any) -> None:
        key = webhook_keys(self.job)["endpoint"]
        mapping = {k: str(v) for k, v in fields.items()} | {"updated_at_ms": str(_now_ms())}
        refused = await self.store.fenced_hset(term.node, term.token, key, mapping)
        if isinstance(refused, CommitRejected):
            raise TermFenced(refused.reason)

    async def _keep_attempt(
        self, term: TermContext, unit: Unit, attempt: Attempt, label: str, *, delivered: bool,
        replay: bool = False,
    ) -> None:  # fmt: skip
        """Keep the attempt in the job's ``attempts`` stream (fenced, the last ``ATTEMPTS_KEPT``),
        for the console and ``webhooks status``: every failed one, a delivered one at most once
        an ``ATTEMPT_SAMPLE`` (one Redis call a second at full speed, not one per POST)."""
        now = trio.current_time()
        if delivered and now - self._last_kept < ATTEMPT_SAMPLE:
            return
        if delivered:
            self._last_kept = now
        fields = {
            "record": unit.key, "records": str(len(unit.stored)), "outcome": label,
            "status": str(attempt.status or ""), "latency_ms": str(attempt.latency_ms),
            "error": attempt.error[:200], "answer": attempt.excerpt[:200], "replay": "1" if replay else "0",
        }  # fmt: skip
        try:
            refused = await self.store.fenced_audit(
                term.node, term.token, "attempt", fields, stream=webhook_keys(self.job)["attempts"],
                maxlen=ATTEMPTS_KEPT,
            )  # fmt: skip
        except RedisUnavailable:
            return  # a diagnostic: nothing depends on it, and the next commit tells of Redis
        if isinstance(refused, CommitRejected):
            raise TermFenced(refused.reason)

    def _show(self) -> None:
        """The state metrics, status and the console show: disabled over paused over ok/failing."""
        self.stats.state = "disabled" if self._disabled else "paused" if self._paused else self._delivery

    async def _while_paused(self) -> float:
        """Wait while an operator has paused delivery (``webhooks pause``, the console), until
        one resumes it: a request the leader carries out (fenced) in :meth:`_serve_requests`.
        Returns how long it waited."""
        started = trio.current_time()
        while self._paused:
            await self._resumed.wait()
        return trio.current_time() - started

    async def _operator_audit(
        self, term: TermContext, request: dict[str, str], summary: dict[str, Any]
    ) -> None:
        """The job's audit: what an operator asked, who, and what came of it (fenced)."""
        fields = {"action": str(summary.get("action", request.get("action", ""))),
                  "by": request.get("by", "")[:200], "request": request.get("id", ""),
                  "result": orjson.dumps(summary).decode()[:500]}  # fmt: skip
        refused = await self.store.fenced_audit(term.node, term.token, "operator-request", fields)
        if isinstance(refused, CommitRejected):
            raise TermFenced(refused.reason)

    async def _while_disabled(self, term: TermContext) -> None:
        """Wait while the endpoint is disabled (410 Gone), until an operator enables it again
        (``ingestion webhooks enable``: a request the leader carries out, fenced)."""
        while self._disabled:
            if await self._enable_requested(term):
                return
            await trio.sleep(DISABLED_POLL)

    async def _enable_requested(self, term: TermContext) -> bool:
        keys = webhook_keys(self.job)
        client = self.store.client
        raw, done = await self.store.run(
            lambda: client.hmget(keys["endpoint"], ["enable_requested_at_ms", "disabled_at_ms"])
        )
        if raw is None or int(_text(raw)) < int(_text(done or b"0")):
            return False
        await self._set_endpoint(term, state="ok", attempts="0")
        self._disabled, self._delivery = False, "ok"
        self._show()
        self.log.info("webhook-endpoint-enabled", url=self.url)
        return True

    # -- replays: what an operator asked for, carried out by the leader under its token ----------

    async def _serve_requests(self, client: httpx.AsyncClient, term: TermContext) -> None:
        """Carry out the operators' requests (``ingestion webhooks replay``), one at a time, in
        the order asked, beside the ordinary delivery; each is recorded done (fenced) once over."""
        keys = webhook_keys(self.job)
        redis_client = self.store.client
        while True:
            done = await self.store.run(lambda: redis_client.hget(keys["endpoint"], "requests_done"))
            after = _text(done) if done else "0-0"
            pending: Any = await self.store.run(
                lambda after=after: redis_client.xrange(keys["requests"], f"({after}", "+", count=1)
            )
            if not pending:
                await trio.sleep(REQUESTS_EVERY)
                continue
            request_id, fields = pending[0]
            request = {_text(k): _text(v) for k, v in (fields or {}).items()}
            rid = _text(request_id)
            action = request.get("action")
            summary: dict[str, Any]
            if action == "enable":
                if self._disabled:
                    await self._set_endpoint(term, enable_requested_at_ms=str(_now_ms()))
                summary = {"action": "enable"}
            elif action in ("pause", "resume"):
                pause = action == "pause"
                changed = pause != self._paused
                await self._set_endpoint(term, paused="1" if pause else "0")
                if pause and not self._paused:
                    self._resumed = trio.Event()  # (a second pause keeps the waiters' event)
                    self._paused = True
                elif not pause and self._paused:
                    self._paused = False
                    self._resumed.set()
                self._show()
                summary = {"action": action, "changed": changed}
            elif self._paused:
                # (waiting here for a resume would hold up the resume itself: requests are
                # carried out one at a time, in order)
                summary = {"action": "replay", "sent": 0, "failed": 0,
                           "refused": "the endpoint is paused: resume it, then ask again"}  # fmt: skip
            else:
                summary = await self._replay(client, term, request)
            await self._set_endpoint(
                term, requests_done=rid, last_request=orjson.dumps({"id": rid, **summary}).decode()
            )
            await self._operator_audit(term, {**request, "id": rid}, summary)
            self.log.info("webhook-request-done", request=rid, by=request.get("by", ""), **summary)

    async def _replay(
        self, client: httpx.AsyncClient, term: TermContext, request: dict[str, str]
    ) -> dict[str, Any]:
        if request.get("dead_letters") == "1":
            return await self._replay_dead_letters(client, term)
        start, end = request.get("from", "0"), request.get("to", "")
        sent = failed = 0
        position = await self._replay_start(start)
        end_key = token_key(end) if end and not end.startswith("time:") else None
        end_ms = int(end[5:]) if end.startswith("time:") else None
        while True:
            page = await self.records.read(position, READ_PAGE)
            for stored in page:
                if (end_key is not None and token_key(stored.record.paging_token) > end_key) or (
                    end_ms is not None and stored.committed_ms > end_ms
                ):
                    return {"action": "replay", "from": start, "to": end, "sent": sent, "failed": failed}
                if await self._replay_one(client, term, self._unit([stored], as_batch=False)):
                    sent += 1
                else:
                    failed += 1
            if len(page) < READ_PAGE:
                return {"action": "replay", "from": start, "to": end, "sent": sent, "failed": failed}
            position = page[-1].position

    async def _replay_start(self, start: str) -> str:
        """The store position before the first record a replay sends: ``time:<ms>`` (records
        committed at or after), or a record id / ledger bound (records at or after it)."""
        if start.startswith("time:"):
            if not hasattr(self.records, "position_at"):
                raise ValueError("replay --from TIME needs the source job's Redis stream")
            return await self.records.position_at(int(start[5:]))  # type: ignore[attr-defined, no-any-return]
        return await self.records.locate(start, inclusive=True)

    async def _replay_one(self, client: httpx.AsyncClient, term: TermContext, unit: Unit) -> bool:
        """One record of a replay: tried along the schedule, given up (not dead-lettered again)
        when it is exhausted."""
        failures = 0
        while True:
            attempt = await self._post(client, unit, term.token)
            label = outcome_label(attempt.status, attempt.error)
            delivered = judge(attempt.status) == DELIVERED
            await self._keep_attempt(term, unit, attempt, label, delivered=delivered, replay=True)
            if delivered:
                return True
            failures += 1
            delay = self.schedule.delay(failures, self.rng.random(), attempt.retry_after)
            if delay is None or judge(attempt.status) == GONE:
                self.log.warning(
                    "webhook-replay-failed", record=unit.key, status=attempt.status, error=attempt.error
                )
                return False
            await trio.sleep(delay)

    async def _replay_dead_letters(self, client: httpx.AsyncClient, term: TermContext) -> dict[str, Any]:
        keys = webhook_keys(self.job)
        events = self.store.keys["events"]
        redis_client = self.store.client
        replayed = await self.store.run(lambda: redis_client.hgetall(keys["replayed"]))
        done = {_text(k) for k in replayed}
        sent = failed = 0
        after = "-"
        while True:
            rows: Any = await self.store.run(
                lambda after=after: redis_client.xrange(events, after, "+", count=READ_PAGE)
            )
            for entry_id, fields in rows:
                f = {_text(k): _text(v) for k, v in fields.items()}
                if f["paging_token"] in done:
                    continue
                letter = orjson.loads(f["record"])
                body = (
                    letter["record"]
                    if isinstance(letter["record"], str)
                    else orjson.dumps(letter["record"]).decode()
                )
                stored = Stored("", _stream_ms_of(_text(entry_id)), Record(f["paging_token"], body))
                if await self._replay_one(client, term, self._unit([stored], as_batch=False)):
                    sent += 1
                    refused = await self.store.fenced_hset(
                        term.node, term.token, keys["replayed"], {f["paging_token"]: str(_now_ms())}
                    )
                    if isinstance(refused, CommitRejected):
                        raise TermFenced(refused.reason)
                else:
                    failed += 1
            if len(rows) < READ_PAGE:
                return {"action": "replay-dead-letters", "sent": sent, "failed": failed}
            after = f"({_text(rows[-1][0])}"


@contextlib.asynccontextmanager
async def _plain_errors() -> AsyncIterator[None]:
    """A failure of one of the term's tasks as the Ingestor knows it, not wrapped in the nursery's
    group: a fenced write refused ends the term as ``fenced``, Redis or the source job's sink not
    answering as ``commit-unknown``, never the node. Anything else (a bug) goes on as it is."""
    try:
        yield
    except BaseExceptionGroup as group:
        for kind in (TermFenced, RedisUnavailable, SinkUnavailable):
            matched, _rest = group.split(kind)
            if matched is not None:
                leaf: BaseException = matched
                while isinstance(leaf, BaseExceptionGroup):
                    leaf = leaf.exceptions[0]
                raise leaf from group
        raise


def _commit_batch(done: Sequence[Done]) -> Batch:
    """One commit for a finished prefix: the dead letters as the webhook job's records, and the
    position through the last unit (a cursor-only batch when everything was delivered)."""
    records: list[Record] = []
    for unit, outcome, detail in done:
        if outcome == DELIVERED:
            continue
        for s in unit.stored:
            entry = {
                "webhook_id": unit.msg_id, "source_id": s.record.paging_token,
                "record": orjson.loads(s.record.body) if s.record.body[:1] in ("{", "[") else s.record.body,
                **detail,
            }  # fmt: skip
            records.append(Record(s.record.paging_token, orjson.dumps(entry).decode()))
    last = done[-1][0].last
    through = None if records and token_key(records[-1].paging_token) == token_key(last) else last
    return Batch(tuple(records), through=through, committed=trio.Event())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat().replace("+00:00", "Z")


def _stream_ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
