"""Spreading the leadership of many jobs over the live nodes: the gate and the actor.

Safety stays with each job's lease and fencing token; the balancer only decides *when a node
campaigns* and *when it hands a lease back*, so a wrong decision (a stale view of the live nodes, a
clock jump, a pause) can delay work but never create two writers. The decisions themselves are
:mod:`actors.liveness`'s (pure): the share over the nodes able to lead the node's jobs, the
placement of free leases (the best-ranked able node with room campaigns at once), adoption (a
lease free for a TTL is campaigned for even at the share), and the hand-back of the worst-placed
job another able node would take, after ``OVER_TICKS`` ticks over the share.

- Live nodes heartbeat into a Redis sorted set scored with Redis ``TIME`` (:class:`NodeRegistry`);
  a node is live while its last heartbeat is younger than the liveness window.
- Which nodes are able to lead a job comes from its source watch (``ingestion:{J}:health``); a job
  without one counts every live node. Which node leads a job comes from its Elector.

:class:`Balancer` is the thin actor: it heartbeats, builds the node's :class:`Picture` and asks an
Elector to hand back when the rules say so. Each job's Elector asks its :class:`JobGate` before
every campaign.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import trio

from actors.lease_store import NodeRegistry, RedisUnavailable
from actors.liveness import (  # noqa: F401  (re-exported)
    MAX_RANK_DELAY,
    OVER_TICKS,
    RANK_STEP,
    SHARE_RECHECK_TTLS,
    BalanceState,
    Campaign,
    Picture,
    campaign,
    hand_back,
    preference,
    rendezvous_score,
)

RECHECK_TICKS = 4  # a held-off Elector asks again after this many ticks unless woken before
PENDING_FOR = 5.0  # seconds an allowed campaign counts as a lease at most (if never answered)


class CampaignGate(Protocol):
    """What an Elector asks before each campaign."""

    @property
    def recheck(self) -> float:
        """Seconds to wait before asking again after a refusal."""
        ...

    async def campaign_delay(
        self, *, fresh_since: float | None = None, free_for: float | None = None
    ) -> float | None:
        """None: do not campaign now (ask again after ``recheck``, on a release notice or when
        woken); else campaign after this many seconds. ``fresh_since``: decide on a view of the
        live nodes read since then (when a release notice or a wake-up arrived: a node that left
        the registry before it released, a drained or exiting one, is seen gone; None: a view
        up to a tick old will do). ``free_for``: how long the Elector knows the lease to have
        been free (None: held, or not known)."""
        ...

    def campaign_done(self) -> None:
        """The campaign that ``campaign_delay`` allowed has its answer (won, lost or unknown)."""
        ...


@attrs.define
class BalanceRule:
    """The balancing rules over the live nodes alone (every node able to lead every job): a
    plain-data front to :mod:`actors.liveness` for callers without health or leader views."""

    node: str
    jobs: tuple[str, ...]
    live: tuple[str, ...] = ()
    state: BalanceState = attrs.Factory(BalanceState)

    def __attrs_post_init__(self) -> None:
        self.live = tuple(sorted(set(self.live) | {self.node}))

    @property
    def picture(self) -> Picture:
        return Picture(self.node, frozenset(self.live), self.jobs)

    @property
    def share(self) -> int:
        return self.picture.share

    @property
    def over_ticks(self) -> int:
        return self.state.over_ticks

    def rank(self, job: str) -> int:
        return self.picture.rank(job)

    def campaign_delay(self, job: str, held: Iterable[str]) -> float | None:
        held = set(held) - {job}
        # What this node holds is all it knows of the leaders: the placement counts it.
        picture = attrs.evolve(self.picture, leaders=dict.fromkeys(held, self.node))
        decision = campaign(picture, job, held, free_for=None, ttl=1.0)
        return decision.delay if isinstance(decision, Campaign) else None

    def tick(self, live: Iterable[str], held: Iterable[str]) -> str | None:
        self.live = tuple(sorted(set(live) | {self.node}))
        return hand_back(self.picture, held, self.state)


@attrs.define
class JobGate:
    """One job's view of the node's balancer, for its Elector."""

    balancer: Balancer
    job: str

    @property
    def recheck(self) -> float:
        # At the share, the Elector looks at the lease again this often (adoption); otherwise a
        # safety net only: the balancer wakes held-off Electors when the picture changes.
        return min(self.balancer.interval * RECHECK_TICKS, SHARE_RECHECK_TTLS * self.balancer.ttl)

    async def campaign_delay(
        self, *, fresh_since: float | None = None, free_for: float | None = None
    ) -> float | None:
        return await self.balancer.campaign_delay(self.job, fresh_since=fresh_since, free_for=free_for)

    def campaign_done(self) -> None:
        self.balancer.campaign_done(self.job)


@attrs.define
class Balancer:
    """The node's balancing actor: one per node process, for all its jobs.

    ``leading(job)`` tells whether this node leads ``job`` now; ``hand_back(job)`` asks that job's
    Elector to end its term gracefully; ``able(job)``: the other nodes able to lead it (None:
    unknown, every live node); ``holder(job)``: who leads it as this node last saw (None: free or
    unknown). ``interval`` is the tick; the liveness window is ``live_window_ms``; ``ttl`` the
    lease TTL (seconds).
    """

    registry: NodeRegistry
    node: str
    jobs: Sequence[str]
    leading: Callable[[str], bool]
    hand_back: Callable[[str], Any]  # async
    wake: Callable[[str], None]  # wake that job's Elector (if it is held off)
    log: Any
    interval: float
    live_window_ms: int
    ttl: float = 1.0
    able: Callable[[str], frozenset[str] | None] = lambda job: None
    holder: Callable[[str], str | None] = lambda job: None
    live: tuple[str, ...] = ()
    state: BalanceState = attrs.Factory(BalanceState)
    stopped: set[str] = attrs.Factory(set)  # jobs stopped for good on this node
    # job -> when a campaign was allowed, until its answer: campaigns in flight count as leases, so
    # that the node's Electors, asking side by side, cannot all go for a lease at once.
    _pending: dict[str, float] = attrs.Factory(dict)
    _adopting: set[str] = attrs.Factory(set)
    _seen: set[str] = attrs.Factory(set)  # every node ever seen live in the registry
    _viewed_at: float = -math.inf
    _view_from: float = -math.inf  # when the read that gave the view started
    _registry_down: bool = False
    _last_signature: tuple[object, ...] | None = None
    draining: bool = False  # the node is shutting down: hand nothing back, campaign for nothing
    _refreshing: tuple[float, trio.Event] | None = None  # the read in flight: when it started
    _last_leading: frozenset[str] = frozenset()
    _hosted: dict[str, frozenset[str]] = attrs.Factory(dict)  # job -> the other live nodes hosting it
    _held_off: set[str] = attrs.Factory(set)  # jobs whose Elector was told to hold off
    # Whether this balancer's node leaves the registry when it stops: False for a second
    # balancer of the node (a backfill's ranges), whose end must not unregister the node.
    owns_registration: bool = True
    # The longest wait of a fallback campaign (for a job placed on another node): longer for
    # jobs that every live node starts a little apart (a backfill's ranges, noticed by polling).
    max_rank_delay: float = MAX_RANK_DELAY

    def __attrs_post_init__(self) -> None:
        self.live = (self.node,)

    def gate(self, job: str) -> JobGate:
        return JobGate(self, job)

    def picture(self) -> Picture:
        jobs = tuple(j for j in self.jobs if j not in self.stopped)
        able = {j: a for j in jobs if (a := self._able(j)) is not None}
        leaders = {j: (self.node if self.leading(j) else self.holder(j)) for j in jobs}
        departed = frozenset(self._seen - set(self.live))
        return Picture(self.node, frozenset(self.live), jobs, able, leaders, departed)

    def _able(self, job: str) -> frozenset[str] | None:
        """The other nodes able to lead ``job``: its source watch's say, else the live nodes that
        host it (as the registry says; a node that says nothing there hosts every job)."""
        able = self.able(job)
        return able if able is not None else self._hosted.get(job)

    def job_stopped(self, job: str) -> None:
        """``job`` failed for good on this node: it no longer counts in the share."""
        self.stopped.add(job)
        self._pending.pop(job, None)
        self._wake_standbys()

    def leading_jobs(self) -> set[str]:
        return {job for job in self.jobs if self.leading(job)}

    def held(self) -> set[str]:
        """The jobs this node leads or is campaigning for right now."""
        now = trio.current_time()
        self._pending = {j: t for j, t in self._pending.items() if now - t < PENDING_FOR}
        return self.leading_jobs() | set(self._pending)

    def campaign_done(self, job: str) -> None:
        """A campaign has its answer. If it did not win, its slot is free again: the Electors
        held off meanwhile may now go (one of them may find a free lease). An adopted lease is
        remembered with the picture it was adopted under (not handed back until that changes)."""
        self._pending.pop(job, None)
        adopting = job in self._adopting
        self._adopting.discard(job)
        if self.leading(job):
            if adopting:
                self.state.adopt(job, self.picture())
        else:
            self._wake_held_off()

    def _wake_held_off(self) -> None:
        for job in sorted(self._held_off):
            self.wake(job)
        self._held_off.clear()

    async def campaign_delay(
        self, job: str, *, fresh_since: float | None = None, free_for: float | None = None
    ) -> float | None:
        if self.draining or job in self.stopped:
            return None
        if fresh_since is not None:
            await self._refresh(since=fresh_since)
        elif trio.current_time() - self._viewed_at > self.interval:
            await self._refresh()
        decision = campaign(
            self.picture(), job, self.held(), free_for=free_for, ttl=self.ttl,
            max_rank_delay=self.max_rank_delay,
        )  # fmt: skip
        if not isinstance(decision, Campaign):
            self._held_off.add(job)
            return None
        self._held_off.discard(job)
        self._pending[job] = trio.current_time()
        if decision.adopting:
            self._adopting.add(job)
            self.log.info("campaign-adopting", free_s=round(free_for or 0.0, 3))
        return decision.delay

    async def _refresh(self, *, since: float | None = None) -> None:
        """Heartbeat and read the live nodes. Concurrent callers share one read; with ``since``,
        only a read started at or after it (the view is kept when it comes from one): one
        started before may predate what the caller was told (a release notice sent after its
        node left the registry)."""
        if since is not None and self._view_from >= since:
            return
        while self._refreshing is not None:
            started, done = self._refreshing
            await done.wait()
            if since is None or started >= since:
                return
        done = trio.Event()
        started = trio.current_time()
        self._refreshing = (started, done)
        try:
            await self._read_view(started)
        finally:
            done.set()
            self._refreshing = None

    async def _read_view(self, started: float) -> None:
        try:
            hosting = [j for j in self.jobs if j not in self.stopped]
            live = await self.registry.heartbeat(self.node, self.live_window_ms, hosting=hosting)
        except RedisUnavailable as exc:
            if not self._registry_down:
                self._registry_down = True
                self.log.warning("balancer-registry-unavailable", error=str(exc))
            return  # keep the last view: every decision stays safe, only balance may lag
        if self._registry_down:
            self._registry_down = False
            self.log.info("balancer-registry-available")
        self._viewed_at, self._view_from = trio.current_time(), started
        self.live = tuple(sorted(set(live) | {self.node}))
        self._seen |= set(self.live)
        hosts = self.registry.hosts
        others = [n for n in self.live if n != self.node]
        self._hosted = {
            job: frozenset(n for n in others if n not in hosts or job in hosts[n]) for job in self.jobs
        }
        picture = self.picture()
        signature = (picture.signature(), picture.share)
        if signature != self._last_signature:
            self._last_signature = signature
            self.log.info("balancer-view", live=list(self.live), share=picture.share, jobs=len(picture.jobs))
            self._wake_standbys()

    def _wake_standbys(self) -> None:
        """The picture changed: every job this node does not lead should be asked about again."""
        leading = self.leading_jobs()
        for job in self.jobs:
            if job not in leading and job not in self.stopped:
                self.wake(job)
        self._held_off.clear()

    async def tick(self) -> None:
        if self.draining:
            return
        await self._refresh()
        leading = self.leading_jobs()
        if leading < self._last_leading:
            self._wake_standbys()  # this node leads fewer jobs: room for others
        self._last_leading = frozenset(leading)
        picture = self.picture()
        job = hand_back(picture, leading, self.state)
        if job is not None:
            self.log.info(
                "handing-back", handed_job=job, share=picture.share, leading=len(leading),
                live=len(self.live),
            )  # fmt: skip
            await self.hand_back(job)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick until cancelled; on the way out, leave the registry (so the others' shares grow
        at once) under a short shielded scope."""
        try:
            # The first view before any Elector asks; a second one a tick later, so that nodes
            # started together see each other before the first campaigns (no one takes all).
            await self._refresh()
            await trio.sleep(self.interval)
            await self._refresh()
            task_status.started()
            while True:
                await trio.sleep(self.interval)
                await self.tick()
        finally:
            await self.leave()

    async def leave(self) -> None:
        if not self.owns_registration:
            return
        with trio.move_on_after(1.0, shield=True):
            try:
                await self.registry.leave(self.node)
            except RedisUnavailable as exc:
                self.log.warning("balancer-leave-failed", error=str(exc))
