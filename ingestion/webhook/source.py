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

Operators' requests (``ingestion webhooks replay|enable|pause|resume``) arrive in the job's
``requests`` stream; the leader carries them out under its token, beside delivery, and records them
done in the ``endpoint`` hash (:mod:`ingestion.webhook.requests`).
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
from ingestion.common.keyspace import webhook_keys
from ingestion.common.redact import redact
from ingestion.common.retry import parse_retry_after
from ingestion.webhook.core import (
    DELIVERED,
    EXCERPT_BYTES,
    GONE,
    PROBE_MAX,
    RetryPacing,
    RetrySchedule,
    Window,
    event_time,
    event_type,
    judge,
    message_id,
    outcome_label,
    post_body,
    sign,
)
from ingestion.webhook.dead_letters import DeadLetterHold
from ingestion.webhook.records import RecordStore, Stored
from ingestion.webhook.requests import RequestServing

USER_AGENT = "ingestion-webhooks/1"
READ_PAGE = 1000  # records read from the source job's store at a time
IDLE_WAIT = 5.0  # seconds an idle reader waits for the next record before it reads again anyway
ATTEMPTS_KEPT = 200  # recent attempts kept in the job's attempts stream (approximately)
ATTEMPT_SAMPLE = 1.0  # seconds: every failed attempt is kept, a delivered one at most this often
CLOCK_REFRESH = 30.0  # seconds between reads of Redis's clock (carried by the monotonic clock between)
CLOCK_RETRY = 0.1  # seconds between reads of Redis's clock while the node has none
SKEW_WARN = 5.0  # seconds: a node's wall clock further off Redis's than this is logged, once per term


@attrs.define
class ServerClock:
    """The wall clock a signature's ``webhook-timestamp`` is taken from: Redis's ``TIME``, carried
    forward by the node's monotonic clock between reads (every :data:`CLOCK_REFRESH` s).

    Receivers refuse a timestamp more than a few minutes off their own clock (``standardwebhooks``:
    five), so a node whose wall clock is wrong (an NTP step, a VM restored from a snapshot) would
    sign every POST in a way the endpoint rejects (401), and delivery would stall for as long as it
    led. Every node of a deployment shares Redis's clock, whatever its own says. The node's own wall
    clock never stands in: until Redis has answered once, :meth:`now` waits for its answer (asking
    again every :data:`CLOCK_RETRY` s; the term's deadline bounds the wait, and Redis out of reach
    holds delivery up anyway), and a reading that is due but fails leaves the last one carrying on.
    """

    read: Callable[[], Awaitable[float]]  # Redis's TIME in seconds
    log: Any
    _anchor: tuple[float, float] | None = None  # (Redis seconds, trio time at that reading)
    _due: bool = True  # read Redis's clock before the next signature
    _warned: bool = False

    async def now(self) -> float:
        while True:
            before = trio.current_time()
            if self._due or self._anchor is None or before - self._anchor[1] >= CLOCK_REFRESH:
                try:
                    server = await self.read()
                except RedisUnavailable:
                    if self._anchor is None:  # no reading yet: this node's own clock may be wrong
                        await trio.sleep(CLOCK_RETRY)
                        continue
                else:
                    self._anchor = (server, (before + trio.current_time()) / 2)
                    self._due = False
                    skew = time.time() - server
                    if abs(skew) > SKEW_WARN and not self._warned:
                        self._warned = True
                        self.log.warning("wall-clock-skew", skew_s=round(skew, 1), signing_with="redis")
            assert self._anchor is not None
            return self._anchor[0] + trio.current_time() - self._anchor[1]

    def reset(self) -> None:
        """A new term: read Redis's clock again before the first signature (say a skew again); the
        last reading, carried by the monotonic clock, stands until then."""
        self._due = True
        self._warned = False


@attrs.define
class WebhookStats:
    """What the node's metrics and status show of one webhook job (this node's view)."""

    delivered: int = 0  # records acknowledged (2xx) and committed
    attempts: dict[str, int] = attrs.Factory(dict)  # by outcome: 2xx, 3xx, 4xx, 429, 5xx, timeout, error
    dead_letters: int = 0
    dead_letters_held: int | None = None  # not replayed or dropped (None: not leading, or not read yet)
    state: str = "idle"  # idle (not leading), ok, failing, disabled
    oldest_undelivered_ms: int | None = None  # commit time of the next record to deliver
    last_delivered_ms: int | None = None

    def lag_seconds(self, now_ms: int) -> float:
        if self.oldest_undelivered_ms is None:
            return 0.0
        return max(0.0, (now_ms - self.oldest_undelivered_ms) / 1000)


@attrs.frozen
class Unit:
    """What one POST carries: one record, or a batch of records (a JSON array); its body is made
    per POST (:func:`~ingestion.webhook.core.post_body`: the sending term's token inside, signed)."""

    stored: tuple[Stored, ...]
    msg_id: str
    payloads: tuple[tuple[str, str, str, str], ...]  # each record's type, timestamp, own id, JSON
    as_batch: bool = False

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
class WebhookSource(RequestServing):
    """Deliver the records of ``from_job`` (of kind ``from_kind``), read from ``records``, to
    ``url``; ``store`` is the webhook job's own lease store (fenced writes of its endpoint state)."""

    job: str
    from_job: str
    from_kind: str
    records: RecordStore
    store: LeaseStore
    url: str = attrs.field(repr=redact)
    keys: tuple[bytes, ...] = attrs.field(repr=False)  # the signing keys: never in a repr or a log
    schedule: RetrySchedule
    log: Any
    on_exhausted: str = "dead-letter"
    max_dead_letters: int = 0  # held at most (0: no bound); at the bound a spent record blocks
    batch: int = 1
    concurrency: int = 1
    connect_timeout: float = 2.0
    timeout: float = 15.0
    verify: ssl.SSLContext | bool = attrs.Factory(ssl_context)  # one context per process (http.py)
    stats: WebhookStats = attrs.Factory(WebhookStats)
    rng: random.Random = attrs.Factory(random.Random)
    probe_max: float = PROBE_MAX  # seconds: the longest wait between a failing record's probes
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
    _dead: DeadLetterHold = attrs.field(init=False, default=attrs.Factory(DeadLetterHold.of, takes_self=True))

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
                self._dead = DeadLetterHold.of(self)  # (of this term's records store)
                await nursery.start(self._dead.keep, lambda: self._delivered_through or position)
                nursery.start_soon(self._read, position, units_send)
                nursery.start_soon(self._serve_requests, client, term)
                next_done: Callable[[], Awaitable[list[Done]]]
                if self.concurrency == 1:
                    next_done = functools.partial(self._next_in_order, client, term, units_recv)
                else:
                    next_done = self._side_by_side(client, term, units_recv, nursery)
                while True:
                    done = await next_done()
                    batch = _commit_batch(done)
                    yield batch
                    assert batch.committed is not None
                    await batch.committed.wait()  # (in order: the next POST only after this)
                    self._committed(done)
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
                self._dead.committed([s.position for s in unit.stored])

    async def _read(self, position: str, units: trio.MemorySendChannel[Unit]) -> None:
        """Read the source job's records after ``position`` and hand them on as units, waiting at
        the end for more."""
        async with units:
            at_end = False  # the last read came short: the next record is waited for, not read for
            while True:
                if at_end:
                    # Wait for the next record (read again anyway after IDLE_WAIT); the retention
                    # floor follows what is committed meanwhile (DeadLetterHold.keep, every second).
                    await self.records.wait(position, IDLE_WAIT)
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
        payloads = []
        for s in stored:
            try:
                parsed = orjson.loads(s.record.body)
            except orjson.JSONDecodeError:
                parsed = {}
            record = parsed if isinstance(parsed, dict) else {}
            when = event_time(record) or _iso(s.committed_ms)
            own_id = message_id(self.from_job, s.record.paging_token)
            payloads.append((event_type(self.from_kind, record), when, own_id, s.record.body))
        first, last = stored[0].record.paging_token, stored[-1].record.paging_token
        msg_id = message_id(self.from_job, first, last if as_batch else None)
        return Unit(tuple(stored), msg_id, tuple(payloads), as_batch)

    # -- one unit, until it is delivered or given up ----------------------------------------------

    async def _deliver(
        self, client: httpx.AsyncClient, unit: Unit, term: TermContext
    ) -> tuple[str, dict[str, Any]]:
        pacing = RetryPacing(self.schedule, self.probe_max)
        first_attempt = time.time()
        while True:
            await self._while_disabled(term)
            pacing.paused(await self._while_paused())  # (the schedule's age counts no time paused)
            attempt = await self._post(client, unit, term.token)
            label = outcome_label(attempt.status, attempt.error)
            self.stats.attempts[label] = self.stats.attempts.get(label, 0) + 1
            verdict = judge(attempt.status)
            await self._keep_attempt(term, unit, attempt, label, delivered=verdict == DELIVERED)
            if verdict == DELIVERED:
                if pacing.failures or self._delivery == "failing":
                    # the endpoint answers again: said once, not per record
                    await self._set_endpoint(term, state="ok", attempts="0", last_status=str(attempt.status))
                    self.log.info("webhook-recovered", record=unit.key, attempts=pacing.failures + 1)
                    self._delivery = "ok"
                    self._show()
                return DELIVERED, {}
            if verdict == GONE:
                await self._gone(term, unit, attempt)  # (disabled, until an enable)
                continue
            delay = pacing.failed(trio.current_time(), self.rng.random(), attempt.retry_after)
            failures = pacing.failures
            if pacing.exhausted and self.on_exhausted == "dead-letter" and not self._dead.full():
                detail = {
                    "attempts": failures, "status": attempt.status, "error": attempt.error,
                    "answer": attempt.excerpt, "first_attempt_at": _iso(int(first_attempt * 1000)),
                    "last_attempt_at": _iso(_now_ms()),
                }  # fmt: skip
                self.log.error("webhook-dead-lettered", record=unit.key, records=len(unit.stored),
                               **{k: v for k, v in detail.items() if k != "answer"})  # fmt: skip
                return "dead", detail
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
        body = post_body(unit.payloads, token, as_batch=unit.as_batch)  # the fence inside what is signed
        headers = {
            "webhook-id": unit.msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(self.keys, unit.msg_id, ts, body),
            "webhook-fencing-token": str(token),  # a convenience, unsigned: receivers use the body's
        }
        status: int | None = None
        excerpt = b""
        retry_after: float | None = None
        started = trio.current_time()

        def took() -> int:
            return round(1000 * (trio.current_time() - started))

        with trio.move_on_after(self.timeout) as scope:  # the total timeout: a slow endpoint is cut
            try:
                async with client.stream("POST", self.url, content=body, headers=headers) as resp:
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
                "record": _as_json(s.record.body),
                **detail,
            }  # fmt: skip
            records.append(Record(s.record.paging_token, orjson.dumps(entry).decode()))
    last = done[-1][0].last
    through = None if records and token_key(records[-1].paging_token) == token_key(last) else last
    return Batch(tuple(records), through=through, committed=trio.Event())


def _as_json(body: str) -> Any:
    """A record's body as the dead letter keeps it: its JSON when it is JSON, else the text as it
    is (a malformed body must not fail every term that reaches it: a poison pill)."""
    if body[:1] in ("{", "["):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return body


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat().replace("+00:00", "Z")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
