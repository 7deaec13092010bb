"""The dead letters a webhook job holds, and the retention floor they keep on its source job.

A dead letter is an entry of the webhook job's own events stream (``ingestion:{JOB}:events``),
appended by the fenced commit that moves the delivery position past the record it names. It is
*held* until it is replayed (its record id in ``ingestion:{JOB}:replayed``) or dropped
(``ingestion webhooks drop-dead-letters``, which deletes it). While held:

- ``events.max_len`` never trims it: the webhook job's store is built without one;
- the source record it names stays in the source job's stream: the webhook job's consumer group
  there (its retention floor, :class:`~ingestion.webhook.records.StreamRecords`) never passes
  the oldest source record a held dead letter names. The commit script trims no entry a group
  still needs, so that record and every later one outlive ``events.max_len``.

Why this cannot release a held record, even with a stale leader about: held dead letters only
ever become resolved (replayed or dropped), never held again, and a new one always names a record
after the committed delivery position, which only moves forward. So a deliverer that has seen
fewer resolved dead letters keeps more; one that has not seen a dead letter committed after its
own last commit holds at most up to that commit, which is before it. Within a term, the dead
letters this node commits bound the floor at once (:meth:`DeadLetterHold.committed`), before any
hold that would pass them, and the floor is moved only once this term has read which dead letters
are held (:meth:`DeadLetterHold.keep`, retried every ``HOLD_EVERY`` until it holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import attrs
import trio

from actors.lease_store import LeaseStore, RedisUnavailable, batch
from actors.sink import SinkUnavailable
from ingestion.common.keyspace import dead_letter_keys
from ingestion.webhook.records import RecordStore

HOLD_EVERY = 1.0  # seconds between looks at the retention floor (a call only when it moves)
COUNT_EVERY = 5.0  # seconds between counts of the held dead letters (one call)
SCAN_PAGE = 500  # dead letters read at a time when looking for the oldest held one


class HeldCount(Protocol):
    """Where the count of held dead letters is shown (``WebhookStats``: the metrics read it)."""

    dead_letters_held: int | None


class Holder(Protocol):
    """What :meth:`DeadLetterHold.of` reads of a webhook job's source."""

    @property
    def job(self) -> str: ...
    @property
    def store(self) -> LeaseStore: ...
    @property
    def records(self) -> RecordStore: ...
    @property
    def stats(self) -> HeldCount: ...
    @property
    def log(self) -> Any: ...
    @property
    def max_dead_letters(self) -> int: ...


@attrs.define
class DeadLetterHold:
    """The held dead letters of webhook job ``job`` (its own ``store``): counted into ``stats``,
    and the source records they name kept from retention on ``records``."""

    job: str
    store: LeaseStore
    records: RecordStore
    stats: HeldCount
    log: Any
    bound: int = 0  # ``max_dead_letters`` (0: none)
    _scan_from: str = attrs.field(default="-", init=False)  # every dead letter before it is resolved
    # the oldest held dead letter: (its entry id, its record's source position)
    _oldest: tuple[str, str | None] | None = attrs.field(default=None, init=False)
    # (dead letters, replayed, the first one's id) at the last look
    _counts: tuple[int, int, str] | None = attrs.field(default=None, init=False)
    # the source position retention keeps from (None: nothing held)
    _keep: str | None = attrs.field(default=None, init=False)
    _known: bool = attrs.field(default=False, init=False)  # this term has read the held dead letters
    # the first dead letter committed since the last look began
    _fresh: str | None = attrs.field(default=None, init=False)
    _full_said: bool = attrs.field(default=False, init=False)
    _hold_said: bool = attrs.field(default=False, init=False)  # a failed hold said this term

    @classmethod
    def of(cls, source: Holder) -> DeadLetterHold:
        """The dead letters of webhook job ``source``."""
        s = source
        return cls(s.job, s.store, s.records, s.stats, s.log, s.max_dead_letters)

    def _start_term(self) -> None:
        self.records.forget()
        self._known, self._counts, self._fresh, self._keep = False, None, None, None
        self._hold_said = False
        self.stats.dead_letters_held = None

    def committed(self, positions: Sequence[str]) -> None:
        """Dead letters naming the source records at ``positions`` (in order) were just committed:
        keep them from retention before anything holds past them."""
        if not positions:
            return
        if self._fresh is None:
            self._fresh = positions[0]
        if self._known and self._keep is None:  # (not known yet: the first look counts it)
            self._keep = positions[0]
            self.records.keep_from(self._keep)
        if self.stats.dead_letters_held is not None:
            self.stats.dead_letters_held += len(positions)

    def full(self) -> bool:
        """Whether ``bound`` dead letters are held: a record whose schedule is over then waits
        (as with ``on_exhausted = "block"``) until some are replayed or dropped."""
        held = self.stats.dead_letters_held
        full = self.bound > 0 and held is not None and held >= self.bound
        if full and not self._full_said:
            self.log.warning("webhook-dead-letters-full", held=held, max_dead_letters=self.bound)
        self._full_said = full
        return full

    async def keep(
        self, floor: Callable[[], str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Keep the source job's retention floor at ``floor()`` (the last record whose outcome
        is committed), never past a record a held dead letter names; count the held ones. Every
        ``HOLD_EVERY``, whatever failed before, until the term ends. Started first in the term,
        and ready once the floor holds: nothing is read for delivery before (what is read could
        otherwise be trimmed before it is delivered or dead-lettered)."""
        self._start_term()
        next_count = trio.current_time()
        try:
            while True:
                if not self._known or trio.current_time() >= next_count:
                    try:
                        await self._look()
                        next_count = trio.current_time() + COUNT_EVERY
                    except (RedisUnavailable, SinkUnavailable) as exc:
                        self.log.debug("webhook-dead-letters-unread", error=str(exc))
                held = self._known and await self.records.hold(floor())
                if held and task_status is not None:
                    task_status.started()
                    task_status = None  # type: ignore[assignment]
                elif self._known and not held and task_status is not None and not self._hold_said:
                    # Nothing is delivered until the floor holds: said, once a term (a Redis
                    # that refuses XGROUP to this user, say, would otherwise stall it silently).
                    self._hold_said = True
                    self.log.warning("webhook-retention-hold-failed", floor=floor(),
                                     error="the source stream's retention floor could not be set; "
                                     "delivery waits for it (tried again every second)")  # fmt: skip
                await trio.sleep(HOLD_EVERY)
        finally:
            self.stats.dead_letters_held = None  # a standby shows none

    async def _look(self) -> None:
        """Count the held dead letters and find the oldest one's source record (a scan only when
        the counts moved)."""
        events, replayed = dead_letter_keys(self.job)
        client = self.store.client

        def add(pipe: Any) -> None:
            # (a drop deletes the oldest dead letters: the first id says so when the counts do not)
            pipe.xlen(events)
            pipe.hlen(replayed)
            pipe.xrange(events, "-", "+", count=1)

        def counts() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            add(pipe)
            return list(pipe.execute())

        self._fresh = None
        # The term's first look at once (delivery waits for it); the later ones on the node's
        # batch, one call a second for all its webhook jobs.
        if self._known:
            letters, done, first = await batch(client, self.store.call_timeout).call(add)
        else:
            letters, done, first = await self.store.run(counts)
        now = int(letters), int(done), _text(first[0][0]) if first else ""
        if now != self._counts or self._oldest is None:
            await self._find_oldest()
        oldest = self._oldest[1] if self._oldest else None
        self._keep = oldest if oldest is not None else self._fresh
        self.records.keep_from(self._keep)
        self._counts, self._known = now, True
        # (a replay that marks a dead letter dropped meanwhile leaves its id in ``replayed``: the
        # difference may then fall short, never below one while one is held)
        held = self._oldest is not None or self._fresh is not None
        self.stats.dead_letters_held = max(1, now[0] - now[1]) if held else 0

    async def _find_oldest(self) -> None:
        events, replayed = dead_letter_keys(self.job)
        client = self.store.client
        start = self._scan_from
        while True:
            rows: Any = await self.store.run(lambda s=start: client.xrange(events, s, "+", count=SCAN_PAGE))
            if not rows:
                self._oldest = None
                return
            tokens = [{_text(k): _text(v) for k, v in fields.items()}["paging_token"] for _id, fields in rows]
            marks: Any = await self.store.run(lambda t=tokens: client.hmget(replayed, t))
            for (entry_id, _fields), token, mark in zip(rows, tokens, marks, strict=True):
                if mark is None:
                    eid = _text(entry_id)
                    self._scan_from = eid
                    if self._oldest is None or self._oldest[0] != eid:
                        self._oldest = (eid, await self._source_position(token))
                    return
            self._scan_from = "(" + _text(rows[-1][0])
            if len(rows) < SCAN_PAGE:
                self._oldest = None
                return

    async def _source_position(self, token: str) -> str | None:
        """Where the record ``token`` is in the source job's store (or the first record after it,
        should it be gone); None when there is nothing to keep there."""
        if not self.records.retains:
            return None
        before = await self.records.locate(token, inclusive=True)
        page = await self.records.read(before, 1)
        return page[0].position if page else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
