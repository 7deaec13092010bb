"""The liveness rules as the code had them before issue 23, in ``actors.liveness``'s shape.

Only for ``tests/election/test_liveness_simulation.py``: to show that the simulation finds what issue 23
found (a job left leaderless by the balanced share; a probe of ``/`` hiding failing requests; a
failing node counted healthy for two TTLs). Each difference names the old code it copies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from actors.liveness import (  # noqa: F401  (re-exported: the simulation uses them unchanged)
    ADOPT_AFTER_TTLS,
    HEALTHY_WITHIN_TTLS,
    LAST_RESORT_TTLS,
    MAX_RANK_DELAY,
    OVER_TICKS,
    RANK_STEP,
    SHARE_RECHECK_TTLS,
    BalanceState,
    Campaign,
    HoldOff,
    PeerHealth,
    Verdict,
    decide,
    preference,
)


@attrs.define
class SourceHealth:
    """actors/health.py before: any success (a probe of ``/`` included) clears the failure."""

    last_ok: float | None = None
    failing_since: float | None = None

    def ok(self, now: float) -> None:
        self.last_ok, self.failing_since = now, None

    def failed(self, now: float) -> None:
        if self.failing_since is None:
            self.failing_since = now

    def probed(self, now: float, answered: bool, *, leading: bool = False, quarantine: float = 0.0) -> None:
        self.ok(now) if answered else self.failed(now)

    def failing_for(self, now: float) -> float:
        if self.failing_since is None:
            return 0.0
        return now - (self.last_ok if self.last_ok is not None else self.failing_since)

    def healthy(self, now: float, within: float) -> bool:
        return self.last_ok is not None and now - self.last_ok <= within and self.failing_since is None


def advertise(health: SourceHealth) -> PeerHealth | None:
    """report_health before: the last success only, and nothing while failing (the entry stays
    as it was, so peers count the node healthy for two TTLs after its last success)."""
    return PeerHealth(health.last_ok) if health.failing_since is None else None


def able_peers(entries: Mapping[str, PeerHealth | None], now: float, within: float) -> frozenset[str]:
    return frozenset(n for n, h in entries.items() if h is not None and h.last_ok is not None
                     and now - h.last_ok <= within)  # fmt: skip


@attrs.frozen
class Picture:
    """BalanceRule before: the share over every live node, rank among the live nodes."""

    node: str
    live: frozenset[str]
    jobs: tuple[str, ...]
    able: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    leaders: Mapping[str, str | None] = attrs.field(factory=dict)

    @property
    def share(self) -> int:
        return max(1, math.ceil(len(self.jobs) / len(self.live | {self.node})))

    def rank(self, job: str) -> int:
        return preference(job, self.live | {self.node}).index(self.node)

    def signature(self) -> tuple[object, ...]:
        return (self.live,)


def campaign(picture: Picture, job: str, held: Iterable[str], *, free_for: float | None,
             ttl: float) -> Campaign | HoldOff:  # fmt: skip
    """JobGate before: hold off at the share, whatever the lease; no placement."""
    if len(set(held) - {job}) >= picture.share:
        return HoldOff("share-reached")
    return Campaign(min(MAX_RANK_DELAY, picture.rank(job) * RANK_STEP))


def hand_back(picture: Picture, leading: Iterable[str], state: BalanceState) -> str | None:
    """BalanceRule.tick before."""
    held = sorted(set(leading) & set(picture.jobs))
    if len(held) <= picture.share:
        state.over_ticks = 0
        return None
    state.over_ticks += 1
    if state.over_ticks < OVER_TICKS:
        return None
    return max(held, key=lambda job: (picture.rank(job), job))
