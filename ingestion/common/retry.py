"""Retry rules both HTTP sources (Horizon, Stellar RPC) share: backoff, failover pacing, ``Retry-After``.

Pure: delays are returned as numbers, jitter comes from a uniform number passed in, and the
current time is an argument.
"""

from __future__ import annotations

import email.utils

import attrs


@attrs.frozen
class RetryPolicy:
    """Bounded exponential backoff with jitter, Retry-After handling, and failover pacing.

    ``delay(n)`` for the n-th consecutive failure (1-based) lies in ``[e/2, e]`` where
    ``e = min(cap, base * 2**(n-1))``: jittered so that several nodes do not retry in lockstep,
    never more than ``cap``. After ``attempts_per_url`` consecutive failures on one URL the
    follower moves to the next; ``malformed_retries`` bounds refetches of the same bad data.
    A stream that closes without records is reopened at once when it stayed open at least
    ``stream_quick_close`` seconds (a quiet stream that Horizon closed after its 55 s timeout:
    normal), and backs off only when it closed sooner (a server that closes at once). A 404 for an
    account-scoped collection is retried until every URL has answered 404 for
    ``not_found_give_up`` seconds (:class:`~ingestion.horizon.failures.NotFoundTracker`).
    """

    base: float = 0.25
    cap: float = 30.0
    attempts_per_url: int = 3
    malformed_retries: int = 5
    retry_after_cap: float = 120.0
    stream_quick_close: float = 10.0
    not_found_give_up: float = 120.0

    def __attrs_post_init__(self) -> None:
        if not (0 < self.base <= self.cap):
            raise ValueError(f"retry base {self.base} must be > 0 and <= cap {self.cap}")
        if self.attempts_per_url < 1:
            raise ValueError("attempts per URL must be at least 1")
        if self.malformed_retries < 0:
            raise ValueError("malformed retries must be >= 0")
        if self.retry_after_cap <= 0:
            raise ValueError("retry-after cap must be > 0")
        if self.stream_quick_close < 0:
            raise ValueError("stream quick-close threshold must be >= 0")
        if self.not_found_give_up < 0:
            raise ValueError("not-found give-up time must be >= 0")

    def delay(self, attempt: int, u: float) -> float:
        """Seconds to wait before retry number ``attempt`` (>= 1); ``u`` is uniform in [0, 1)."""
        exponent = min(max(attempt, 1) - 1, 62)  # 2**62 * base overflows nothing and exceeds cap
        ceiling = min(self.cap, self.base * 2.0**exponent)
        return ceiling * (0.5 + 0.5 * u)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    ``now`` is the current Unix time (only used for the date form). Returns None when the header
    is absent or unparseable, and never a negative number.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive result means a sloppy header
        return None
    return max(0.0, when.timestamp() - now)
