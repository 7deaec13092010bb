"""Fault knobs: the ways the simulator can misbehave on demand. Pure state, no I/O, no trio.

Each knob is armed by a method and consumed by the server at the point where a real Horizon (or the
network in front of it) would fail: ``take_request_failure`` when a request arrives,
``claim_stream_cutoff`` when a stream opens, ``take_malformed`` before each stream event,
``stall_remaining`` before each stream frame. Time comes from the ``clock`` given at construction
(the server passes ``trio.current_time``), so the knobs can be unit-tested with a fake clock.
Going down and coming back is not a knob here: the :class:`~ingestion.simulator.Simulator` does it,
because it means stopping the listener. :class:`RpcFaults` are the Stellar RPC server's knobs, in
the same manner: failed requests, a delay, a lagging or reset node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

FAILURE_STATUSES = (429, 500, 502, 503, 504)


class MalformedKind(enum.Enum):
    """A bad stream event, sent once in place of (or before) the next good one."""

    BROKEN_JSON = "broken_json"  # data: a record cut off in the middle; id: the next token
    MISSING_PAGING_TOKEN = "missing_paging_token"  # the next record without paging_token, no id:
    TOKEN_REGRESSION = "token_regression"  # a record whose paging token is before the previous one
    DUPLICATE = "duplicate"  # the previous event again, byte for byte


@attrs.frozen
class RequestFailure:
    """Answer requests with ``status`` while ``remaining`` (a count) or ``until`` (a clock time)."""

    status: int
    remaining: int | None
    until: float | None
    retry_after: int


@attrs.define
class Faults:
    """The armed faults. Arm with the verbs, read with :meth:`snapshot`, disarm with :meth:`clear`.

    Args:
        clock: returns the current time in seconds (monotonic); the server passes
            ``trio.current_time``.
    """

    clock: Callable[[], float]
    _failure: RequestFailure | None = None
    _cutoff_events: int | None = None
    _cutoff_streams: int = 0
    _malformed: list[MalformedKind] = attrs.Factory(list)
    _stall_until: float | None = None
    _frozen_until: float | None = None

    # -- arming ---------------------------------------------------------------------------------

    def fail_requests(
        self,
        status: int = 429,
        *,
        count: int | None = None,
        seconds: float | None = None,
        retry_after: int = 1,
    ) -> None:
        """Answer the next ``count`` requests, or all requests for ``seconds``, with ``status``.

        429 comes with ``Retry-After`` and ``X-Ratelimit-*`` headers and the ``rate_limit_exceeded``
        problem; 500 with the ``server_error`` problem (502/503/504 with their Horizon problems).
        Streams fail before their hello frame. Neither ``count`` nor ``seconds``: one request.

        Raises:
            ValueError: an unsupported status, both ``count`` and ``seconds``, or a negative one.
        """
        if status not in FAILURE_STATUSES:
            raise ValueError(f"status must be one of {FAILURE_STATUSES}, got {status}")
        count, until = _armed_for(count, seconds, self.clock())
        self._failure = RequestFailure(status, count, until, retry_after)

    def close_streams_after(self, events: int, *, streams: int = 1) -> None:
        """End each of the next ``streams`` streams after ``events`` record events, without byebye.

        The response simply ends, as when a proxy or the network drops the connection.
        """
        if events < 0 or streams < 1:
            raise ValueError("events must be >= 0 and streams >= 1")
        self._cutoff_events = events
        self._cutoff_streams = streams

    def send_malformed(self, kind: MalformedKind | str) -> None:
        """Send one malformed event of ``kind`` on the next stream that sends a record."""
        self._malformed.append(MalformedKind(kind))

    def stall_streams(self, seconds: float) -> None:
        """Send nothing on any stream (open or new) for ``seconds``; connections stay open."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        self._stall_until = self.clock() + seconds

    def freeze_ingestion(self, seconds: float) -> None:
        """Stop ingesting for ``seconds``: stellar-core's ledgers go on closing (``core_latest_ledger``
        in ``/``) but no new ledger reaches history, so every request answers 200 with nothing
        new, as a Horizon whose ingestion stalled (its ``stale_history`` 503 is off by default)."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        self._frozen_until = self.clock() + seconds

    def ingestion_frozen(self) -> bool:
        """True while ingestion is frozen (consumed when a ledger closes)."""
        if self._frozen_until is None:
            return False
        if self.clock() >= self._frozen_until:
            self._frozen_until = None
            return False
        return True

    def clear(self) -> None:
        """Disarm every knob."""
        self._failure = None
        self._cutoff_events = None
        self._cutoff_streams = 0
        self._malformed.clear()
        self._stall_until = None
        self._frozen_until = None

    # -- consuming (the server) -----------------------------------------------------------------

    def take_request_failure(self) -> RequestFailure | None:
        """Called once per request: the failure to answer with, or None to serve it normally."""
        self._failure, answer = _consume(self._failure, self.clock())
        return answer

    def claim_stream_cutoff(self) -> int | None:
        """Called when a stream opens: end it after this many record events, or None."""
        if self._cutoff_events is None or self._cutoff_streams <= 0:
            return None
        self._cutoff_streams -= 1
        events = self._cutoff_events
        if self._cutoff_streams == 0:
            self._cutoff_events = None
        return events

    def take_malformed(self, *, have_previous: bool) -> MalformedKind | None:
        """Called before each record event: the malformed event to send first, if one is armed.

        DUPLICATE and TOKEN_REGRESSION need an earlier event on the same stream; they wait for one.
        """
        for i, kind in enumerate(self._malformed):
            needs_previous = kind in (MalformedKind.DUPLICATE, MalformedKind.TOKEN_REGRESSION)
            if have_previous or not needs_previous:
                del self._malformed[i]
                return kind
        return None

    def streams_quiet(self) -> bool:
        """True when no malformed event is armed and streams are not stalled: record events
        can go out several to a write."""
        return not self._malformed and self.stall_remaining() == 0.0

    def stall_remaining(self) -> float:
        """Seconds a stream must stay silent from now (0 when not stalled)."""
        if self._stall_until is None:
            return 0.0
        left = self._stall_until - self.clock()
        if left <= 0:
            self._stall_until = None
            return 0.0
        return left

    def snapshot(self) -> dict[str, Any]:
        """The armed knobs as JSON-ready data (what ``GET /_simulator/faults`` returns)."""
        failure = self._failure
        now = self.clock()
        return {
            "fail": None
            if failure is None
            else {
                "status": failure.status,
                "count": failure.remaining,
                "seconds": None if failure.until is None else max(0.0, failure.until - now),
                "retry_after": failure.retry_after,
            },
            "close_stream_after": None
            if self._cutoff_events is None
            else {"events": self._cutoff_events, "streams": self._cutoff_streams},
            "malformed": [kind.value for kind in self._malformed],
            "stall": None
            if self._stall_until is None
            else {"seconds": max(0.0, self._stall_until - now)},
            "freeze": None
            if self._frozen_until is None
            else {"seconds": max(0.0, self._frozen_until - now)},
        }


# -- the RPC server's knobs -------------------------------------------------------------------------


class RpcFailureKind(enum.Enum):
    """How a failed Stellar RPC request is answered."""

    PROCESSING_LIMIT = "processing_limit"  # HTTP 200, JSON-RPC -32001 (the server's time limit)
    TOO_MANY_REQUESTS = "http_429"  # from a rate-limiting proxy; Retry-After when given
    UNAVAILABLE = "http_503"  # from a proxy or load balancer: no backend
    SERVER_ERROR = "http_500"


@attrs.frozen
class RpcFailure:
    """Answer requests with ``kind`` while ``remaining`` (a count) or ``until`` (a clock time)."""

    kind: RpcFailureKind
    remaining: int | None
    until: float | None
    retry_after: int | None


@attrs.define
class RpcFaults:
    """The Stellar RPC server's armed faults. Pure state; time from ``clock`` (as :class:`Faults`).

    Consumed where a real RPC node (or what stands in front of it) would misbehave:
    :meth:`take_request_failure` when a request arrives, :attr:`delay_ms` before every answer,
    :meth:`ledger_range` whenever the node says which ledgers it holds.

    Attributes:
        delay_ms: every answer waits this long (added to the simulator's ``response_delay_ms``).
        lag_ledgers: the node is this many ledgers behind the chain (it reports and serves up to
            ``chain.latest - lag_ledgers``), as an RPC node whose ingestion fell behind.
        reset_to: the node reports this latest ledger however far the chain is (and an oldest no
            later than it), as after a network (testnet) reset; None: no reset.
    """

    clock: Callable[[], float]
    delay_ms: int = 0
    lag_ledgers: int = 0
    reset_to: int | None = None
    _failure: RpcFailure | None = None

    def fail_requests(
        self,
        kind: RpcFailureKind | str = RpcFailureKind.PROCESSING_LIMIT,
        *,
        count: int | None = None,
        seconds: float | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``count`` requests, or all requests for ``seconds``, with ``kind``
        (neither: one request). ``retry_after`` adds a ``Retry-After`` header to a 429.

        Raises:
            ValueError: an unknown kind, both ``count`` and ``seconds``, or a negative value.
        """
        kind = RpcFailureKind(kind)
        count, until = _armed_for(count, seconds, self.clock())
        self._failure = RpcFailure(kind, count, until, retry_after)

    def set_delay(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("delay_ms must not be negative")
        self.delay_ms = ms

    def lag(self, ledgers: int) -> None:
        if ledgers < 0:
            raise ValueError("lag_ledgers must not be negative")
        self.lag_ledgers = ledgers

    def reset(self, latest: int | None) -> None:
        """Report ``latest`` as the latest ledger (None: undo)."""
        if latest is not None and latest < 1:
            raise ValueError("reset_to must be a positive ledger sequence")
        self.reset_to = latest

    def clear(self) -> None:
        """Disarm every knob."""
        self._failure = None
        self.delay_ms = 0
        self.lag_ledgers = 0
        self.reset_to = None

    def take_request_failure(self) -> RpcFailure | None:
        """Called once per request: the failure to answer with, or None to serve it normally."""
        self._failure, answer = _consume(self._failure, self.clock())
        return answer

    def ledger_range(self, chain_first: int, chain_latest: int) -> tuple[int, int]:
        """``(oldest, latest)`` as this node reports them, given the chain's."""
        latest = max(1, chain_latest - self.lag_ledgers)
        if self.reset_to is not None:
            latest = min(latest, self.reset_to)
        return min(chain_first, latest), latest

    def snapshot(self) -> dict[str, Any]:
        """The armed knobs as JSON-ready data (what ``GET /_simulator/faults`` on the RPC port returns)."""
        failure = self._failure
        return {
            "fail": None
            if failure is None
            else {
                "kind": failure.kind.value,
                "count": failure.remaining,
                "seconds": None if failure.until is None else max(0.0, failure.until - self.clock()),
                "retry_after": failure.retry_after,
            },
            "delay_ms": self.delay_ms,
            "lag_ledgers": self.lag_ledgers,
            "reset_to": self.reset_to,
        }


_Failure = TypeVar("_Failure", RequestFailure, "RpcFailure")


def check_known(data: dict[str, Any], known: set[str]) -> None:
    """A control request's body names only faults this server knows.

    Raises:
        ValueError: naming the unknown ones and the known ones.
    """
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")


def duration_of(spec: dict[str, Any]) -> dict[str, Any]:
    """``count`` and ``seconds`` of a control request's ``fail`` spec, as ``fail_requests``
    keywords (None when absent)."""
    return {
        "count": None if spec.get("count") is None else int(spec["count"]),
        "seconds": None if spec.get("seconds") is None else float(spec["seconds"]),
    }


def _armed_for(count: int | None, seconds: float | None, now: float) -> tuple[int | None, float | None]:
    """``(count, until)`` of a failure armed for ``count`` requests or ``seconds`` from ``now``
    (neither: one request).

    Raises:
        ValueError: both given, or a negative one.
    """
    if count is not None and seconds is not None:
        raise ValueError("give count or seconds, not both")
    if (count is not None and count < 0) or (seconds is not None and seconds < 0):
        raise ValueError("count and seconds must not be negative")
    if count is None and seconds is None:
        count = 1
    return count, None if seconds is None else now + seconds


def _consume(failure: _Failure | None, now: float) -> tuple[_Failure | None, _Failure | None]:
    """An armed failure meeting one request: ``(what stays armed, what to answer with)``. A failure
    armed for some seconds answers until then; one armed for a count answers that many times."""
    if failure is None:
        return None, None
    if failure.until is not None:
        return (None, None) if now >= failure.until else (failure, failure)
    assert failure.remaining is not None
    if failure.remaining <= 0:
        return None, None
    return attrs.evolve(failure, remaining=failure.remaining - 1), failure
