"""The webhook job's operators' requests (``ingestion webhooks replay|enable|pause|resume``, the
console): read from the job's ``requests`` stream and carried out by its leader under its token,
each recorded done in the ``endpoint`` hash and audited.

:class:`RequestServing` is a part of :class:`~ingestion.webhook.source.WebhookSource` (its base
class), kept in a module of its own: it shares the term's endpoint state (paused, disabled) with
delivery, which waits on it (:meth:`RequestServing._while_paused`, ``_while_disabled``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import trio

from actors.cursor_order import token_key
from actors.lease_store import CommitRejected
from actors.source import Record, TermContext, TermFenced
from ingestion.webhook.core import DELIVERED, GONE, judge, outcome_label, webhook_keys
from ingestion.webhook.records import Stored

if TYPE_CHECKING:
    import random

    from actors.lease_store import LeaseStore
    from ingestion.webhook.core import RetrySchedule
    from ingestion.webhook.records import RecordStore

READ_PAGE = 1000  # records read from the source job's store at a time
REQUESTS_EVERY = 1.0  # seconds between looks at the operators' requests while delivering
DISABLED_POLL = 1.0  # seconds between looks while the endpoint is disabled


class RequestServing:
    """The operators' requests, carried out by the leader: a base of ``WebhookSource``, whose
    attributes and methods named below it uses."""

    if TYPE_CHECKING:
        job: str
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

    async def _replay_one(self, client: httpx.AsyncClient, term: TermContext, unit: Any) -> bool:
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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stream_ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
