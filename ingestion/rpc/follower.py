"""The Stellar RPC follower: every decision of the ``getEvents`` source, with no I/O.

:class:`RpcFollower` says which request to send next (:meth:`RpcFollower.next_request`) and what each
answer means (:meth:`RpcFollower.on_result`, :meth:`RpcFollower.on_error`): a batch of events to
commit, a read-through cursor, how long to wait, whether to move to another URL, a history gap, or
a fatal error. :class:`~ingestion.rpc.source.RpcSource` carries the requests out.

Position. The follower always knows where it stands in one of three ways:

- ``OLDEST`` (start cursor ``"0"``): the oldest retained ledger is not known yet. The first request
  asks from ledger 1; the server answers "startLedger must be within the ledger range: O - L" and
  the follower starts at ledger O (the range error is the server's documented answer).
- ``LEDGER`` (start cursor ``N``, or after a skipped history gap): events from ledger N on.
- ``CURSOR``: events strictly after an event id or a scanned-through cursor (the committed cursor).

Pacing. A full page, or a scan that stopped below the latest ledger (one request scans at most
10,000 ledgers), means the node is behind: the next request goes at once. Otherwise the node is at
the tip and waits for the next ledger close: the ledger interval is estimated from the
``latestLedgerCloseTime`` of successive ledgers and from when each was first seen (see
:meth:`RpcFollower.interval`), counted from when the latest ledger was first seen (the monotonic
clock: wall-clock time is never a deadline), asking a little early and then in short steps until
the ledger is there (:meth:`RpcFollower.tip_delay`).

Safety. Nothing the server says can move the position backwards or past events it has not served:
ids must ascend strictly from the position, the answer's cursor must not be below the last id nor
past the answer's own latest ledger (an answer that says so is malformed: nothing is committed), and
a cursor above the server's latest ledger (a lagging node, or a network reset) is never "fixed" by
jumping: the follower backs off and tries the other URLs, and says loudly when it lasts.
"""

from __future__ import annotations

import enum
import itertools
import operator
import random
import re
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import msgspec
import orjson

from actors.source import Batch, Record, Watermark
from ingestion.common.retry import RetryPolicy
from ingestion.rpc.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_EVENT,
    MAX_LIMIT,
    METHOD_NOT_FOUND,
    PROCESSING_LIMIT,
    Cursor,
    EventFilter,
    InvalidCursor,
    ledger_range_of,
    parse_start,
    past_latest,
)

MIN_PAGE_LIMIT = 10  # a -32001 halves the page down to this, not below
DEFAULT_INTERVAL = 1.0  # seconds: the ledger interval guessed before two ledgers were seen
MIN_INTERVAL, MAX_INTERVAL = 0.05, 10.0


class Phase(enum.Enum):
    OLDEST = "oldest"
    LEDGER = "ledger"
    CURSOR = "cursor"


@attrs.frozen
class Note:
    """A line for the shell to log: ``level`` (info, warning, error), ``event``, fields."""

    level: str
    event: str
    fields: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class HistoryGap:
    """The position is older than the oldest ledger the RPC keeps."""

    cursor: str
    cursor_ledger: int
    elder_ledger: int
    url: str


@attrs.frozen
class Outcome:
    """What an answer means. Apply in order: notes, fatal, gap, batch, then wait ``delay``."""

    batch: Batch | None = None
    delay: float = 0.0
    notes: tuple[Note, ...] = ()
    fatal: str | None = None
    gap: HistoryGap | None = None
    ok: bool = True  # the URL answered usefully (for source health)


@attrs.frozen
class Request:
    url: str
    body: bytes  # the JSON-RPC request
    limit: int


@attrs.define
class RpcFollower:
    """Follows ``getEvents`` for ``filters`` from a start cursor (see the module docstring).

    Args:
        urls: RPC endpoints; the follower sticks to one until ``policy.attempts_per_url``
            consecutive failures, then moves to the next.
        filters: the request's filters (checked before: see protocol.filters_problem).
        start: ``"0"``, a ledger number, an event id, or a scanned-through cursor.
        page_limit: events per request (at most 10,000).
        reset_after: seconds every URL may report a latest ledger below the position before the
            follower logs ``rpc-network-reset-suspected`` (and again every ``reset_after``).
        stale_after: seconds without a new ledger at the tip after which, with several URLs, the
            follower logs ``rpc-stale`` and moves to the next URL (at most once per period).
    """

    urls: tuple[str, ...]
    filters: tuple[EventFilter, ...]
    start: str
    policy: RetryPolicy = attrs.field(factory=RetryPolicy)
    page_limit: int = 10_000
    reset_after: float = 60.0
    stale_after: float = 30.0
    rand: Callable[[], float] = random.random  # uniform in [0, 1): backoff jitter
    phase: Phase = attrs.field(init=False)
    position: Cursor | None = attrs.field(init=False, default=None)
    start_ledger: int = attrs.field(init=False, default=1)
    url_index: int = attrs.field(init=False, default=0)
    failures: int = attrs.field(init=False, default=0)  # consecutive, on the current URL
    round_failures: int = attrs.field(init=False, default=0)  # consecutive, across URLs
    malformed: int = attrs.field(init=False, default=0)
    limit: int = attrs.field(init=False)
    # The highest latest ledger seen: (sequence, close time or -1, when first seen).
    _sighting: tuple[int, int, float] = attrs.field(init=False, default=(0, -1, 0.0))
    _close_gaps: deque[float] = attrs.field(init=False, factory=lambda: deque(maxlen=9))
    _seen_gaps: deque[float] = attrs.field(init=False, factory=lambda: deque(maxlen=9))
    _overdue: int = attrs.field(init=False, default=0)
    _stale_moved_at: float = attrs.field(init=False, default=0.0)
    ahead_since: float | None = attrs.field(init=False, default=None)
    _ahead_logged_at: float | None = attrs.field(init=False, default=None)
    _rejected_4xx: set[str] = attrs.field(init=False, factory=set)
    request_id: int = attrs.field(init=False, default=0)
    # A skipped history gap holds the completeness watermark at ``held_at`` (``held`` says why).
    held: str = attrs.field(init=False, default="")
    held_at: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if not self.urls:
            raise ValueError("at least one RPC URL is needed")
        if not 1 <= self.page_limit <= MAX_LIMIT:
            raise ValueError(f"page_limit {self.page_limit} must be within 1..{MAX_LIMIT}")
        self.limit = self.page_limit
        start = parse_start(self.start, "an RPC")
        if isinstance(start, Cursor):
            self.phase, self.position = Phase.CURSOR, start
        elif start:
            self.phase, self.start_ledger = Phase.LEDGER, start
        else:
            self.phase = Phase.OLDEST

    @property
    def latest(self) -> int:
        """The highest latest ledger any answer has reported (0: none yet)."""
        return self._sighting[0]

    @property
    def latest_seen_at(self) -> float:
        """When that ledger was first seen."""
        return self._sighting[2]

    # -- requests ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.urls[self.url_index % len(self.urls)]

    def describe_position(self) -> str:
        if self.phase is Phase.CURSOR:
            return str(self.position)
        return "0" if self.phase is Phase.OLDEST else str(self.start_ledger)

    def next_request(self) -> Request:
        params: dict[str, Any] = {"filters": [f.to_json() for f in self.filters]}
        if self.phase is Phase.CURSOR:
            params["pagination"] = {"cursor": str(self.position), "limit": self.limit}
        else:
            params["startLedger"] = self.start_ledger
            params["pagination"] = {"limit": self.limit}
        self.request_id += 1
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": self.request_id, "method": "getEvents", "params": params}
        )
        return Request(self.url, body, self.limit)

    def _requested_ledger(self) -> int:
        """The first ledger the current request scans."""
        if self.phase is Phase.CURSOR:
            assert self.position is not None
            return self.position.successor().ledger
        return self.start_ledger

    # -- answers ----------------------------------------------------------------------------------

    def on_result(self, result: Any, limit: int, now: float) -> Outcome:
        """A ``getEvents`` result for a request of ``limit`` events, received at ``now``."""
        try:
            page = self._parse(result, limit)
        except (ValueError, TypeError, KeyError, InvalidCursor) as exc:
            return self._on_malformed(str(exc), now)
        events, cursor, latest, close_time = page
        records = tuple(
            Record(paging_token=str(e["id"]), body=orjson.dumps(e).decode()) for e in events
        )
        return self._accepted(records, cursor, latest, close_time, limit, now)

    def on_events(self, page: EventsPage, limit: int, now: float) -> Outcome | None:
        """A ``getEvents`` result read by :func:`read_events` (ids and ledgers only, each event kept
        as its text): the same rules as :meth:`on_result`, checked over the whole page at once.
        None when a rule fails: the caller then gives the decoded answer to :meth:`on_result`,
        which says which event broke which rule."""
        try:
            cursor = Cursor.parse(page.cursor)
        except InvalidCursor:
            return None
        if not self._plausible(page, cursor, limit):
            return None
        records = Record.many(page.ids, page.texts)
        return self._accepted(records, cursor, page.latest, page.close_time, limit, now)

    def _plausible(self, page: EventsPage, cursor: Cursor, limit: int) -> bool:
        """:meth:`_parse`'s rules over a whole page: C-level passes, no per-event objects."""
        ids, latest = page.ids, page.latest
        if len(ids) > limit or past_latest(cursor, latest):
            return False
        floor = self.position
        if self.phase is Phase.CURSOR and floor is not None and cursor < floor:
            return False
        if not ids:
            return True
        lines = "\n".join(ids)
        if _PADDED_IDS(lines):
            # The ids the server writes ("%019d-%010d"): of one width, they ascend as text exactly
            # when they ascend as (TOID, event) (actors/cursor_order.py, _PADDED_LINES).
            if not all(map(operator.lt, ids, ids[1:])):
                return False
            toids = list(map(int, map(_PADDED_TOID, ids)))
            if toids[-1] >= 1 << 63 or max(map(_PADDED_EVENT, ids)) > _MAX_EVENT_TEXT:
                return False
        elif _EVENT_IDS(lines):
            toids = list(map(int, (i.partition("-")[0] for i in ids)))
            subs = list(map(int, (i.partition("-")[2] for i in ids)))
            if max(toids) >= 1 << 63 or max(subs) > MAX_EVENT:
                return False
            keys = list(map(_event_key, toids, subs))
            if not all(map(operator.lt, keys, keys[1:])):
                return False
        else:
            return False
        if list(map(operator.rshift, toids, itertools.repeat(32))) != page.ledgers:
            return False
        first, last = Cursor.parse(ids[0]), Cursor.parse(ids[-1])
        if floor is not None and self.phase is Phase.CURSOR and first <= floor:
            return False
        if self.phase is Phase.LEDGER and first.ledger < self.start_ledger:
            return False
        return last.ledger <= latest and not cursor < last

    def _accepted(
        self, records: tuple[Record, ...], cursor: Cursor, latest: int, close_time: int | None,
        limit: int, now: float,
    ) -> Outcome:  # fmt: skip
        """A checked page: the batch to commit and when to ask again."""
        self.malformed = 0
        self.failures = self.round_failures = 0
        self._rejected_4xx.clear()
        notes: list[Note] = []
        if self.ahead_since is not None:
            fields = {"url": self.url, "latest_ledger": latest}
            notes.append(Note("info", "rpc-caught-up-with-cursor", fields))
            self.ahead_since = self._ahead_logged_at = None
        self._saw_latest(latest, close_time, now)
        if limit < self.page_limit and self.limit == limit:
            self.limit = min(self.page_limit, limit * 2)
        moved = self.position is None or cursor > self.position
        last = Cursor.parse(records[-1].paging_token) if records else None
        through = str(cursor) if moved and (last is None or cursor > last) else None
        self.phase, self.position = Phase.CURSOR, max(cursor, self.position or cursor)
        batch = Batch(records, through=through, watermark=self.watermark()) if records or through else None
        behind = len(records) >= limit or cursor.ledger < latest
        if behind:
            self._overdue = 0
            return Outcome(batch, 0.0, tuple(notes))
        quiet = now - max(self.latest_seen_at, self._stale_moved_at)
        if len(self.urls) > 1 and quiet > self.stale_after:
            # No new ledger for longer than the RPC's own health rule allows (getHealth says
            # "unhealthy" after 30 s): this RPC may have stopped ingesting; another may not have.
            before = self.url
            self.url_index += 1
            self._stale_moved_at = now
            notes.append(Note("warning", "rpc-stale", {
                "url": before, "latest_ledger": self.latest, "quiet_s": round(quiet, 1),
                "to_url": self.url,
            }))  # fmt: skip
            return Outcome(batch, 0.0, tuple(notes))
        return Outcome(batch, self.tip_delay(now), tuple(notes))

    def _parse(self, result: Any, limit: int) -> tuple[list[dict[str, Any]], Cursor, int, int | None]:
        if not isinstance(result, Mapping):
            raise ValueError("result is not an object")
        events = result["events"]
        if not isinstance(events, list):
            raise ValueError("events is not a list")
        latest = int(result["latestLedger"])
        close_raw = result.get("latestLedgerCloseTime")
        close_time = int(close_raw) if close_raw not in (None, "") else None
        cursor = Cursor.parse(str(result["cursor"]))
        floor = self.position
        previous: Cursor | None = None
        for e in events:
            if not isinstance(e, dict) or not isinstance(e.get("id"), str):
                raise ValueError("an event without an id")
            at = Cursor.parse(e["id"])
            if e.get("ledger") != at.ledger:
                raise ValueError(f"event {e['id']}: ledger {e.get('ledger')!r} is not the id's")
            if previous is not None and at <= previous:
                raise ValueError(f"event ids do not ascend at {e['id']}")
            if floor is not None and self.phase is Phase.CURSOR and at <= floor:
                raise ValueError(f"event {e['id']} is not after the cursor {floor}")
            if self.phase is Phase.LEDGER and at.ledger < self.start_ledger:
                raise ValueError(f"event {e['id']} is before the start ledger {self.start_ledger}")
            if at.ledger > latest:
                raise ValueError(f"event {e['id']} is after the answer's latest ledger {latest}")
            previous = at
        if len(events) > limit:
            raise ValueError(f"{len(events)} events for a limit of {limit}")
        if previous is not None and cursor < previous:
            raise ValueError(f"cursor {cursor} is below the last event {previous}")
        if past_latest(cursor, latest):
            # Committing it would put the position past ledgers that have not closed: their
            # events would never be read.
            raise ValueError(f"cursor {cursor} is past the answer's latest ledger {latest}")
        if self.phase is Phase.CURSOR and floor is not None and cursor < floor:
            raise ValueError(f"cursor {cursor} went back from {floor}")
        return events, cursor, latest, close_time

    def on_error(self, code: int, message: str, now: float) -> Outcome:
        """A JSON-RPC error answer."""
        if code == INVALID_REQUEST:
            span = ledger_range_of(message)
            if span is not None:
                return self._out_of_range(span[0], span[1], now)
            return self._failed(f"RPC error {code}: {message}", now)
        if code == INVALID_PARAMS:
            filters = [f.to_json() for f in self.filters]
            return Outcome(
                fatal=f"{self.url} rejected the request's parameters: {message} (filters: "
                f"{orjson.dumps(filters).decode()}); fix the filter it names",
                ok=True,
            )
        if code == METHOD_NOT_FOUND:
            return Outcome(fatal=f"{self.url} has no getEvents method: is it a Stellar RPC URL?")
        if code == PROCESSING_LIMIT:
            notes: tuple[Note, ...] = ()
            if self.limit > MIN_PAGE_LIMIT:
                self.limit = max(MIN_PAGE_LIMIT, self.limit // 2)
                notes = (Note("warning", "rpc-page-limit", {"limit": self.limit, "url": self.url}),)
            out = self._failed(f"RPC error {code}: {message}", now)
            return attrs.evolve(out, notes=notes + out.notes, ok=True)
        return self._failed(f"RPC error {code}: {message}", now)

    def on_http_error(self, status: int, detail: str, retry_after: float | None, now: float) -> Outcome:
        """An HTTP status other than 200 (429 and 5xx are retried; other 4xx are fatal once
        every URL has answered one in a row)."""
        error = f"HTTP {status}: {detail}"[:300]
        if 400 <= status < 500 and status not in (408, 425, 429):
            self._rejected_4xx.add(self.url)
            if len(self._rejected_4xx) == len(set(self.urls)):
                return Outcome(fatal=f"every RPC URL rejects getEvents: last {self.url} {error}", ok=False)
        out = self._failed(error, now, move=400 <= status < 500 and status not in (408, 425, 429))
        if retry_after is not None:
            wait = max(out.delay, min(retry_after, self.policy.retry_after_cap))
            out = attrs.evolve(out, delay=wait)
        return out

    def on_transport_error(self, error: str, now: float) -> Outcome:
        return self._failed(error, now, reached=False)

    def on_malformed(self, error: str, now: float) -> Outcome:
        return self._on_malformed(error, now)

    def skip_to(self, ledger: int, held: str = "") -> None:
        """Go on from ``ledger`` (a history gap recorded and skipped). ``held``: why the job's
        completeness watermark now stops before the gap, at the ledger the position completes."""
        if held and not self.held:
            self.held_at = complete_ledger(self.position) if self.position else self._needed_ledger() - 1
            self.held = held
        self.phase, self.start_ledger = Phase.LEDGER, ledger

    def watermark(self) -> Watermark | None:
        """The job's completeness watermark once the position is committed (None: no position
        yet): the last ledger every matching event of which has been served, held before a
        skipped gap; with the latest ledger seen."""
        latest = self.latest or None
        if self.held:
            return Watermark(self.held_at, self.held, source_latest=latest)
        if self.position is None:
            return None
        return Watermark(complete_ledger(self.position), source_latest=latest)

    # -- the ledger clock -------------------------------------------------------------------------

    def _saw_latest(self, latest: int, close_time: int | None, now: float) -> None:
        if latest <= self.latest:
            return
        if self.latest:
            ledger, closed, seen = self._sighting
            if close_time is not None and closed >= 0 and close_time >= closed:
                self._close_gaps.append((close_time - closed) / (latest - ledger))
            self._seen_gaps.append((now - seen) / (latest - ledger))
        self._overdue = 0
        self._sighting = (latest, close_time if close_time is not None else -1, now)

    def interval(self) -> float:
        """Seconds between ledger closes, estimated from what has been seen: the median gap
        between the close times of the ledgers seen (``latestLedgerCloseTime``), and the median
        gap between the moments they were first seen, whichever is shorter (close times are whole
        seconds, and a network that halted, or a simulator's history, gives one huge gap: the
        medians and the smaller of the two keep such a gap from stretching the wait)."""
        estimates = [statistics.median(gaps) for gaps in (self._close_gaps, self._seen_gaps) if gaps]
        estimate = min(estimates) if estimates else DEFAULT_INTERVAL
        return min(MAX_INTERVAL, max(MIN_INTERVAL, estimate))

    def tip_delay(self, now: float) -> float:
        """How long to wait at the tip before asking again.

        The next ledger is due one interval after the latest was first seen; the follower asks a
        little before that (``interval * 0.15``, at most 0.5 s) and then every ``interval / 20``
        (0.05 to 0.25 s) until it is there. So each new ledger is first seen within one short
        step of its close, and the next wait is anchored on an accurate moment: waiting a whole
        interval from a late sighting would carry the lateness into every later ledger.
        """
        interval = self.interval()
        early = min(0.5, interval * 0.15)
        remaining = self.latest_seen_at + interval - early - now
        if remaining > 0:
            return remaining
        self._overdue += 1
        if -remaining > interval:  # a whole interval late: a halted network, or a stale RPC
            return min(interval, 1.0)
        step = min(0.25, max(MIN_INTERVAL, interval / 20))
        if not self._seen_gaps:  # the interval is a guess: do not poll a slow network every 50 ms
            step = min(0.25, MIN_INTERVAL * 2 ** min(self._overdue - 1, 3))
        return step

    # -- failures ---------------------------------------------------------------------------------

    def _needed_ledger(self) -> int:
        """The first ledger whose events the follower still needs: after a scanned-through cursor
        of ledger L that is L + 1, although a request resuming after it starts in L."""
        if self.phase is Phase.CURSOR:
            assert self.position is not None
            p = self.position
            return p.ledger + 1 if p == Cursor.through(p.ledger) else p.ledger
        return self.start_ledger

    def _out_of_range(self, oldest: int, latest: int, now: float) -> Outcome:
        wanted = self._requested_ledger()
        if self.phase is Phase.OLDEST:
            self.phase, self.start_ledger = Phase.LEDGER, oldest
            self.failures = self.round_failures = 0
            note = Note("info", "rpc-start-oldest", {"url": self.url, "oldest_ledger": oldest})
            return Outcome(notes=(note,))
        if wanted < oldest:
            needed = self._needed_ledger()
            if needed >= oldest:
                # Scanned through the ledger just before the oldest one: nothing is missing, but
                # the server refuses a cursor inside a ledger it no longer keeps. Go on by ledger.
                self.phase, self.start_ledger = Phase.LEDGER, needed
                self.failures = self.round_failures = 0
                return Outcome()
            cursor_ledger = self.position.ledger if self.position is not None else wanted
            gap = HistoryGap(self.describe_position(), cursor_ledger, oldest, self.url)
            return Outcome(gap=gap)
        # The position is above this server's latest ledger: a lagging RPC, or the network was
        # reset. Never jump: try the other URLs, back off, and say so loudly when it lasts.
        if self.ahead_since is None:
            self.ahead_since = now
        fields = {
            "url": self.url,
            "cursor": self.describe_position(),
            "cursor_ledger": wanted,
            "latest_ledger": latest,
            "ahead_for_s": round(now - self.ahead_since, 1),
        }
        notes = [Note("warning", "rpc-cursor-ahead", fields)]
        if now - self.ahead_since >= self.reset_after and (
            self._ahead_logged_at is None or now - self._ahead_logged_at >= self.reset_after
        ):
            self._ahead_logged_at = now
            notes.append(Note("error", "rpc-network-reset-suspected", {
                **fields,
                "error": f"every RPC URL has reported a latest ledger below the committed position "
                f"(ledger {wanted}) for {now - self.ahead_since:.0f} s: a network reset? The node "
                "will not jump to the new ledgers by itself; an operator must decide where the job "
                "resumes (clear or set its cursor)",
            }))  # fmt: skip
        # Another URL may be ahead of this one: move on at once.
        out = self._failed(
            f"cursor ledger {wanted} is above the latest ledger {latest}", now, note=False, move=True
        )
        return attrs.evolve(out, notes=tuple(notes) + out.notes, ok=True)

    def _on_malformed(self, error: str, now: float) -> Outcome:
        self.malformed += 1
        if self.malformed > self.policy.malformed_retries:
            return Outcome(fatal=f"{self.url} keeps sending malformed getEvents answers: {error}")
        return self._failed(f"malformed answer: {error}", now)

    def _failed(
        self, error: str, now: float, *, reached: bool = True, note: bool = True, move: bool = False
    ) -> Outcome:
        """Count a failure and back off; move to the next URL after ``attempts_per_url`` failures
        on this one (at once with ``move``: this URL cannot do better, so another is tried
        without waiting until each has had its turn in this round)."""
        self.failures += 1
        self.round_failures += 1
        notes: list[Note] = []
        if note:
            notes.append(Note("warning", "rpc-retry", {
                "url": self.url, "attempt": self.round_failures, "error": error,
            }))  # fmt: skip
        switched = False
        if (move or self.failures >= self.policy.attempts_per_url) and len(self.urls) > 1:
            before = self.url
            self.url_index += 1
            self.failures = 0
            switched = True
            notes.append(Note("warning", "rpc-failover", {"from_url": before, "to_url": self.url}))
        if move and switched and self.round_failures < len(self.urls):
            delay = 0.0
        else:
            delay = self.policy.delay(self.round_failures, self.rand())
        return Outcome(delay=delay, notes=tuple(notes), ok=reached)


_EVENT_IDS = re.compile(r"[0-9]+-[0-9]+(?:\n[0-9]+-[0-9]+)*").fullmatch
_PADDED_IDS = re.compile(r"[0-9]{19}-[0-9]{10}(?:\n[0-9]{19}-[0-9]{10})*").fullmatch
_PADDED_TOID, _PADDED_EVENT = operator.itemgetter(slice(19)), operator.itemgetter(slice(20, None))
_MAX_EVENT_TEXT = f"{MAX_EVENT:010d}"


def complete_ledger(position: Cursor) -> int:
    """The last ledger all of whose events are at or before ``position``: its own ledger after
    a scanned-through cursor, else the one before (more events of its ledger may follow)."""
    return position.ledger if position == Cursor.through(position.ledger) else position.ledger - 1


def _event_key(toid: int, event: int) -> int:
    return (toid << 32) | event  # orders as Cursor does: (ledger, tx, op) is the TOID's order


class _EventHead(msgspec.Struct):
    id: str
    ledger: int


class _HeadsResult(msgspec.Struct):
    events: list[_EventHead]
    latestLedger: int  # the wire's names
    cursor: str
    latestLedgerCloseTime: str | int | None = None


class _HeadsAnswer(msgspec.Struct):
    result: _HeadsResult


class _TextsResult(msgspec.Struct):
    events: list[msgspec.Raw]


class _TextsAnswer(msgspec.Struct):
    result: _TextsResult


_HEADS = msgspec.json.Decoder(_HeadsAnswer)
_TEXTS = msgspec.json.Decoder(_TextsAnswer)


@attrs.frozen
class EventsPage:
    """A ``getEvents`` result as :func:`read_events` reads it: each event's ``id``, ``ledger`` and
    text (as sent, line breaks between tokens removed), the answer's latest ledger, its close time
    and cursor."""

    ids: list[str]
    ledgers: list[int]
    texts: list[str]
    latest: int
    close_time: int | None
    cursor: str


def read_events(content: bytes) -> EventsPage | None:
    """A ``getEvents`` answer read without decoding its events into Python values: a JSON parser
    checks the whole answer (strictly: msgspec), and gives each event's exact text (its own cut,
    not a text search) and, in a second typed pass, its ``id`` and ``ledger``. Line breaks and
    indentation between tokens are removed (msgspec's ``format``: strings and numbers kept as
    sent). None for anything but a plain result with well-typed fields (a JSON-RPC error, a
    missing field, broken JSON, invalid UTF-8): :func:`parse_answer` then reads it the general
    way, and says what is wrong."""
    try:
        if not content.isascii():  # the parser does not check the UTF-8
            content.decode("utf-8")
        if b"\n" in content:
            content = msgspec.json.format(content, indent=-1)
        heads = _HEADS.decode(content).result
        texts = _TEXTS.decode(content).result.events
        close = heads.latestLedgerCloseTime
        close_time = int(close) if close not in (None, "") else None
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError):
        return None
    events = heads.events
    return EventsPage(
        ids=[e.id for e in events], ledgers=[e.ledger for e in events],
        texts=[str(t, "utf-8") for t in texts], latest=heads.latestLedger, close_time=close_time,
        cursor=heads.cursor,
    )  # fmt: skip


def parse_answer(content: bytes) -> tuple[Any, tuple[int, str] | None]:
    """``(result, None)`` or ``(None, (code, message))`` from a JSON-RPC response body.

    Raises:
        ValueError: not a JSON-RPC response.
    """
    doc = orjson.loads(content)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON-RPC response object")
    if isinstance(doc.get("error"), dict):
        err = doc["error"]
        return None, (int(err.get("code", 0)), str(err.get("message", "")))
    if "result" not in doc:
        raise ValueError("a JSON-RPC response without result or error")
    return doc["result"], None


def request_body(
    method: str, request_id: int, params: Mapping[str, Any] | Sequence[Any] | None = None
) -> bytes:
    doc: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        doc["params"] = params
    return orjson.dumps(doc)
