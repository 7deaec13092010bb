"""Horizon's rate limiter: GCRA per client IP, as the ``throttled`` library behind Horizon does it.

Pure state, the clock passed in. Horizon builds it with ``RateQuota{MaxRate: PerHour(n), MaxBurst:
b}`` (the public SDF Horizon: 3600 an hour, burst 100). With ``T = 3600 s / n`` (the emission
interval) and ``L = b + 1``:

- each client has a theoretical arrival time ``tat`` (``now`` when unknown); a request would move
  it to ``new = max(tat, now) + T`` and is allowed iff ``now >= new - L*T``: a burst of ``L``
  requests, then one per ``T``;
- ``ttl`` is ``new - now`` when allowed, else ``tat - now``; the headers are
  ``X-RateLimit-Limit: L``, ``X-RateLimit-Remaining: floor((L*T - ttl) / T)`` (0 when negative),
  ``X-RateLimit-Reset: ceil(ttl)`` and, when limited, ``Retry-After: ceil(new - L*T - now)``.

Page requests take one token each (Horizon's middleware); a stream takes one when it opens and one
each time a new ledger wakes it (Horizon's ``StreamHandler`` checks the limiter on every loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs


@attrs.frozen
class RateDecision:
    limited: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float | None

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Horizon's (throttled's) headers for this decision."""
        out = [
            (b"x-ratelimit-limit", str(self.limit).encode()),
            (b"x-ratelimit-remaining", str(self.remaining).encode()),
            (b"x-ratelimit-reset", str(math.ceil(self.reset_after)).encode()),
        ]
        if self.retry_after is not None:
            out.append((b"retry-after", str(math.ceil(self.retry_after)).encode()))
        return out


@attrs.define
class RateLimiter:
    """GCRA with ``per_hour`` requests an hour and bursts of ``burst + 1``, per client key.

    Raises:
        ValueError: ``per_hour`` < 1 or ``burst`` < 0.
    """

    per_hour: int
    burst: int
    clock: Callable[[], float]
    _tat: dict[str, int] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        if self.per_hour < 1 or self.burst < 0:
            raise ValueError("rate limit must be >= 1 per hour and burst >= 0")

    @property
    def interval(self) -> float:
        return 3600.0 / self.per_hour

    def take(self, key: str) -> RateDecision:
        """One request from ``key``: allowed (and counted) or limited."""
        # Integer nanoseconds, as Go's time.Duration: floats would round 0.3 / 0.1 down to 2.
        now = round(self.clock() * 1e9)
        t = 3600 * 10**9 // self.per_hour
        limit = self.burst + 1
        tolerance = t * limit
        tat = self._tat.get(key, now)
        new = max(tat, now) + t
        allow_at = new - tolerance
        retry: float | None = None
        if now < allow_at:
            ttl = tat - now
            retry = (allow_at - now) / 1e9
        else:
            ttl = new - now
            self._tat[key] = new
        spare = tolerance - ttl
        remaining = spare // t if spare > -t else 0
        return RateDecision(retry is not None, limit, max(0, remaining), ttl / 1e9, retry)
