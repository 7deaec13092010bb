"""The webhook job's operators' requests (``ingestion webhooks replay|enable|pause|resume``, the
console): read from the job's ``requests`` stream and carried out by its leader under its token,
each recorded done in the ``endpoint`` hash and audited.

:class:`RequestServing` is a part of :class:`~ingestion.webhook.source.WebhookSource` (its base
class), kept in a module of its own: it shares the term's endpoint state (paused, disabled) with
delivery, which waits on it (:meth:`RequestServing._while_paused`, ``_while_disabled``).
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import orjson
import trio
from redis.client import NEVER_DECODE

from actors.cursor_order import token_key
from actors.lease_store import CommitRejected, RedisUnavailable, batch
from actors.sink import SinkUnavailable
from actors.source import Record, TermContext, TermFenced
from ingestion.common.keyspace import webhook_keys
from ingestion.webhook.core import DELIVERED, GONE, RetrySchedule, judge, outcome_label
from ingestion.webhook.records import Stored

if TYPE_CHECKING:
    import random

    from actors.lease_store import LeaseStore
    from ingestion.webhook.records import RecordStore

READ_PAGE = 1000  # records read from the source job's store at a time
# The operators' requests are looked at on the node's batch (actors/lease_store/batch.py): every
# second, one call for all the node's webhook jobs.
# A replayed record's retries: it failed before and an operator is watching, so a short schedule
# (4 attempts over about 36 s, each wait jittered by +-20 %; a Retry-After still wins), not the
# job's (27.6 h by default, which would hold every later replay up for a day).
REPLAY_SCHEDULE = RetrySchedule((1.0, 5.0, 30.0))


class RequestRefused(Exception):
    """A request the leader does not carry out, and why (the operator's words, in ``status``)."""

    def __init__(self, reason: str, outcome: str = "refused") -> None:
        super().__init__(reason)
        self.outcome = outcome  # the summary's key: refused, stopped, note


class ReplayStopped(RequestRefused):
    """A replay stopped part way (the endpoint paused, or disabled by a 410)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, "stopped")


@attrs.define(slots=False)  # (its subclass holds the attributes it names below)
class RequestServing:
    """The operators' requests, carried out by the leader: a base of ``WebhookSource``, whose
    attributes and methods named below it uses."""

    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)  # set at each state change
    # A 410 and an enable change the endpoint one at a time: an enable read between a 410's
    # ``_disabled`` and its Redis stamp would pass the stamp's check and be undone by the 410's write.
    _disabling: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    if TYPE_CHECKING:
        job: str
        from_job: str
        records: RecordStore
        store: LeaseStore
        url: str
        schedule: RetrySchedule
        log: Any
        rng: random.Random
        _delivery: str
        _disabled: bool
        _paused: bool
        _resumed: trio.Event
        _clock: Any  # source.py's ServerClock (that module imports this one)

        async def _set_endpoint(self, term: TermContext, **fields: Any) -> None: ...
        def _show(self) -> None: ...
        # (a unit and an attempt are source.py's ``Unit`` and ``Attempt``: that module imports this one)
        async def _post(self, client: httpx.AsyncClient, unit: Any, token: int) -> Any: ...
        def _unit(self, stored: list[Stored], *, as_batch: bool) -> Any: ...
        async def _keep_attempt(
            self, term: TermContext, unit: Any, attempt: Any, label: str, *, delivered: bool,
            replay: bool = False,
        ) -> None: ...  # fmt: skip

    async def _while_paused(self) -> float:
        """Wait while an operator has paused delivery (``webhooks pause``, the console), until
        one resumes it: a request the leader carries out (fenced) in :meth:`_serve_requests`.
        Returns how long it waited."""
        started = trio.current_time()
        while self._paused:
            await self._resumed.wait()
        return trio.current_time() - started

    async def _while_disabled(self, term: TermContext) -> None:
        """Wait while the endpoint is disabled (410 Gone), until an operator enables it again
        (``ingestion webhooks enable``: a request the leader carries out, fenced)."""
        while self._disabled:
            await self._changed.wait()

    def _state_changed(self) -> None:
        """Wake whoever waits on the endpoint's state (paused, disabled): delivery, a replay."""
        self._show()
        self._changed.set()
        self._changed = trio.Event()

    async def _gone(self, term: TermContext, unit: Any, attempt: Any) -> None:
        """A 410 answer: the endpoint is disabled, at Redis's time (an enable asked after it, by
        the request's id, which is Redis's clock too, enables it again)."""
        async with self._disabling:
            self._disabled = True
            self._state_changed()
            self.log.error("webhook-endpoint-disabled", url=self.url, record=unit.key, status=410,
                           answer=attempt.excerpt)  # fmt: skip
            disabled_at = int(await self._clock.now() * 1000)  # (the former disabled_at_ms: a node's own)
            await self._set_endpoint(
                term, state="disabled", last_status="410", disabled_at_redis_ms=disabled_at
            )

    # -- the requests: read in order, carried out in two lanes ------------------------------------

    async def _serve_requests(self, client: httpx.AsyncClient, term: TermContext) -> None:
        """Carry out the operators' requests beside delivery, each recorded done (fenced) once
        over: pause, resume and enable at once, in the order asked; replays in the order asked,
        one at a time, in a lane of their own, so that a long replay holds none of the others up.
        Each lane keeps its own mark in the ``endpoint`` hash (``controls_done``,
        ``replays_done``); a request that fails is recorded done with its error, never again."""
        keys = webhook_keys(self.job)
        redis_client = self.store.client
        marks = await self.store.run(
            lambda: redis_client.hmget(keys["endpoint"], ["requests_done", "controls_done", "replays_done"])
        )
        # what ``webhooks status`` shows where no configuration names the job (no secret: the
        # endpoint's origin only, as a path may hold a token)
        await self._set_endpoint(term, **{"from": self.from_job, "origin": _origin(self.url)})
        legacy = _text(marks[0]) if marks[0] else "0-0"  # (one mark for both, before the lanes)
        controls_done = _text(marks[1]) if marks[1] else legacy
        replays_done = _text(marks[2]) if marks[2] else legacy
        seen = min(controls_done, replays_done, key=stream_id_key)
        replays: collections.deque[tuple[str, dict[str, str]]] = collections.deque()
        queued = trio.Event()

        async def replay_lane() -> None:
            nonlocal queued
            while True:
                while not replays:
                    await queued.wait()
                    queued = trio.Event()
                rid, request = replays.popleft()
                summary: dict[str, Any] = {"action": "replay"}
                await self._carry_out(
                    rid, request, summary, functools.partial(self._replay, client, term, request, summary)
                )
                await self._request_done(term, rid, request, summary, replays_done=rid)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(replay_lane)
            looks = batch(redis_client, self.store.call_timeout)  # the node's jobs' looks, one call a tick
            while True:
                answers = await looks.call(functools.partial(_look_at_requests, keys["requests"], seen))
                pending: Any = answers[0]
                if not pending:
                    continue  # (the next look: the node's next tick)
                for request_id, fields in pending:
                    rid = seen = _text(request_id)
                    request = {_lenient(k): _lenient(v) for k, v in (fields or {}).items()}
                    if request.get("action") == "replay":
                        if stream_id_key(rid) > stream_id_key(replays_done):
                            replays.append((rid, request))
                            queued.set()
                    elif stream_id_key(rid) > stream_id_key(controls_done):
                        summary = {"action": request.get("action", "")}
                        work = functools.partial(self._control, term, rid, request, summary)
                        await self._carry_out(rid, request, summary, work)
                        await self._request_done(term, rid, request, summary, controls_done=rid)

    async def _carry_out(
        self, rid: str, request: dict[str, str], summary: dict[str, Any],
        work: Callable[[], Awaitable[None]],
    ) -> None:  # fmt: skip
        """Run one request's ``work``, which fills in ``summary``: a refusal, a stop or any
        failure (a bug, a request no leader can carry out) is said in it, never raised, so that
        one request can never end a term, nor every term after it (a poison pill). Only what
        ends the term anyway goes on: the token fenced, Redis or the source's store not
        answering (the next leader carries the request out again)."""
        try:
            await work()
        except RequestRefused as exc:
            summary[exc.outcome] = str(exc)
        except (TermFenced, RedisUnavailable, SinkUnavailable):
            raise
        except Exception as exc:
            summary["error"] = f"{type(exc).__name__}: {exc}"[:300]
            self.log.error("webhook-request-failed", request=rid, action=request.get("action", ""),
                           by=request.get("by", ""), error=summary["error"], exc_info=True)  # fmt: skip

    async def _request_done(
        self, term: TermContext, rid: str, request: dict[str, str], summary: dict[str, Any], **mark: str
    ) -> None:
        """Audit the request, then record it done (its lane's mark and its outcome), both fenced,
        and log it: a request shown done has its audit entry (a term cut off between the two
        leaves it to the next leader, which audits it again)."""
        outcome = orjson.dumps({"id": rid, "by": request.get("by", ""), **summary}).decode()
        fields: dict[str, Any] = {**mark, "last_request": outcome}
        if summary.get("action", "").startswith("replay"):
            fields["last_replay"] = outcome
        await self._operator_audit(term, {**request, "id": rid}, summary)
        await self._set_endpoint(term, **fields)
        self.log.info("webhook-request-done", request=rid, by=request.get("by", ""), **summary)

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

    async def _enable(self, term: TermContext, rid: str, summary: dict[str, Any]) -> None:
        summary["changed"] = False
        if not self._disabled:
            raise RequestRefused("the endpoint is not disabled: nothing to enable", "note")
        disabled_at = await self.store.run(
            lambda: self.store.client.hget(webhook_keys(self.job)["endpoint"], "disabled_at_redis_ms")
        )
        if stream_id_key(rid)[0] < int(_text(disabled_at or b"0")):
            raise RequestRefused("asked before the endpoint was disabled (410): ask again")
        await self._set_endpoint(term, state="ok", attempts="0")
        self._disabled, self._delivery = False, "ok"
        self._state_changed()
        summary["changed"] = True
        self.log.info("webhook-endpoint-enabled", url=self.url)

    async def _control(
        self, term: TermContext, rid: str, request: dict[str, str], summary: dict[str, Any]
    ) -> None:
        """pause, resume, enable: the endpoint's state, changed at once (fenced)."""
        action = request.get("action")
        if action == "enable":
            async with self._disabling:
                await self._enable(term, rid, summary)
        elif action in ("pause", "resume"):
            pause = action == "pause"
            summary["changed"] = pause != self._paused
            await self._set_endpoint(term, paused="1" if pause else "0")
            if pause and not self._paused:
                self._resumed = trio.Event()  # (a second pause keeps the waiters' event)
                self._paused = True
            elif not pause and self._paused:
                self._paused = False
                self._resumed.set()
            self._state_changed()
        else:
            raise RequestRefused(f"unknown action {action!r}: replay, enable, pause or resume")

    # -- replays: what an operator asked for, carried out by the leader under its token ----------

    def _replay_barred(self, where: str) -> str | None:
        """Why a replay may not POST now (paused, or disabled by a 410), else None."""
        if self._paused:
            return f"the endpoint is paused{where}: resume it, then ask again"
        if self._disabled:
            return f"the endpoint is disabled by a 410 answer{where}: enable it, then ask again"
        return None

    async def _replay(
        self, client: httpx.AsyncClient, term: TermContext, request: dict[str, str], summary: dict[str, Any]
    ) -> None:
        """A replay, its figures kept in ``summary`` as it goes. Refused while the endpoint is
        paused or disabled; stopped (and said where) when it becomes so."""
        dead_letters = request.get("dead_letters") == "1"
        summary.update(action="replay-dead-letters" if dead_letters else "replay", sent=0, failed=0)
        if (barred := self._replay_barred("")) is not None:
            raise RequestRefused(barred)
        if dead_letters:
            await self._replay_dead_letters(client, term, summary)
            return
        start, end = request.get("from", "0"), request.get("to", "")
        summary.update({"from": start, "to": end})
        position = await self._replay_start(start)
        end_key = token_key(end) if end and not end.startswith("time:") else None
        end_ms = int(end[5:]) if end.startswith("time:") else None
        while True:
            page = await self.records.read(position, READ_PAGE)
            for stored in page:
                if (end_key is not None and token_key(stored.record.paging_token) > end_key) or (
                    end_ms is not None and stored.committed_ms > end_ms
                ):
                    return
                await self._replay_one(client, term, self._unit([stored], as_batch=False), summary)
            if len(page) < READ_PAGE:
                return
            position = page[-1].position

    async def _replay_start(self, start: str) -> str:
        """The store position before the first record a replay sends: ``time:<ms>`` (records
        committed at or after), or a record id / ledger bound (records at or after it)."""
        if start.startswith("time:"):
            if not hasattr(self.records, "position_at"):
                raise RequestRefused(
                    "replay --from TIME needs the source job's Redis stream (its records are in "
                    "PostgreSQL): replay from a record id or a ledger"
                )
            return await self.records.position_at(int(start[5:]))  # type: ignore[attr-defined, no-any-return]
        return await self.records.locate(start, inclusive=True)

    async def _replay_one(
        self, client: httpx.AsyncClient, term: TermContext, unit: Any, summary: dict[str, Any]
    ) -> bool:
        """One record of a replay: tried along :data:`REPLAY_SCHEDULE` (short: it failed before,
        and an operator is watching), given up (not dead-lettered again) when it is exhausted.
        A pause or a 410 stops the replay (:class:`ReplayStopped`) before the next POST."""
        failures = 0
        while True:
            if (barred := self._replay_barred(f" at record {unit.key}")) is not None:
                raise ReplayStopped(barred)
            attempt = await self._post(client, unit, term.token)
            label = outcome_label(attempt.status, attempt.error)
            verdict = judge(attempt.status)
            await self._keep_attempt(term, unit, attempt, label, delivered=verdict == DELIVERED, replay=True)
            if verdict == DELIVERED:
                summary["sent"] += 1
                return True
            if verdict == GONE:
                await self._gone(term, unit, attempt)
                continue  # (stopped, said where)
            failures += 1
            delay = REPLAY_SCHEDULE.delay(failures, self.rng.random(), attempt.retry_after)
            if delay is None:
                self.log.warning(
                    "webhook-replay-failed", record=unit.key, status=attempt.status, error=attempt.error
                )
                summary["failed"] += 1
                return False
            with trio.move_on_after(delay):  # (a pause or a 410 meanwhile: stop at once)
                while self._replay_barred("") is None:
                    await self._changed.wait()

    async def _replay_dead_letters(
        self, client: httpx.AsyncClient, term: TermContext, summary: dict[str, Any]
    ) -> None:
        keys = webhook_keys(self.job)
        events = self.store.keys["events"]
        redis_client = self.store.client
        replayed = await self.store.run(lambda: redis_client.hgetall(keys["replayed"]))
        done = {_text(k) for k in replayed}
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
                if await self._replay_one(client, term, self._unit([stored], as_batch=False), summary):
                    refused = await self.store.fenced_hset(
                        term.node, term.token, keys["replayed"], {f["paging_token"]: str(_now_ms())}
                    )
                    if isinstance(refused, CommitRejected):
                        raise TermFenced(refused.reason)
            if len(rows) < READ_PAGE:
                return
            after = f"({_text(rows[-1][0])}"


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}"


def stream_id_key(entry_id: str) -> tuple[int, int]:
    """A Redis stream entry id (``<ms>-<seq>``) as its order: Redis's clock, then a counter."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stream_ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _lenient(value: Any) -> str:
    """A request's field as text, whatever was written there (``redis-cli`` takes any bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _look_at_requests(key: str, seen: str, pipe: Any) -> None:
    """The requests after ``seen``, as bytes (``_lenient`` reads them), on the node's batch."""
    pipe.execute_command("XRANGE", key, f"({seen}", "+", "COUNT", 100, **{NEVER_DECODE: True})
