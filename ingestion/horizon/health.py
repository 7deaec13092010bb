"""Pure decisions about one Horizon server as its root resource and its headers describe it.

No I/O, no clock: ``ingestion/horizon/source.py`` fetches ``/`` and reads the headers, then asks here.

History gap. Horizon keeps only recent history (``HISTORY_RETENTION_COUNT``; the public SDF Horizon
keeps about a year) and, for ``order=asc``, silently moves a cursor older than its
``history_elder_ledger`` up to that ledger: records in between are skipped without a word. A
paging token is a TOID (``ledger << 32 | tx << 12 | op``; effects ``"<toid>-<n>"``), so the
cursor's ledger is ``toid >> 32``. Records strictly after a cursor in ledger ``L`` may still be in
``L`` itself (the rest of its operations), so Horizon still holds all of them only if ``L`` is at
or after the elder ledger; for ``/ledgers`` (one record per ledger, the cursor's own ledger already
read) ``L + 1`` is enough. The check is conservative: a cursor on the very last record of the
ledger before the elder one is reported although nothing was lost.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ingestion.common.paging import TOID_LEDGER_SHIFT, InvalidPagingToken, toid, token_key


@attrs.frozen
class RootInfo:
    """What Horizon's root resource (``GET /``) says about its ledgers."""

    history_elder_ledger: int
    history_latest_ledger: int
    core_latest_ledger: int

    @classmethod
    def parse(cls, content: bytes | str) -> RootInfo:
        """Parse a root resource.

        Raises:
            ValueError: not JSON, or a ledger field is missing or not a non-negative integer.
        """
        doc = json.loads(content)
        if not isinstance(doc, dict):
            raise ValueError("Horizon's root resource is not a JSON object")
        return cls(
            history_elder_ledger=_ledger(doc, "history_elder_ledger"),
            history_latest_ledger=_ledger(doc, "history_latest_ledger"),
            core_latest_ledger=_ledger(doc, "core_latest_ledger"),
        )


def _ledger(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"Horizon's root resource has no valid {name}: {value!r}")
    return value


def cursor_ledger(cursor: str) -> int | None:
    """The ledger a paging token lies in; None for ``"now"``, ``"0"`` and any token in ledger 0
    (there is none: the first ledger is 1, so such a cursor means "from the start", like "0").

    Raises:
        InvalidPagingToken: not a paging token.
    """
    if cursor in ("now", "0"):
        return None
    return (token_key(cursor)[0] >> TOID_LEDGER_SHIFT) or None


@attrs.frozen
class HistoryGap:
    """The cursor lies before the server's retained history: records after it are gone."""

    cursor: str
    cursor_ledger: int
    elder_ledger: int

    @property
    def resume_cursor(self) -> str:
        """The cursor just before the elder ledger's first record (for ``on_history_gap = skip``).

        ``toid(elder) - 1`` is the last possible TOID of the ledger before: every record of the
        elder ledger (its ledger record included, TOID ``toid(elder)``) sorts after it, and as a
        bare effects cursor it means after all of that operation's effects.
        """
        return str(toid(self.elder_ledger) - 1)


def history_gap(cursor: str, elder_ledger: int, resource: str) -> HistoryGap | None:
    """A :class:`HistoryGap` when resuming ``resource`` after ``cursor`` would silently skip
    records that a server whose oldest ledger is ``elder_ledger`` no longer has, else None.

    ``"now"`` and ``"0"`` never have a gap ("0" asks for whatever history the server keeps); an
    elder ledger of 0 or 1 means the server keeps everything.
    """
    try:
        ledger = cursor_ledger(cursor)
    except InvalidPagingToken:
        return None  # the follower rejects a bad cursor with its own clear error
    if ledger is None or elder_ledger <= 1:
        return None
    first_needed = ledger + 1 if resource.endswith("/ledgers") else ledger
    if first_needed < elder_ledger:
        return HistoryGap(cursor, ledger, elder_ledger)
    return None


# --- rate-limit pacing ---------------------------------------------------------------------------


def parse_rate_headers(headers: Any) -> tuple[int, int, float] | None:
    """``(limit, remaining, reset)`` from Horizon's ``X-RateLimit-*`` headers (any mapping with
    case-insensitive ``get``), or None when absent or unparseable (a Horizon without a limiter)."""
    try:
        limit = int(headers.get("x-ratelimit-limit"))
        remaining = int(headers.get("x-ratelimit-remaining"))
        reset = float(headers.get("x-ratelimit-reset"))
    except (TypeError, ValueError):
        return None
    if limit < 1 or remaining < 0 or reset < 0:
        return None
    return limit, remaining, reset


class RatePacer:
    """Paces requests to one Horizon so that a catch-up spends its rate limit without a 429.

    Horizon's limiter is GCRA (see :mod:`ingestion.simulator.ratelimit`): bursts of ``L`` requests
    (``X-RateLimit-Limit``), then one per emission interval ``T``. A response says how many
    requests are left now (``R``, ``X-RateLimit-Remaining``) and when the budget is whole again
    (``X-RateLimit-Reset``: ``ceil(ttl)``). Derivation of the schedule:

    - After a response observed at ``t0``, the server's arrival time is at most ``t0 + (L - R) T``
      (``R = floor(L - ttl / T)``), and every request we send moves it by ``T``. So the
      ``(k + 1)``-th request sent after the observation is surely allowed at
      ``t0 + max(0, k + 1 - R) * T``: ``R`` at once, then one per ``T``. Time that passes is
      credited (an old observation allows everything it allowed, and more).
    - ``T`` is not sent; ``R = floor(L - ttl / T)`` and ``ttl <= reset`` give ``T < reset / (L - R - 1)``,
      an upper bound (tightest when ``R`` is 0: ``(L T) / (L - 1)`` plus the rounding of ``reset``,
      about 1 % slow for the public Horizon's ``L = 101``). The smallest bound seen is used.
    - Requests still in flight when a response is observed may not be counted in it: they are
      counted as sent after it. Requests of other clients behind the same address (other jobs of
      this process share the pacer; other processes do not) show in the next response.

    A 429 still happens if another process spends the budget; its ``Retry-After`` is honoured by
    the follower. Without ``X-RateLimit`` headers (no limiter) nothing is paced. Pure: the time
    is passed in.
    """

    def __init__(self) -> None:
        self.limit: int | None = None
        self._at = 0.0
        self._remaining = 0
        self._sent_since = 0
        self._in_flight = 0
        self.interval: float | None = None  # upper bound of the emission interval T

    def reserve(self, now: float) -> float:
        """Count one request about to be sent; return how long to wait before sending it."""
        self._in_flight += 1
        if self.limit is None:
            return 0.0
        k = self._sent_since
        self._sent_since += 1
        over = k + 1 - self._remaining
        if over <= 0:
            return 0.0
        interval = self.interval if self.interval is not None else self._fallback_interval
        return max(0.0, self._at + over * interval - now)

    def answered(self, now: float, rate: tuple[int, int, float] | None) -> None:
        """A reserved request got its answer (``rate`` from :func:`parse_rate_headers`), or was
        abandoned (``rate`` None)."""
        self._in_flight = max(0, self._in_flight - 1)
        if rate is None:
            return
        limit, remaining, reset = rate
        if limit != self.limit:
            self.interval = None  # another quota: forget what the old one taught
        self.limit = limit
        spent = limit - remaining - 1
        if spent > 0:
            bound = reset / spent
            if self.interval is None or bound < self.interval:
                self.interval = bound
        self._fallback_interval = max(reset, 1.0)
        self._at = now
        self._remaining = remaining
        self._sent_since = self._in_flight

    _fallback_interval = 1.0


# --- staleness -----------------------------------------------------------------------------------


@attrs.frozen
class Staleness:
    """The Horizon in use is behind: its history lags its own stellar-core, or another URL."""

    horizon: str
    history_latest_ledger: int
    core_latest_ledger: int
    freshest: str | None  # the URL with the newest history, if another one is ahead
    freshest_ledger: int | None

    @property
    def switch_to(self) -> str | None:
        """Where to go: the freshest other URL when it is ahead of this one, else None."""
        if self.freshest is None or self.freshest_ledger is None:
            return None
        return self.freshest if self.freshest_ledger > self.history_latest_ledger else None


def assess_staleness(
    current: str, roots: dict[str, RootInfo | None], max_lag: int
) -> Staleness | None:
    """Whether the Horizon at ``current`` is stale, from every URL's root (None: unreadable).

    A Horizon whose ingestion stalled still answers 200, with nothing new. It is stale when its
    ``history_latest_ledger`` is more than ``max_lag`` ledgers behind its own
    ``core_latest_ledger`` or behind another URL's ``history_latest_ledger``. An unreadable root
    says nothing (failures are the follower's business).
    """
    mine = roots.get(current)
    if mine is None:
        return None
    others = {url: root for url, root in roots.items() if url != current and root is not None}
    freshest = max(others, key=lambda url: others[url].history_latest_ledger, default=None)
    best = None if freshest is None else others[freshest].history_latest_ledger
    behind_core = mine.core_latest_ledger - mine.history_latest_ledger
    behind_best = 0 if best is None else best - mine.history_latest_ledger
    if behind_core <= max_lag and behind_best <= max_lag:
        return None
    return Staleness(
        current, mine.history_latest_ledger, mine.core_latest_ledger, freshest, best
    )
