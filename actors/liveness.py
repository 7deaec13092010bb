"""Liveness: whether a node campaigns for a job, holds off, hands a lease back or stays.

Pure decisions, no I/O and no clock (every time is an argument). The Elector, the Balancer and
the SourceWatch ask here; ``tests/support/liveness_sim.py`` drives the same functions over random worlds.
Safety is not decided here (the lease and the fencing token keep two writers apart whatever
these rules say); these rules decide only *who* leads and *how soon*.

The invariant (docs/FAILOVER.md, "Liveness"): a job that at least one live node hosts and can
serve (its source answers that job's own requests) has a leader that can serve it within ``B``.
Four rules carry it:

1. **Source.** A leader whose own requests for the job have all failed for ``handover_after``
   hands the lease back when another node reports a working source for that job; a standby whose
   source fails holds off while another node's works and campaigns late when nobody's does. A
   probe that is not the job's own request (a server's root) never clears a failure the job's
   own requests set: a server that answers ``/`` but fails every page is failing.
2. **Share over the able.** A node's balanced share is ``ceil(jobs / nodes)`` over the jobs it
   hosts and the nodes *able to lead them* (live, hosting the job, its source working, not
   stopped for it), not over every live node: a node cut off from its source, or that does not
   host the job, takes no share.
3. **Adoption.** The share is a preference, never a reason to leave a job leaderless: a node at
   its share campaigns for a lease that has been free for ``ADOPT_AFTER_TTLS`` TTLs (after its
   rendezvous delay). An adopted job is not handed back for balance until the picture changes
   (no flapping between "over the share" and "nobody with room").
4. **Placement.** Free leases (no holder, or a holder no longer live) are placed greedily in job
   order on the best-ranked able node with room, from what every node can see alike; the placed
   node campaigns at once, the others after ``rank * RANK_STEP`` as a fallback. So a lease
   released on shutdown goes at once to the best-placed node free to take it.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import math
from collections.abc import Iterable, Mapping

import attrs

RANK_STEP = 0.05  # seconds a node waits per place it ranks below the best able node for a job
MAX_RANK_DELAY = 0.5  # seconds: the longest such wait
OVER_TICKS = 2  # consecutive ticks over the share before a lease is handed back
HEALTHY_WITHIN_TTLS = 2.0  # a source that answered within this many TTLs counts as reachable
LAST_RESORT_TTLS = 0.5  # an unhealthy node campaigns this many TTLs late, when nobody is healthy
ADOPT_AFTER_TTLS = 1.0  # a lease free this many TTLs is campaigned for even at the share
SHARE_RECHECK_TTLS = 0.5  # a node at its share looks at the lease again this often


@functools.lru_cache(maxsize=1 << 16)  # (asked for every job and node at every decision)
def rendezvous_score(job: str, node: str) -> int:
    digest = hashlib.blake2b(f"{job}\0{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preference(job: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` best first for ``job`` (highest rendezvous score; ties by name)."""
    return sorted(set(nodes), key=lambda n: (-rendezvous_score(job, n), n))


# --- the source ---------------------------------------------------------------------------------


@attrs.define
class SourceHealth:
    """What a source knows of its own reachability for one job (times passed in).

    ``ok``/``failed``: the job's own requests (pages, streams). ``probed``: a probe's answer. A
    probe never clears a failure the job's own requests set while they are still being made (a
    leader's, or a standby's for ``quarantine`` after its last failed request): a server that
    answers the probe but fails every page or stream is failing for this job. A standby, which
    makes no requests of its own, takes a probe as its evidence after that.
    """

    last_ok: float | None = None
    failing_since: float | None = None  # the first failure since the last success
    probe_failing_since: float | None = None
    last_failed: float | None = None  # the job's own last failed request

    def ok(self, now: float) -> None:
        self.last_ok = now
        self.failing_since = None
        self.probe_failing_since = None

    def failed(self, now: float) -> None:
        self.last_failed = now
        if self.failing_since is None:
            self.failing_since = now

    def probed(self, now: float, answered: bool, *, leading: bool = False, quarantine: float = 0.0) -> None:
        if not answered:
            if self.probe_failing_since is None:
                self.probe_failing_since = now
            return
        self.probe_failing_since = None
        if self.failing_since is None:
            self.last_ok = now
        elif not leading and (self.last_failed is None or now - self.last_failed >= quarantine):
            self.ok(now)

    @property
    def failing(self) -> bool:
        return self.failing_since is not None or self.probe_failing_since is not None

    def failing_for(self, now: float) -> float:
        """How long the source has been unreachable: 0 unless it is failing; then since the last
        success (the last evidence it answered), or the first failure if none."""
        if not self.failing:
            return 0.0
        if self.last_ok is not None:
            return now - self.last_ok
        starts = [t for t in (self.failing_since, self.probe_failing_since) if t is not None]
        return now - min(starts)

    def healthy(self, now: float, within: float) -> bool:
        return self.last_ok is not None and now - self.last_ok <= within and not self.failing


@attrs.frozen
class PeerHealth:
    """What a node advertises about its source for a job (``ingestion:{J}:health``)."""

    last_ok: float | None
    failing_since: float | None = None


def advertise(health: SourceHealth) -> PeerHealth:
    """What a node writes about its source: its last success and, explicitly, since when it has
    been failing (so peers stop counting it at once, not two TTLs after its last success)."""
    starts = [t for t in (health.failing_since, health.probe_failing_since) if t is not None]
    return PeerHealth(health.last_ok, min(starts) if starts else None)


def able_peers(entries: Mapping[str, PeerHealth], now: float, within: float) -> frozenset[str]:
    """The nodes whose advertised source works: answered within ``within`` and not failing."""
    return frozenset(
        node for node, h in entries.items()
        if h.last_ok is not None and now - h.last_ok <= within and h.failing_since is None
    )  # fmt: skip


class Verdict(enum.Enum):
    CAMPAIGN = "campaign"
    HOLD_OFF = "hold-off"  # another node can reach the source and this one cannot
    LAST_RESORT = "last-resort"  # nobody can: campaign late
    HAND_OVER = "hand-over"
    KEEP = "keep"


def decide(*, leading: bool, healthy: bool, failing_for: float, handover_after: float,
           peers_healthy: bool) -> Verdict:  # fmt: skip
    """Rule 1, from this node's view."""
    if leading:
        if failing_for >= handover_after and peers_healthy:
            return Verdict.HAND_OVER
        return Verdict.KEEP
    if healthy:
        return Verdict.CAMPAIGN
    return Verdict.HOLD_OFF if peers_healthy else Verdict.LAST_RESORT


# --- the share, placement and adoption ----------------------------------------------------------


@attrs.frozen
class Picture:
    """One node's view of the jobs it hosts, as of its last reads.

    ``able``: job -> the *other* nodes able to lead it, from its health hash (a job absent:
    unknown, every live node).
    ``leaders``: job -> its holder as last seen (absent or None: free, or unknown).
    """

    node: str
    live: frozenset[str]
    jobs: tuple[str, ...]
    able: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    leaders: Mapping[str, str | None] = attrs.field(factory=dict)
    departed: frozenset[str] = frozenset()  # seen in the registry, no longer live there

    def able_nodes(self, job: str) -> frozenset[str]:
        # Known ability wins over the registry (a node hosting a single job runs no balancer and
        # so never heartbeats into it), except for a node that left it: a drained node is gone
        # at once, not after its health entry ages out.
        others = self.able.get(job)
        return (frozenset(self.live if others is None else others) - self.departed) | {self.node}

    @functools.cached_property  # (asked at every decision: 200 jobs, 200 standbys asking)
    def share(self) -> int:
        nodes: set[str] = {self.node}
        for job in self.jobs:
            nodes |= self.able_nodes(job)
        return max(1, math.ceil(len(self.jobs) / len(nodes)))

    def rank(self, job: str) -> int:
        return preference(job, self.able_nodes(job)).index(self.node)

    def signature(self) -> tuple[object, ...]:
        """What a change of picture means for adopted jobs (membership and ability only)."""
        return (self.live, tuple(sorted((j, self.able_nodes(j)) for j in self.jobs)))

    def placement(self) -> dict[str, str]:
        """Free jobs (no holder, or one no longer live) -> the node they should go to: in job
        order, the best-ranked able node with room (fewer than the share), counting what each
        node is seen to lead. Every node that sees the same picture computes the same answer."""
        share = self.share
        counts: dict[str, int] = {}
        free = []
        for job in sorted(self.jobs):
            holder = self.leaders.get(job)
            if holder is None or (holder not in self.live and holder != self.node):
                free.append(job)
            else:
                counts[holder] = counts.get(holder, 0) + 1
        placed: dict[str, str] = {}
        for job in free:
            for node in preference(job, self.able_nodes(job)):
                if counts.get(node, 0) < share:
                    placed[job] = node
                    counts[node] = counts.get(node, 0) + 1
                    break
        return placed


@attrs.frozen
class Campaign:
    delay: float  # seconds to wait before the acquire
    adopting: bool = False  # at the share: the lease has been free for ADOPT_AFTER_TTLS


@attrs.frozen
class HoldOff:
    reason: str  # "share-reached"


def campaign(
    picture: Picture, job: str, held: Iterable[str], *, free_for: float | None, ttl: float,
    max_rank_delay: float = MAX_RANK_DELAY,
) -> Campaign | HoldOff:
    """Rules 2-4 for a standby (its source allows it): campaign after a delay, or hold off.

    ``held``: the jobs this node leads or campaigns for (``job`` not counted); ``free_for``:
    seconds this node knows the lease to have been free (None: held, or not known to be free);
    ``max_rank_delay``: the longest wait for a job placed on another node (a fallback).
    """
    # The placement first: it already counts what this node leads against the share, and a
    # campaign in flight here (a fallback for a job placed elsewhere, a standby's look at a held
    # lease) must not hold back a job the placement gives this node, or the released lease waits
    # out that campaign's rendezvous delay (issue 23: 54 ms instead of a few).
    if picture.placement().get(job) == picture.node:
        return Campaign(0.0)
    delay = min(max_rank_delay, picture.rank(job) * RANK_STEP)
    if len(set(held) - {job}) >= picture.share:
        if free_for is not None and free_for >= ADOPT_AFTER_TTLS * ttl:
            return Campaign(delay, adopting=True)
        return HoldOff("share-reached")
    return Campaign(delay)


@attrs.define
class BalanceState:
    """The balancer's memory between ticks."""

    over_ticks: int = 0
    adopted: dict[str, tuple[object, ...]] = attrs.Factory(dict)  # job -> picture when adopted

    def adopt(self, job: str, picture: Picture) -> None:
        self.adopted[job] = picture.signature()


def hand_back(picture: Picture, leading: Iterable[str], state: BalanceState) -> str | None:
    """The job to hand back now for balance, if any (one per tick, after ``OVER_TICKS`` ticks
    over the share): the worst-placed one that another able node with room would take (the
    placement of the picture with that job free) and that was not adopted under this same
    picture."""
    leading = sorted(set(leading) & set(picture.jobs))
    signature = picture.signature()
    state.adopted = {j: s for j, s in state.adopted.items() if j in leading and s == signature}
    if len(leading) <= picture.share:
        state.over_ticks = 0
        return None
    leaders = {**picture.leaders, **{j: picture.node for j in leading}}

    def taken_elsewhere(job: str) -> bool:
        freed = attrs.evolve(picture, leaders={**leaders, job: None})
        return freed.placement().get(job, picture.node) != picture.node

    movable = [j for j in leading if j not in state.adopted and taken_elsewhere(j)]
    if not movable:
        state.over_ticks = 0
        return None
    state.over_ticks += 1
    if state.over_ticks < OVER_TICKS:
        return None
    return max(movable, key=lambda job: (picture.rank(job), job))
