"""One event subscription's decisions, with no I/O: history from a position, then live events, with
no gap and no duplicate at the seam, through a bounded outbox, and when to cut a slow client.

The shell (``ingestion/api/streaming.py``) reads history pages and the node's live feed and sends
notifications; this machine only says which page to read next, what to send, and when to give up
on the client. Time is an argument (``now``, ``trio.current_time()`` in the shell); no clock is read.

Positions are event ids, ``"%019d-%010d"`` (``ingestion/rpc/protocol.py``): fixed-width digits, so
string order is event order. :attr:`Subscription.position` is the id of the last event queued for
the client (or where it asked to start): everything queued is strictly after it.

Why there is no gap and no duplicate at the seam. The shell registers the subscription with the
live feed *before* it issues the first history read. The feed publishes an event only after
reading it from the store, so after the event was committed. Take any event E the subscription
must send:

- published before the registration: committed before it, so before every history read, so a
  history read sees it (history is read until a read comes back *exhausted*: fewer events than
  asked, nothing more in the store at that moment);
- published after the registration: it is in :attr:`pending` (or was dropped by an overflow, see
  below) when the switch to live happens, or arrives later through :meth:`on_live`.

So the union of history and pending holds every event, and the merge by id (only what is strictly
after :attr:`position`, in ascending order) sends each once. A repeated live event (the feed read
the same rows again after a reconnect) is dropped by the same comparison.

Memory. History is paced by the client: the next page is read only once the outbox is empty, so a
slow reader of history costs a page. Live events that arrive while history is read wait in
:attr:`pending`, bounded by :attr:`Limits.pending`: past it they are dropped and the *generation*
moves on. A read issued before the drop may have missed them, so its exhausted answer cannot end
history; a read issued after it sees them all (they were committed before they were published).
Once live, the outbox holds what the client has not taken yet: more than :attr:`Limits.outbox`
events, or a notification older than :attr:`Limits.max_lag` seconds, and the client is cut with a
reason (:class:`Cut`), never buffered without bound.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs


class Phase(enum.Enum):
    HISTORY = "history"
    LIVE = "live"
    CUT = "cut"


@attrs.frozen
class StreamEvent:
    """An event for the client: its id and what the shell sends for it (the rendered event)."""

    id: str
    body: Any = None


@attrs.frozen
class Notification:
    """One ``events`` notification: the events, and the cursor to resume after them."""

    events: tuple[Any, ...]
    cursor: str
    queued_at: float


@attrs.frozen
class ReadHistory:
    """Read up to ``limit`` events strictly after ``after``; answer with :meth:`Subscription.on_history`."""

    after: str
    limit: int
    generation: int


@attrs.frozen
class Cut:
    """The client is too slow: close its connection with this reason (a WebSocket close reason
    fits 123 bytes); ``kind``: ``outbox`` (too many events waiting) or ``lag`` (waiting too long)."""

    kind: str
    reason: str


@attrs.frozen
class Limits:
    """``page``: events per history read and per notification; ``outbox``: events queued for the
    client before it is cut; ``pending``: live events held while history is read before they are
    dropped and read again from the store; ``max_lag``: seconds the oldest notification may wait
    for the client before it is cut."""

    page: int = 200
    outbox: int = 10_000
    pending: int = 10_000
    max_lag: float = 10.0

    def __attrs_post_init__(self) -> None:
        if self.page < 1 or self.outbox < self.page or self.pending < 1 or self.max_lag <= 0:
            raise ValueError(f"subscription limits out of range: {self}")


class Subscription:
    """The machine of one subscription (see the module docstring). Inputs: :meth:`on_history`,
    :meth:`on_live`, :meth:`sent`; outputs: :meth:`next_read`, :meth:`next_notification`,
    :meth:`check`. An input after the cut is ignored."""

    def __init__(self, after: str, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.phase = Phase.HISTORY
        self.position = after
        self.pending: list[StreamEvent] = []
        self.outbox: deque[Notification] = deque()
        self.queued_events = 0  # events in the outbox
        self.generation = 0
        self.reading: ReadHistory | None = None
        self.cut: Cut | None = None
        self.sending = False  # the outbox's head was handed out and is not sent yet

    # -- what to do next ---------------------------------------------------------------------------

    def next_read(self) -> ReadHistory | None:
        """The next history read, when one is due: in history, none in flight, the outbox empty."""
        if self.phase is not Phase.HISTORY or self.reading is not None or self.outbox:
            return None
        self.reading = ReadHistory(self.position, self.limits.page, self.generation)
        return self.reading

    def next_notification(self) -> Notification | None:
        """The notification to send now (the outbox's head), once; :meth:`sent` when it is."""
        if self.cut is not None or self.sending or not self.outbox:
            return None
        self.sending = True
        return self.outbox[0]

    def check(self, now: float) -> Cut | None:
        """Whether to cut the client now: over the outbox's bound, or its oldest notification
        waiting longer than ``max_lag``. Once cut, always the same answer."""
        if self.cut is None:
            if self.queued_events > self.limits.outbox:
                self._cut("outbox", f"slow client: {self.queued_events} events waiting, over the limit of "
                          f"{self.limits.outbox}; resume from your last cursor")  # fmt: skip
            elif self.outbox and now - self.outbox[0].queued_at > self.limits.max_lag:
                self._cut("lag", f"slow client: events waited over {self.limits.max_lag:g} s to be sent; "
                          "resume from your last cursor")  # fmt: skip
        return self.cut

    # -- inputs ------------------------------------------------------------------------------------

    def on_history(
        self,
        read: ReadHistory,
        events: Sequence[StreamEvent],
        exhausted: bool,
        now: float,
        through: str | None = None,
    ) -> None:
        """The answer to ``read``: its events in ascending id order, all after ``read.after``;
        ``exhausted``: the store held nothing more when it was read; ``through``: the id of the
        last row the read judged (a sparse filter's read may match none of them): the next read
        starts after it. It must be a row's id (never a ledger's end: a later commit may still
        add to that ledger).

        Raises:
            ValueError: not the read in flight, or events out of order or not after the read's start.
        """
        if self.phase is Phase.CUT:
            return
        if read != self.reading:
            raise ValueError(f"no such history read in flight: {read}")
        _check_ascending(read.after, events)
        if through is not None and events and through < events[-1].id:
            raise ValueError(f"read through {through}, before its last event {events[-1].id}")
        self.reading = None
        self._queue([e for e in events if e.id > self.position], now)
        if through is not None and through > self.position:
            self.position = through
        if exhausted and read.generation == self.generation:
            self.phase = Phase.LIVE
            caught_up = [e for e in self.pending if e.id > self.position]
            self.pending = []
            # One notification marks the seam even when nothing is pending: history is done.
            self._queue(caught_up, now, always=True)

    def on_live(self, events: Sequence[StreamEvent], now: float) -> None:
        """Events the live feed published that match this subscription, ascending (they may
        repeat what was sent: those are dropped)."""
        if self.phase is Phase.CUT or not events:
            return
        if self.phase is Phase.HISTORY:
            self.pending += events
            if len(self.pending) > self.limits.pending:
                self.pending = []  # read again from the store by a read issued from now on
                self.generation += 1
            return
        self._queue([e for e in events if e.id > self.position], now)

    def sent(self) -> None:
        """The notification from :meth:`next_notification` went out."""
        if not self.sending:
            raise ValueError("no notification is being sent")
        self.sending = False
        if self.phase is not Phase.CUT:
            self.queued_events -= len(self.outbox.popleft().events)

    # -- inside ------------------------------------------------------------------------------------

    def _queue(self, events: Sequence[StreamEvent], now: float, always: bool = False) -> None:
        page = self.limits.page
        for i in range(0, len(events), page):
            chunk = events[i : i + page]
            self.position = chunk[-1].id
            self.outbox.append(Notification(tuple(e.body for e in chunk), self.position, now))
            self.queued_events += len(chunk)
        if always and not events:
            self.outbox.append(Notification((), self.position, now))

    def _cut(self, kind: str, reason: str) -> None:
        self.cut = Cut(kind, reason)
        self.phase = Phase.CUT
        self.pending = []
        self.outbox.clear()
        self.queued_events = 0


def _check_ascending(after: str, events: Sequence[StreamEvent]) -> None:
    previous = after
    for e in events:
        if e.id <= previous:
            raise ValueError(f"event {e.id} is not after {previous}")
        previous = e.id
