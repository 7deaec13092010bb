"""Source-aware leadership: the node best able to reach the source is the one that leads.

A source that can tell its own health carries a :class:`~actors.liveness.SourceHealth`
(``source.health``): when the job's own requests last succeeded, since when they have failed, and
a ``probe()`` of the job's own resource. Each job then runs a :class:`SourceWatch` beside its
Elector. Once per lease TTL (twice while leading) it probes the source when the job's own
requests gave no recent evidence, records the node in Redis (``ingestion:{J}:health``: the Redis
time of its last success and, while failing, since when it fails), and reads which nodes are
able to lead the job. The rules are :mod:`actors.liveness`'s (rule 1, :func:`decide`):

- **A leader hands over** when every request to its source has failed for ``handover_after`` *and*
  another node reports a working source: it ends its term gracefully with reason
  ``source-unavailable``. A probe never clears a failure the job's own requests set.
- **When nobody can reach the source**, the leader keeps the lease and keeps retrying; it says so
  once (``source-unavailable`` with ``handover: false``), not in a loop. No leadership change.
- **A standby campaigns** while its own source works. One whose source fails holds off while
  another node's works, and campaigns only as a last resort, after a delay, when no node's does.

An idle standby's report rides on its campaign: the Elector tells the watch when it will campaign
next (:meth:`SourceWatch.campaign_at`), the watch looks at the source just before, and the acquire
script records the report and answers the able nodes (one round trip per TTL, not two). When no
campaign carried it (held off, Redis unreachable, woken late) the watch reports on its own, a
quarter TTL after the campaign was due. A failing look is reported at once (peers stop counting
the node within a probe), and a campaign put off again and again does not put off the look.

Safety does not depend on any of this (the lease and the fencing token do); it decides only which
node leads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from actors.lease_store import HealthReport, LeaseStore, RedisUnavailable
from actors.liveness import (  # the sources import SourceHealth from here
    HEALTHY_WITHIN_TTLS,
    LAST_RESORT_TTLS,
    SourceHealth,
    Verdict,
    advertise,
    decide,
)


@runtime_checkable
class ProbedSource(Protocol):
    health: SourceHealth

    async def probe(self) -> bool:
        """One bounded request for the job's own resource: whether it answered. The watch records
        the answer in ``health`` (a leader's probe never clears its own requests' failure)."""
        ...


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
    able: frozenset[str] | None = None  # the other nodes able to lead the job (None: not read yet)
    _reported: bool | None = None  # the last state logged (log each change once)
    _checked: bool = False
    _said_everywhere: bool = False
    # The carried report (see the module docstring): when the Elector campaigns next, when the
    # watch looks next (moved by campaign_at), whether a check left its report to that campaign,
    # and when a campaign last carried one.
    _campaign_at: float | None = None
    _due: float = float("inf")
    _moved: trio.Event = attrs.Factory(trio.Event)
    _left_to_campaign: float | None = None
    _left_at: float = 0.0  # the look (its _last_check) whose report was left to the campaign
    _report_look: float | None = None  # the look the last report() described
    _carried_look: float | None = None  # the look the last carried report described
    _last_check: float | None = None
    _looked: bool = False  # the source was looked at (report() has something to say)

    @property
    def lead(self) -> float:
        """How long before a standby's campaign the watch looks at the source."""
        return min(self.ttl / 4, 0.5)

    @property
    def slack(self) -> float:
        """How much later than announced a campaign may come and still carry the report (the
        Elector's jitter); also how much longer than a TTL the watch may wait to look."""
        return 0.1 * self.ttl

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
            # A leader looks twice per TTL: the hand-over comes at most half a TTL late. A
            # standby looks once per TTL, moved to just before its next campaign (campaign_at).
            self._due = trio.current_time() + (self.ttl / 2 if self.leading() is not None else self.ttl)
            if self._left_to_campaign is not None:
                self._due = self._left_to_campaign + self.ttl / 4  # report then, if not carried
            elif (
                self._campaign_at is not None
                and self._campaign_at > trio.current_time()
                and self.leading() is None
            ):
                self._due = self._aligned(self._campaign_at)
            while trio.current_time() < self._due:
                self._moved = trio.Event()
                with trio.move_on_at(self._due):
                    await self._moved.wait()
            if self._left_to_campaign is not None:
                self._left_to_campaign = None
                if self._carried_look is not None and self._carried_look >= self._left_at:
                    continue  # the campaign carried it (a report of that look or a later one)
                if trio.current_time() - self._left_at < self.ttl / 2:
                    await self._report()  # the look is fresh: report it, do not probe again
                    continue
            await self.check()

    def _aligned(self, campaign_at: float) -> float:
        """When to look before a campaign at ``campaign_at``: ``lead`` before it, but not sooner
        than half a TTL after the last look (the probe rate stays bounded) and not later than a
        TTL (and the slack) after it (a campaign put off, by a gate or a release notice, does not
        put off the look: the watch then reports on its own, and peers' view stays fresh)."""
        last = self._last_check or 0.0
        return min(max(campaign_at - self.lead, last + self.ttl / 2), last + self.ttl + self.slack)

    def campaign_at(self, at: float) -> None:
        """The Elector: this standby campaigns next at ``at`` (unless woken sooner). The watch
        looks at the source just before, and leaves its report to that campaign to carry."""
        self._campaign_at = at
        if self._left_to_campaign is None and self.leading() is None:
            self._due = self._aligned(at)
            self._moved.set()

    def report(self) -> HealthReport | None:
        """For the Elector's campaign: this node's source health now (None before the first
        look, when nothing is known)."""
        if not self._looked:
            return None
        self._report_look = self._last_check
        now = trio.current_time()
        said = advertise(self.source.health)  # with "failing since": peers stop counting it at once
        return HealthReport(
            age_ms=round(1000 * (now - said.last_ok)) if said.last_ok is not None else None,
            window_ms=round(1000 * HEALTHY_WITHIN_TTLS * self.ttl),
            failing_ms=(
                round(1000 * (now - said.failing_since)) if said.failing_since is not None else None
            ),
        )

    def carried(self, able: tuple[str, ...] | None) -> None:
        """The Elector's campaign carried :meth:`report`; ``able``: the answer's able nodes."""
        if able is None:
            return
        self._carried_look = self._report_look
        self.able = frozenset(able) - {self.node}
        self.peers_healthy = bool(self.able)

    async def check(self) -> None:
        term = self.leading()  # the decision below is about this term, even if it ends meanwhile
        leading = term is not None
        health = self.source.health
        last_ok = health.last_ok
        # A standby probes every period; a leader's own requests are its evidence, unless none
        # succeeded for a period (a quiet stream, or a blackholed one: only a probe can tell).
        if not leading or last_ok is None or trio.current_time() - last_ok > self.ttl / 2:
            answered = False
            with trio.move_on_after(self.ttl / 2 if leading else self.ttl):
                answered = await self.source.probe()
            health.probed(
                trio.current_time(), answered, leading=leading, quarantine=self.handover_after
            )
        now = self._last_check = trio.current_time()
        healthy = self.healthy()
        self._looked = True
        campaign = self._campaign_at
        if (
            not leading
            and healthy  # a failing source is said at once: peers stop counting this node
            and campaign is not None
            and 0 <= campaign - now <= self.lead + self.slack
        ):
            # The campaign just ahead carries this report (run() reports it if none did).
            self._left_to_campaign, self._left_at = campaign, now
        else:
            await self._report()
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

    async def _report(self) -> None:
        report = self.report()
        assert report is not None
        try:
            peers = await self.store.report_health(
                self.node, report.age_ms, report.window_ms, report.failing_ms
            )
            self.able = frozenset(peers) - {self.node}
            self.peers_healthy = bool(self.able)
        except RedisUnavailable:
            pass  # keep the last view of the others; the Elector copes with Redis on its own

    async def forget(self) -> None:
        """The job stopped on this node for good: remove its health entries, so that no peer
        counts this node as able to lead the job (bounded, shielded: this is cleanup)."""
        with trio.move_on_after(1.0, shield=True):
            try:
                await self.store.forget_health(self.node)
            except RedisUnavailable:
                pass  # the entry ages out after HEALTHY_WITHIN_TTLS TTLs
