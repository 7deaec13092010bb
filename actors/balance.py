"""Spreading the leadership of many jobs over the live nodes: the rule, the gate, the actor.

Safety stays with each job's lease and fencing token; the balancer only decides *when a node
campaigns* and *when it hands a lease back*, so a wrong decision (a stale view of the live nodes, a
clock jump, a pause) can delay work but never create two writers.

The rule (:class:`BalanceRule`, pure):

- Live nodes heartbeat into a Redis sorted set scored with Redis ``TIME`` (:class:`NodeRegistry`);
  a node is live while its last heartbeat is younger than the liveness window.
- A node leads at most ``share = ceil(jobs / live nodes)`` jobs. It campaigns for a free job only
  while it leads (or is about to lead) fewer.
- Jobs are tried in rendezvous-hash order: for each job the live nodes are ranked by
  ``hash(job, node)``, and a node waits ``rank * step`` before campaigning, so when a job is free
  the best-ranked node with room takes it. The placement is sticky: a joining node takes over
  only the jobs it must for the shares to even out, about ``jobs / (n + 1)``.
- A node over its share for two consecutive ticks hands back one lease per tick (its worst-ranked
  job), gracefully: the in-flight commit finishes, the lease is released, a notice wakes the
  others. While membership is stable nobody is over, so nothing moves.

:class:`Balancer` is the thin actor: it heartbeats, feeds the rule the live nodes and the jobs its
node leads, and asks an Elector to hand back when the rule says so. Each job's Elector asks its
:class:`JobGate` before every campaign.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import trio

from actors.lease_store import NodeRegistry, RedisUnavailable

RANK_STEP = 0.05  # seconds a node waits per place it ranks below the best live node for a job
MAX_RANK_DELAY = 0.5  # seconds: the longest such wait
OVER_TICKS = 2  # consecutive ticks over the share before a lease is handed back
RECHECK_TICKS = 4  # a held-off Elector asks again after this many ticks unless woken before
FRESH_VIEW = 0.02  # seconds: a view younger than this counts as fresh
PENDING_FOR = 5.0  # seconds an allowed campaign counts as a lease at most (if never answered)


class CampaignGate(Protocol):
    """What an Elector asks before each campaign."""

    @property
    def recheck(self) -> float:
        """Seconds to wait before asking again after a refusal."""
        ...

    async def campaign_delay(self, *, fresh: bool = False) -> float | None:
        """None: do not campaign now (ask again after ``recheck``, on a release notice or when
        woken); else campaign after this many seconds. ``fresh``: decide on a view of the live
        nodes read now (after a release notice)."""
        ...

    def campaign_done(self) -> None:
        """The campaign that ``campaign_delay`` allowed has its answer (won, lost or unknown)."""
        ...


def rendezvous_score(job: str, node: str) -> int:
    digest = hashlib.blake2b(f"{job}\0{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preference(job: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` best first for ``job`` (highest rendezvous score; ties by name)."""
    return sorted(set(nodes), key=lambda n: (-rendezvous_score(job, n), n))


@attrs.define
class BalanceRule:
    """The balancing decisions of one node, as a pure state machine (no I/O, no clock)."""

    node: str
    jobs: tuple[str, ...]
    live: tuple[str, ...] = ()
    over_ticks: int = 0

    def __attrs_post_init__(self) -> None:
        self.live = tuple(sorted(set(self.live) | {self.node}))

    @property
    def share(self) -> int:
        return max(1, math.ceil(len(self.jobs) / len(self.live)))

    def rank(self, job: str) -> int:
        """This node's place (0 = best) among the live nodes for ``job``."""
        return preference(job, self.live).index(self.node)

    def campaign_delay(self, job: str, held: Iterable[str]) -> float | None:
        """None when this node already leads its share (``held``: the jobs it leads or is about to
        lead, ``job`` not counted); else how long to wait before campaigning for ``job``."""
        if len(set(held) - {job}) >= self.share:
            return None
        return min(MAX_RANK_DELAY, self.rank(job) * RANK_STEP)

    def tick(self, live: Iterable[str], held: Iterable[str]) -> str | None:
        """A new view of the live nodes and of the jobs this node leads; returns the job to hand
        back now, if any (one per tick, only after ``OVER_TICKS`` ticks over the share)."""
        self.live = tuple(sorted(set(live) | {self.node}))
        leading = sorted(set(held) & set(self.jobs))
        if len(leading) <= self.share:
            self.over_ticks = 0
            return None
        self.over_ticks += 1
        if self.over_ticks < OVER_TICKS:
            return None
        return max(leading, key=lambda job: (self.rank(job), job))  # the worst-placed one


@attrs.define
class JobGate:
    """One job's view of the node's balancer, for its Elector."""

    balancer: Balancer
    job: str

    @property
    def recheck(self) -> float:
        # A safety net only: the balancer wakes held-off Electors when the picture changes.
        return self.balancer.interval * RECHECK_TICKS

    async def campaign_delay(self, *, fresh: bool = False) -> float | None:
        return await self.balancer.campaign_delay(self.job, fresh=fresh)

    def campaign_done(self) -> None:
        self.balancer.campaign_done(self.job)


@attrs.define
class Balancer:
    """The node's balancing actor: one per node process, for all its jobs.

    ``leading(job)`` tells whether this node leads ``job`` now; ``hand_back(job)`` asks that job's
    Elector to end its term gracefully. ``interval`` is the tick; the liveness window is
    ``live_window_ms`` (a node silent longer is not counted).
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
    rule: BalanceRule = attrs.field(init=False)
    # job -> when a campaign was allowed, until its answer: campaigns in flight count as leases, so
    # that the node's Electors, asking side by side, cannot all go for a lease at once.
    _pending: dict[str, float] = attrs.Factory(dict)
    _viewed_at: float = -math.inf
    _registry_down: bool = False
    _last_share: int | None = None
    draining: bool = False  # the node is shutting down: hand nothing back, campaign for nothing
    _refreshing: trio.Event | None = None
    _last_leading: frozenset[str] = frozenset()
    _held_off: set[str] = attrs.Factory(set)  # jobs whose Elector was told to hold off

    def __attrs_post_init__(self) -> None:
        self.rule = BalanceRule(self.node, tuple(self.jobs))

    def gate(self, job: str) -> JobGate:
        return JobGate(self, job)

    def leading_jobs(self) -> set[str]:
        return {job for job in self.jobs if self.leading(job)}

    def held(self) -> set[str]:
        """The jobs this node leads or is campaigning for right now."""
        now = trio.current_time()
        self._pending = {j: t for j, t in self._pending.items() if now - t < PENDING_FOR}
        return self.leading_jobs() | set(self._pending)

    def campaign_done(self, job: str) -> None:
        """A campaign has its answer. If it did not win, its slot is free again: the Electors
        held off meanwhile may now go (one of them may find a free lease)."""
        self._pending.pop(job, None)
        if not self.leading(job):
            self._wake_held_off()

    def _wake_held_off(self) -> None:
        for job in sorted(self._held_off):
            self.wake(job)
        self._held_off.clear()

    async def campaign_delay(self, job: str, *, fresh: bool = False) -> float | None:
        if self.draining:
            return None
        age = trio.current_time() - self._viewed_at
        if age > (FRESH_VIEW if fresh else self.interval):
            await self._refresh()
        delay = self.rule.campaign_delay(job, self.held())
        if delay is None:
            self._held_off.add(job)
        else:
            self._held_off.discard(job)
            self._pending[job] = trio.current_time()
        return delay

    async def _refresh(self) -> None:
        """Heartbeat and read the live nodes (concurrent callers share one read)."""
        if self._refreshing is not None:
            await self._refreshing.wait()
            return
        self._refreshing = trio.Event()
        try:
            await self._read_view()
        finally:
            self._refreshing.set()
            self._refreshing = None

    async def _read_view(self) -> None:
        try:
            live = await self.registry.heartbeat(self.node, self.live_window_ms)
        except RedisUnavailable as exc:
            if not self._registry_down:
                self._registry_down = True
                self.log.warning("balancer-registry-unavailable", error=str(exc))
            return  # keep the last view: every decision stays safe, only balance may lag
        if self._registry_down:
            self._registry_down = False
            self.log.info("balancer-registry-available")
        self._viewed_at = trio.current_time()
        before = self.rule.live
        self.rule.live = tuple(sorted(set(live) | {self.node}))
        if self.rule.live != before or self._last_share != self.rule.share:
            self._last_share = self.rule.share
            self.log.info(
                "balancer-view", live=list(self.rule.live), share=self.rule.share, jobs=len(self.jobs)
            )
            self._wake_standbys()

    def _wake_standbys(self) -> None:
        """The picture changed: every job this node does not lead should be asked about again."""
        leading = self.leading_jobs()
        for job in self.jobs:
            if job not in leading:
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
        job = self.rule.tick(self.rule.live, leading)
        if job is not None:
            self.log.info(
                "handing-back", handed_job=job, share=self.rule.share, leading=len(leading),
                live=len(self.rule.live),
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
        with trio.move_on_after(1.0, shield=True):
            try:
                await self.registry.leave(self.node)
            except RedisUnavailable as exc:
                self.log.warning("balancer-leave-failed", error=str(exc))
