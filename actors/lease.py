"""The lease machine: one node's view of its leadership, as an I/O-free state machine.

Times are monotonic seconds passed in by the caller (``trio.current_time()`` in the actors); nothing
here reads a clock, imports trio or touches Redis. Wall-clock time never enters a deadline.

The arithmetic that makes a stale write impossible to *attempt* (Redis makes it impossible to
*apply*): a lease granted or renewed by a request sent at local time ``sent_at`` with a TTL of
``ttl`` expires in Redis no earlier than ``sent_at + ttl`` as measured by Redis's clock, because Redis
starts the TTL when it runs the command, which is after the request left. Local and Redis clocks may
run at slightly different rates, so we assume the lease lasts only ``ttl * (1 - drift)`` of local
time. The lease deadline is therefore

    lease_deadline = sent_at + ttl * (1 - drift)

and ingestion must have stopped, in-flight commit included, a safety margin before that:

    ingest_deadline = lease_deadline - margin

Both can only be early, never late.
"""

from __future__ import annotations

import enum

import attrs


class Role(enum.Enum):
    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


class LostReason(enum.Enum):
    """Why a term ended; the values are the ``reason`` field of ``lost-leadership``."""

    LEASE_EXPIRED = "lease-expired"
    RENEW_REJECTED = "renew-rejected"
    FENCED = "fenced"
    RELEASED = "released"
    SHUTDOWN = "shutdown"
    REDIS_UNAVAILABLE = "redis-unavailable"
    REBALANCED = "rebalanced"  # handed back gracefully so that another node leads (the balancer)
    SOURCE_UNAVAILABLE = "source-unavailable"  # the source answered nothing for too long; others can
    HANDED_OVER = "handed-over"  # an operator asked (ingestion handover, the console); the audit says who
    TERM_FAILED = "term-failed"  # the term raised (logged ``term-failed``); the job backs off on this node


class LeaseProtocolError(Exception):
    """An input that is illegal in the machine's current state; the state is left unchanged."""


@attrs.frozen
class LeaseTiming:
    """The settings the deadline arithmetic needs, in seconds (``drift`` is a fraction)."""

    ttl: float
    renew_interval: float
    margin: float
    drift: float = 0.01

    def __attrs_post_init__(self) -> None:
        usable = self.ttl * (1 - self.drift) - self.margin
        if not 0 <= self.drift < 0.5:
            raise ValueError(f"drift must be in [0, 0.5), got {self.drift}")
        if self.renew_interval <= 0 or self.margin <= 0:
            raise ValueError("renew_interval and margin must be positive")
        if self.renew_interval >= usable:
            raise ValueError(
                f"renew interval {self.renew_interval}s leaves no time to renew before the ingest "
                f"deadline (ttl * (1 - drift) - margin = {usable:.3f}s)"
            )

    def lease_deadline(self, sent_at: float) -> float:
        return sent_at + self.ttl * (1 - self.drift)

    def ingest_deadline(self, sent_at: float) -> float:
        return self.lease_deadline(sent_at) - self.margin


@attrs.frozen
class Term:
    """One granted leadership term as this node sees it."""

    token: int
    granted_at: float
    ingest_deadline: float
    renew_failures: int = 0


@attrs.frozen
class Lost:
    """Effect: the term with ``token`` has ended for ``reason``."""

    token: int
    reason: LostReason


@attrs.frozen
class Extended:
    """Effect: the term's ingest deadline moved to ``ingest_deadline``."""

    token: int
    ingest_deadline: float


class LeaseMachine:
    """Leadership state for one node and one job.

    Each input method returns the effect the actor must carry out (or None); an input for a term
    that is no longer current (a late reply) is ignored and returns None, so replies can never
    resurrect a finished term.
    """

    def __init__(self, timing: LeaseTiming) -> None:
        self.timing = timing
        self.role = Role.STANDBY
        self.term: Term | None = None

    def granted(self, token: int, sent_at: float) -> Term:
        if self.role is not Role.STANDBY:
            raise LeaseProtocolError(f"a lease cannot be granted while {self.role.value}")
        self.term = Term(token, sent_at, self.timing.ingest_deadline(sent_at))
        self.role = Role.LEADER
        return self.term

    def _current(self, token: int) -> Term | None:
        if self.role is Role.LEADER and self.term is not None and self.term.token == token:
            return self.term
        return None

    def _end(self, token: int, reason: LostReason) -> Lost | None:
        if self._current(token) is None:
            return None
        self.role = Role.STANDBY
        self.term = None
        return Lost(token, reason)

    def renewed(self, token: int, sent_at: float, now: float) -> Extended | Lost | None:
        """A renewal sent at ``sent_at`` succeeded; ``now`` is when its answer arrived."""
        term = self._current(token)
        if term is None:
            return None
        if now >= term.ingest_deadline:
            # Too late: the ingestion scope has already fired; do not revive the term.
            return self._end(token, self._expiry_reason(term))
        deadline = max(term.ingest_deadline, self.timing.ingest_deadline(sent_at))
        self.term = attrs.evolve(term, ingest_deadline=deadline, renew_failures=0)
        return Extended(token, deadline)

    def renew_failed(self, token: int, now: float) -> Lost | None:
        """A renewal could not reach Redis (or its answer is ambiguous); retry until the deadline."""
        term = self._current(token)
        if term is None:
            return None
        self.term = term = attrs.evolve(term, renew_failures=term.renew_failures + 1)
        if now >= term.ingest_deadline:
            return self._end(token, LostReason.REDIS_UNAVAILABLE)
        return None

    def renew_rejected(self, token: int) -> Lost | None:
        return self._end(token, LostReason.RENEW_REJECTED)

    def fenced(self, token: int) -> Lost | None:
        return self._end(token, LostReason.FENCED)

    def released(self, token: int) -> Lost | None:
        return self._end(token, LostReason.RELEASED)

    def hand_back(self, token: int, reason: LostReason = LostReason.REBALANCED) -> Lost | None:
        """Give the term up gracefully (finish the commit, release) for another node to lead:
        ``rebalanced`` (the balancer) or ``source-unavailable`` (this node cannot reach the source
        and another can)."""
        return self._end(token, reason)

    def ended(self, token: int, reason: LostReason) -> Lost | None:
        """The term ended for a reason found outside the machine (e.g. the Ingestor stopped)."""
        return self._end(token, reason)

    def ingest_stopped(self, token: int, now: float) -> Lost | None:
        """The Ingestor's scope fired at the ingest deadline (it reports so). If a renewal moved
        the deadline meanwhile (its answer came within a scheduler pass of the old deadline, and
        reached the Elector but not yet the Ingestor), the lease is in fact valid: the term still
        ends (ingestion has stopped), but as a hand-back (``released``), not an expiry."""
        term = self._current(token)
        if term is None:
            return None
        if now >= term.ingest_deadline:
            return self._end(token, self._expiry_reason(term))
        return self._end(token, LostReason.RELEASED)

    def deadline_passed(self, token: int, now: float) -> Lost | None:
        term = self._current(token)
        if term is None or now < term.ingest_deadline:
            return None
        return self._end(token, self._expiry_reason(term))

    def shutdown(self) -> Lost | None:
        term = self.term
        self.role = Role.STOPPED
        self.term = None
        return Lost(term.token, LostReason.SHUTDOWN) if term is not None else None

    @staticmethod
    def _expiry_reason(term: Term) -> LostReason:
        return LostReason.REDIS_UNAVAILABLE if term.renew_failures else LostReason.LEASE_EXPIRED


def standby_wait(ttl_left_ms: int, ttl_ms: int, jitter: float) -> float:
    """Seconds a standby sleeps before campaigning again (unless a release notice wakes it).

    ``ttl_left_ms`` is the current lease's remaining TTL from the acquire answer (Redis PTTL: -1 for
    no expiry, which should not happen, -2 for gone). ``jitter`` is a random fraction of a second
    chosen by the caller, so many standbys do not campaign in the same millisecond.
    """
    if ttl_left_ms < 0:
        ttl_left_ms = 0 if ttl_left_ms == -2 else ttl_ms
    return min(ttl_left_ms, ttl_ms) / 1000 + jitter
