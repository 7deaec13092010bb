"""Source-aware leadership: the node best able to reach the source is the one that leads.

A source that can tell its own health carries a :class:`SourceHealth` (``source.health``): when
its last request succeeded, since when every request has failed, and a cheap ``probe()``. Each job
then runs a :class:`SourceWatch` beside its Elector. Once per lease TTL it probes the source (a
standby; a leader's own requests are evidence enough), records the node as healthy in Redis when
the source answered recently (``ingestion:{J}:health``, a hash of node -> the Redis time of its
last success), and reads which other nodes are healthy. The rule (:func:`decide`, pure):

- **A leader hands over** when every request to its source has failed for ``handover_after`` *and*
  another node reports a healthy source: it ends its term gracefully (finish the commit, release
  with a notice) with reason ``source-unavailable``.
- **When nobody can reach the source**, the leader keeps the lease and keeps retrying; it says so
  once (``source-unavailable`` with ``handover: false``), not in a loop. No leadership change.
- **A standby campaigns** while its own source answered within two TTLs. One whose source does not
  answer holds off while another node is healthy (so a node that just handed over does not take
  the lease back until its source answers again), and campaigns only as a last resort, after a
  delay, when no node is healthy: someone must hold the lease.

Safety does not depend on any of this (the lease and the fencing token do); it decides only which
node leads.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from actors.lease_store import LeaseStore, RedisUnavailable

HEALTHY_WITHIN_TTLS = 2.0  # a source that answered within this many TTLs counts as reachable
LAST_RESORT_TTLS = 0.5  # an unhealthy node campaigns this many TTLs late, when nobody is healthy


@attrs.define
class SourceHealth:
    """What a source knows of its own reachability (trio time)."""

    last_ok: float | None = None
    failing_since: float | None = None  # the first failure since the last success

    def ok(self, now: float) -> None:
        self.last_ok = now
        self.failing_since = None

    def failed(self, now: float) -> None:
        if self.failing_since is None:
            self.failing_since = now

    def failing_for(self, now: float) -> float:
        """How long the source has been unreachable: 0 unless the latest request failed; then
        since the last success (the last evidence it answered), or the first failure if none."""
        if self.failing_since is None:
            return 0.0
        return now - (self.last_ok if self.last_ok is not None else self.failing_since)

    def healthy(self, now: float, within: float) -> bool:
        return self.last_ok is not None and now - self.last_ok <= within and self.failing_since is None


@runtime_checkable
class ProbedSource(Protocol):
    health: SourceHealth

    async def probe(self) -> bool:
        """One cheap, bounded request to the source; records the outcome in ``health``."""
        ...


class Verdict(enum.Enum):
    CAMPAIGN = "campaign"
    HOLD_OFF = "hold-off"  # another node can reach the source and this one cannot
    LAST_RESORT = "last-resort"  # nobody can: campaign late
    HAND_OVER = "hand-over"
    KEEP = "keep"


def decide(*, leading: bool, healthy: bool, failing_for: float, handover_after: float,
           peers_healthy: bool) -> Verdict:  # fmt: skip
    """The source-aware rule, from this node's view (pure)."""
    if leading:
        if failing_for >= handover_after and peers_healthy:
            return Verdict.HAND_OVER
        return Verdict.KEEP
    if healthy:
        return Verdict.CAMPAIGN
    return Verdict.HOLD_OFF if peers_healthy else Verdict.LAST_RESORT


@attrs.define
class SourceWatch:
    """One job's source watch on one node (a thin task around :func:`decide`)."""

    store: LeaseStore
    node: str
    source: ProbedSource
    ttl: float  # seconds: the lease TTL, the watch's period
    handover_after: float  # seconds
    log: Any
    observer: Any
    leading: Callable[[], int | None]  # the token of the term this node leads, None if none
    hand_over: Callable[[int], Awaitable[None]]  # end that term (ignored once it has ended)
    peers_healthy: bool = False
    _reported: bool | None = None  # the last state logged (log each change once)
    _checked: bool = False
    _said_everywhere: bool = False

    def healthy(self) -> bool:
        return self.source.health.healthy(trio.current_time(), HEALTHY_WITHIN_TTLS * self.ttl)

    def campaign_delay(self) -> float | None:
        """For the Elector, before each campaign: None (hold off) or the delay to campaign after.
        Until the first check is done nothing is known: campaign as if the source answered."""
        if not self._checked:
            return 0.0
        verdict = decide(leading=False, healthy=self.healthy(), failing_for=0.0,
                         handover_after=self.handover_after, peers_healthy=self.peers_healthy)  # fmt: skip
        if verdict is Verdict.CAMPAIGN:
            return 0.0
        if verdict is Verdict.HOLD_OFF:
            return None
        return LAST_RESORT_TTLS * self.ttl

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Started at once: a first probe must not hold up the node (a Horizon that does not answer
        # takes up to a TTL to say so), and the node campaigns as usual until it knows.
        task_status.started()
        await self.check()
        while True:
            # A leader looks twice per TTL: the hand-over comes at most half a TTL late.
            await trio.sleep(self.ttl / 2 if self.leading() is not None else self.ttl)
            await self.check()

    async def check(self) -> None:
        term = self.leading()  # the decision below is about this term, even if it ends meanwhile
        leading = term is not None
        health = self.source.health
        last_ok = health.last_ok
        # A standby probes every period; a leader's own requests are its evidence, unless none
        # succeeded for a period (a quiet stream, or a blackholed one: only a probe can tell).
        if not leading or last_ok is None or trio.current_time() - last_ok > self.ttl / 2:
            with trio.move_on_after(self.ttl / 2 if leading else self.ttl) as probing:
                await self.source.probe()
            if probing.cancelled_caught:
                health.failed(trio.current_time())
        now = trio.current_time()
        healthy = self.healthy()
        age_ms = round(1000 * (now - health.last_ok)) if health.last_ok is not None else None
        try:
            peers = await self.store.report_health(
                self.node, age_ms if healthy else None, round(1000 * HEALTHY_WITHIN_TTLS * self.ttl)
            )
            self.peers_healthy = bool(set(peers) - {self.node})
        except RedisUnavailable:
            pass  # keep the last view of the others; the Elector copes with Redis on its own
        self._checked = True
        self.observer.source_state(healthy, health.last_ok)
        if healthy != self._reported:
            self._reported = healthy
            if healthy:
                self._said_everywhere = False
                self.log.info("source-available")
            else:
                self.log.warning(
                    "source-unreachable", failing_s=round(health.failing_for(now), 3),
                    others_healthy=self.peers_healthy,
                )  # fmt: skip
        if term is None:
            return
        verdict = decide(leading=True, healthy=healthy, failing_for=health.failing_for(now),
                         handover_after=self.handover_after, peers_healthy=self.peers_healthy)  # fmt: skip
        if verdict is Verdict.HAND_OVER:
            self.log.warning(
                "source-unavailable", handover=True, failing_s=round(health.failing_for(now), 3)
            )
            await self.hand_over(term)
        elif health.failing_for(now) >= self.handover_after and not self._said_everywhere:
            # Nobody can reach the source: keep the lease and keep retrying; say so once.
            self._said_everywhere = True
            self.log.warning(
                "source-unavailable", handover=False, failing_s=round(health.failing_for(now), 3),
                reason="no node reports a reachable source",
            )  # fmt: skip
