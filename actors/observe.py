"""What a node knows about itself, for metrics, the status endpoint and tests.

The actors report into one :class:`NodeObserver`; readers take :meth:`NodeObserver.snapshot` or
subscribe to the stream of events (``listener(event, fields)``: every election event, plus
``committed`` after each commit). Pure bookkeeping: no I/O, no trio. The one clock read here is the
injectable ``wall_clock``, used to turn a committed record's ``created_at`` into a source lag.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs

Listener = Callable[[str, dict[str, Any]], None]


@attrs.frozen
class NodeStatus:
    node: str
    job: str
    role: str
    token: int | None
    leader: str | None
    ingest_deadline: float | None  # trio time; None unless leading
    cursor: str | None
    events_ingested: int
    commits: int
    fencing_rejections: int
    elections: int
    losses: dict[str, int]
    redis_errors: int = 0
    source_lag_seconds: float | None = None  # while leading, when the records carry a time
    leaderless_seconds: float = 0.0  # sum of the leaderless gaps this node's takeovers ended
    source_up: bool | None = None  # the source answered recently (None: not watched)
    source_last_ok: float | None = None  # trio time of the source's last successful answer
    history_gaps: dict[str, int] = attrs.Factory(dict)  # by action: stop or skip
    held_off: str | None = None  # why the node holds off campaigning now (and the cause, if known)
    # Leader only: the completeness watermark this node last committed (a ledger), why a known
    # gap holds it ('' when none does), and the source's latest closed ledger it last reported.
    complete_through_ledger: int | None = None
    complete_held: str = ""
    source_latest_ledger: int | None = None
    decode_errors: int = 0  # records handed on to be committed with a decodeError member


def record_time(body: str) -> float | None:
    """The epoch seconds of a Horizon record's ``created_at`` (``closed_at`` for a ledger; a
    Stellar RPC event's ``ledgerClosedAt``)."""
    try:
        doc = json.loads(body)
        stamp = doc.get("created_at") or doc.get("closed_at") or doc.get("ledgerClosedAt")
        if not isinstance(stamp, str):
            return None
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


@attrs.define
class RateMeter:
    """Events per second over a sliding window, from ``(now, running total)`` samples."""

    window: float = 5.0
    samples: deque[tuple[float, int]] = attrs.Factory(deque)

    def sample(self, now: float, total: int) -> float:
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        first_at, first_total = self.samples[0]
        if now - first_at <= 0:
            return 0.0
        return (total - first_total) / (now - first_at)


@attrs.define
class NodeObserver:
    node: str
    job: str
    role: str = "starting"
    token: int | None = None
    leader: str | None = None
    ingest_deadline: float | None = None
    cursor: str | None = None
    events_ingested: int = 0
    commits: int = 0
    fencing_rejections: int = 0
    elections: int = 0
    redis_errors: int = 0
    source_lag_seconds: float | None = None
    leaderless_seconds: float = 0.0
    losses: dict[str, int] = attrs.Factory(dict)
    source_up: bool | None = None
    source_last_ok: float | None = None
    history_gaps: dict[str, int] = attrs.Factory(dict)
    held_off: str | None = None
    complete_through_ledger: int | None = None
    complete_held: str = ""
    source_latest_ledger: int | None = None
    decode_errors: int = 0
    recent_commit_latencies: deque[float] = attrs.Factory(lambda: deque(maxlen=1024))
    listeners: list[Listener] = attrs.Factory(list)
    wall_clock: Callable[[], float] = time.time

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Add a listener; returns the function that removes it."""
        self.listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self.listeners:
                self.listeners.remove(listener)

        return unsubscribe

    def _tell(self, event: str, fields: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            listener(event, fields)

    def election_event(self, event: str, **fields: Any) -> None:
        """Record an election event (``became-leader``, ``lost-leadership``, ``standby``, ...)."""
        if event == "became-leader":
            self.role, self.token, self.leader = "leader", fields.get("token"), self.node
            self.elections += 1
            self.source_lag_seconds = None
            if fields.get("takeover_ms") is not None:
                self.leaderless_seconds += int(fields["takeover_ms"]) / 1000
        elif event == "lost-leadership":
            self.role, self.ingest_deadline = "standby", None
            if self.leader == self.node:
                self.leader = None
            self.source_lag_seconds = None
            reason = str(fields.get("reason"))
            self.losses[reason] = self.losses.get(reason, 0) + 1
        elif event == "standby":
            self.role, self.leader, self.token = "standby", fields.get("leader"), fields.get("token")
        elif event == "redis-unavailable":
            self.redis_errors += 1
            if self.role == "starting":
                self.role = "standby"
        elif event == "stopped":
            self.role = "stopped"
        if event == "campaign-held-off":
            error = fields.get("error")
            self.held_off = str(fields.get("reason")) + (f" ({error})" if error else "")
        elif event in ("became-leader", "standby", "stopped"):
            self.held_off = None
        self._tell(event, fields)

    def source_state(self, up: bool, last_ok: float | None) -> None:
        """The source watch's latest view: reachable or not, and its last good answer."""
        self.source_up, self.source_last_ok = up, last_ok

    def history_gap(self, action: str, **fields: Any) -> None:
        """The source found the job's position older than its retained history (``action``:
        ``stop`` or ``skip``; ``fields`` as the ``history-gap`` log line)."""
        self.history_gaps[action] = self.history_gaps.get(action, 0) + 1
        self._tell("history-gap", {**fields, "action": action})

    def deadline(self, ingest_deadline: float | None) -> None:
        self.ingest_deadline = ingest_deadline

    def committed(
        self, count: int, cursor: str, latency: float, *, newest_record: str | None = None
    ) -> None:
        """A commit succeeded. ``newest_record``: the body of its last record, for the lag."""
        self.events_ingested += count
        self.commits += 1
        self.cursor = cursor
        self.recent_commit_latencies.append(latency)
        if newest_record is not None:
            created = record_time(newest_record)
            if created is not None:
                self.source_lag_seconds = max(0.0, self.wall_clock() - created)
        self._tell("committed", {"count": count, "cursor": cursor, "latency": latency})

    def complete_through(self, ledger: int, held: str = "", source_latest: int | None = None) -> None:
        """A commit carried the job's completeness watermark: committed as ``ledger`` (``held``:
        why a known gap holds it there); ``source_latest``: the source's latest closed ledger."""
        self.complete_through_ledger = ledger
        self.complete_held = held
        if source_latest is not None:
            self.source_latest_ledger = source_latest

    def decode_failed(self, count: int) -> None:
        """``count`` records that could not be decoded were handed on to be committed as sent,
        each with a ``decodeError`` member."""
        self.decode_errors += count

    def fencing_rejected(self, **fields: Any) -> None:
        """A stale write was refused (``token``, ``current_token``, ``cursor``, ...)."""
        self.fencing_rejections += 1
        self._tell("fencing-token-rejected", fields)

    def snapshot(self) -> NodeStatus:
        return NodeStatus(
            node=self.node,
            job=self.job,
            role=self.role,
            token=self.token,
            leader=self.leader,
            ingest_deadline=self.ingest_deadline,
            cursor=self.cursor,
            events_ingested=self.events_ingested,
            commits=self.commits,
            fencing_rejections=self.fencing_rejections,
            elections=self.elections,
            losses=dict(self.losses),
            redis_errors=self.redis_errors,
            source_lag_seconds=self.source_lag_seconds,
            leaderless_seconds=self.leaderless_seconds,
            source_up=self.source_up,
            source_last_ok=self.source_last_ok,
            history_gaps=dict(self.history_gaps),
            held_off=self.held_off,
            complete_through_ledger=self.complete_through_ledger,
            complete_held=self.complete_held,
            source_latest_ledger=self.source_latest_ledger,
            decode_errors=self.decode_errors,
        )
