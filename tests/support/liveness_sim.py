"""A deterministic simulation of the liveness decisions (``actors/liveness.py``) in random worlds.

The world is Redis as the nodes see it (one lease per job with an expiry, the node registry, the
health hashes, release notices) and the sources (per node and job: does the job's own resource
answer, does the stream the job follows at the tip deliver, does the server's root answer).
Nodes join, crash, pause, lose their source for some jobs (or only the stream, pages still
answering), stop one job for good, read views up to two ticks stale; Redis fails over (leases,
registry and health gone). ``probe_stream``: the probe opens the stream as well as asking for a
page (False: a GET only, Horizon's probe before, which a proxy blocking streams still answers).
Every decision a node takes is the module's: ``decide`` (source), ``campaign`` (share,
placement, adoption), ``hand_back`` (balance), ``SourceHealth``/``advertise``/
``able_peers`` (health). Time is in milliseconds, one step is ``STEP``.

After every step :meth:`World.check` asserts the liveness rule: a job that some live, unpaused
node hosts and can serve has a leader that can serve it, at the latest ``bound_ms()`` after it
stopped having one. :func:`settle` then heals everything and checks that shares end balanced and
that nothing moves afterwards.

``rules`` is the module whose decisions are driven (``actors.liveness``; the tests also drive a
copy of the rules the code had before issue 23, to show the simulation finds what it fixed).
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import attrs

STEP = 50
TTL = 1000
RENEW = 200
TICK = 250  # the balancer's tick (ttl/4)
HANDOVER = 3000
LIVE_WINDOW = TTL


def bound_ms(rules: Any) -> int:
    """B, as derived in docs/FAILOVER.md ("Liveness"), in ms for the simulated settings.

    The longest path: the leader's source fails (its own requests) -> ``handover_after`` -> its
    watch sees it at most half a TTL later -> released with a notice; a peer whose source just
    healed is known healthy at most one TTL (its probe period) plus two ticks of stale view
    later; the best-placed node with room campaigns after its rendezvous delay, or, if every
    able node sees itself at its share, one adopts after ``ADOPT_AFTER_TTLS`` TTLs plus a
    recheck. A crashed or paused holder costs one TTL of lease instead of the first two terms.
    """
    adopt = rules.ADOPT_AFTER_TTLS * TTL + rules.SHARE_RECHECK_TTLS * TTL + rules.MAX_RANK_DELAY * 1000
    return int(HANDOVER + TTL / 2 + TTL + 2 * TICK + adopt + 2 * STEP)


@attrs.define
class Job:  # one job on one node
    health: Any
    leading: bool = False
    next_ask: int | None = 0
    campaign_at: int | None = None
    adopting: bool = False
    free_since: int | None = None
    known_expiry: int | None = None
    seen_holder: str | None = None
    watch_at: int = 0
    checked: bool = False
    peers_able: frozenset[str] = frozenset()
    last_resort_at: int | None = None


@attrs.define
class Node:
    name: str
    jobs: dict[str, Job]
    balance: Any
    lag: int  # steps of staleness of its views (up to two ticks)
    paused_until: int = -1
    next_tick: int = 0
    last_sig: tuple[object, ...] | None = None
    last_leading: frozenset[str] = frozenset()


class World:
    def __init__(
        self, seed: int, rules: ModuleType, *, probe_root: bool = False, probe_stream: bool = True
    ) -> None:
        self.rng = random.Random(seed)
        self.rules = rules
        # The probe asks the server's root (the old Horizon probe), not the job's own resource.
        self.probe_root = probe_root
        # The probe opens the stream too (Horizon's probe since the stream-blocking fix); False:
        # a GET of the collection only, which a proxy that blocks streams still answers.
        self.probe_stream = probe_stream
        self.t = 0
        self.all_jobs = tuple(f"j{i}" for i in range(self.rng.randint(2, 5)))
        self.nodes: dict[str, Node] = {}
        self.lease: dict[str, tuple[str, int] | None] = dict.fromkeys(self.all_jobs)
        self.registry: dict[str, int] = {}
        self.health: dict[str, dict[str, Any]] = {j: {} for j in self.all_jobs}
        self.history: list[tuple[dict[str, int], dict[str, dict[str, Any]]]] = []
        self.data_ok: dict[tuple[str, str], bool] = {}
        self.root_ok: dict[tuple[str, str], bool] = {}
        # The stream delivers (its hello, then records). False with data_ok: pages answer, the
        # stream is blocked or buffered (a proxy): the job at the tip gets nothing, and its own
        # requests record neither a success nor a failure (a stream that says nothing).
        self.stream_ok: dict[tuple[str, str], bool] = {}
        self.bad_since: dict[str, int | None] = dict.fromkeys(self.all_jobs)
        self.trace: list[str] = []
        self.changes = 0
        self.counter = 0
        self.worst = 0

    # --- the world's events ---------------------------------------------------------------

    def log(self, text: str) -> None:
        self.trace.append(f"t={self.t} {text}")

    def join(self, jobs: tuple[str, ...] | None = None) -> str:
        name = f"n{self.counter}"
        self.counter += 1
        if jobs is None:
            jobs = self.all_jobs
            if self.rng.random() < 0.2:  # job sets that differ between nodes
                jobs = tuple(j for j in self.all_jobs if self.rng.random() < 0.7) or self.all_jobs[:1]
        self.nodes[name] = Node(
            name, {j: Job(self.rules.SourceHealth()) for j in jobs}, self.rules.BalanceState(),
            lag=self.rng.randint(0, 2 * TICK // STEP), next_tick=self.t,
        )  # fmt: skip
        for j in jobs:
            self.data_ok[(name, j)] = self.root_ok[(name, j)] = self.stream_ok[(name, j)] = True
        self.log(f"join {name} jobs={','.join(jobs)}")
        return name

    def crash(self, name: str) -> None:
        del self.nodes[name]
        self.log(f"crash {name}")

    def release(self, job: str, name: str, why: str) -> None:
        if self.lease[job] is not None and self.lease[job][0] == name:  # type: ignore[index]
            self.lease[job] = None
            self.changes += 1
        self.log(f"{name} releases {job} ({why})")
        for node in self.nodes.values():
            j = node.jobs.get(job)
            if j is not None and not j.leading and node.name != name and not self.paused(node):
                j.free_since, j.seen_holder = self.t, None
                # A notice wakes a standby, also out of a rendezvous delay (it asks again).
                j.campaign_at, j.next_ask = None, self.t

    def stop_job(self, name: str, job: str) -> None:
        """The job fails fatally on this node only: its tree ends (lease released), the node's
        health entry for it is removed, the balancer forgets the job."""
        node = self.nodes[name]
        j = node.jobs.pop(job)
        if j.leading:
            self.release(job, name, "source-fatal")
        self.health[job] = {n: h for n, h in self.health[job].items() if n != name}
        self.log(f"{name} stops {job} (fatal here only)")

    def redis_failover(self) -> None:
        self.lease = dict.fromkeys(self.all_jobs)
        self.registry = {}
        self.health = {j: {} for j in self.all_jobs}
        self.log("redis failover: leases, registry, health lost")

    def paused(self, node: Node) -> bool:
        return self.t < node.paused_until

    def random_event(self) -> None:
        r = self.rng.random()
        live = sorted(self.nodes)
        if r < 0.15 or len(live) < 2:
            self.join()
        elif r < 0.25:
            self.crash(self.rng.choice(live))
        elif r < 0.35:
            name = self.rng.choice(live)
            self.nodes[name].paused_until = self.t + self.rng.randint(1, 30) * STEP
            self.log(f"pause {name} until {self.nodes[name].paused_until}")
        elif r < 0.7:
            name = self.rng.choice(live)
            jobs = list(self.nodes[name].jobs) if self.rng.random() < 0.5 else list(self.nodes[name].jobs)[:1]
            if self.rng.random() < 0.25:  # pages (and the root) answer, the stream is blocked
                for job in jobs:
                    self.stream_ok[(name, job)] = False
                self.log(f"stream of {name} blocked for {','.join(jobs)} (pages answer)")
                return
            root = self.rng.random() < 0.5  # the root still answers while the job's requests fail
            for job in jobs:
                self.data_ok[(name, job)] = False
                self.root_ok[(name, job)] = root
            self.log(f"source of {name} fails for {','.join(jobs)} (root answers: {root})")
        elif r < 0.85:
            for key in list(self.data_ok):
                self.data_ok[key] = self.root_ok[key] = self.stream_ok[key] = True
            self.log("sources healed")
        elif r < 0.93:
            name = self.rng.choice(live)
            if len(self.nodes[name].jobs) > 1:
                self.stop_job(name, self.rng.choice(sorted(self.nodes[name].jobs)))
        else:
            self.redis_failover()

    # --- what a node sees -----------------------------------------------------------------

    def view(self, node: Node) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        back = min(node.lag, len(self.history) - 1)
        return self.history[-1 - back] if self.history else (self.registry, self.health)

    def picture(self, node: Node) -> Any:
        registry, health = self.view(node)
        live = frozenset(n for n, at in registry.items() if self.t - at <= LIVE_WINDOW) | {node.name}
        within = self.rules.HEALTHY_WITHIN_TTLS * TTL
        able = {
            job: self.rules.able_peers(
                {n: h for n, h in health[job].items() if n != node.name}, self.t, within
            )
            for job in node.jobs
        }
        leaders = {job: (node.name if j.leading else j.seen_holder) for job, j in node.jobs.items()}
        departed = frozenset(registry) - live
        if self.rules is _old_rules():
            return self.rules.Picture(node.name, live, tuple(sorted(node.jobs)), able, leaders)
        return self.rules.Picture(node.name, live, tuple(sorted(node.jobs)), able, leaders, departed)

    def held(self, node: Node) -> set[str]:
        return {job for job, j in node.jobs.items() if j.leading or j.campaign_at is not None}

    # --- one step -------------------------------------------------------------------------

    def step(self) -> None:
        self.history.append((self.registry, self.health))
        del self.history[: -(2 * TICK // STEP + 2)]
        names = list(self.nodes)
        self.rng.shuffle(names)
        for name in names:
            node = self.nodes.get(name)
            if node is None or self.paused(node):
                continue
            self.leaders_step(node)
            self.watch_step(node)
            if self.t >= node.next_tick:
                node.next_tick = self.t + TICK
                self.balance_step(node)
            for job in sorted(node.jobs):
                self.elector_step(node, job)
        self.check()
        self.t += STEP

    def leaders_step(self, node: Node) -> None:
        for job, j in node.jobs.items():
            if not j.leading:
                continue
            lease = self.lease[job]
            if lease is None or lease[0] != node.name or lease[1] <= self.t:
                j.leading, j.next_ask, j.seen_holder = False, self.t, None  # the term is lost
                j.known_expiry, j.free_since = None, None
                self.log(f"{node.name} lost {job}")
                continue
            if self.t % RENEW == 0:
                self.lease[job] = (node.name, self.t + TTL)
            # the job's own requests (at the tip: the stream; a blocked one says nothing)
            if not self.data_ok[(node.name, job)]:
                j.health.failed(self.t)
            elif self.stream_ok[(node.name, job)]:
                j.health.ok(self.t)

    def watch_step(self, node: Node) -> None:
        for job, j in node.jobs.items():
            if self.t < j.watch_at:
                continue
            j.watch_at = self.t + (TTL // 2 if j.leading else TTL)
            h = j.health
            if not j.leading or h.last_ok is None or self.t - h.last_ok > TTL / 2:
                key = (node.name, job)
                if self.probe_root:
                    answers = self.root_ok[key]
                else:
                    answers = self.data_ok[key] and (self.stream_ok[key] or not self.probe_stream)
                h.probed(self.t, answers, leading=j.leading, quarantine=HANDOVER)
            entry = self.rules.advertise(h)
            if entry is not None:  # (the old rules wrote nothing while failing)
                self.health = {**self.health, job: {**self.health[job], node.name: entry}}
            _registry, health = self.view(node)
            within = self.rules.HEALTHY_WITHIN_TTLS * TTL
            j.peers_able = self.rules.able_peers(
                {n: e for n, e in health[job].items() if n != node.name}, self.t, within
            )
            j.checked = True
            if j.leading:
                verdict = self.rules.decide(
                    leading=True, healthy=h.healthy(self.t, within), failing_for=h.failing_for(self.t),
                    handover_after=HANDOVER, peers_healthy=bool(j.peers_able),
                )  # fmt: skip
                if verdict is self.rules.Verdict.HAND_OVER:
                    self.give_up(j)
                    self.release(job, node.name, "source-unavailable")

    def balance_step(self, node: Node) -> None:
        self.registry = {**self.registry, node.name: self.t}
        picture = self.picture(node)
        leading = frozenset(job for job, j in node.jobs.items() if j.leading)
        sig = picture.signature()
        if sig != node.last_sig or leading < node.last_leading:
            for j in node.jobs.values():  # the picture changed: ask again now
                if not j.leading and j.campaign_at is None and j.next_ask is not None:
                    j.next_ask = min(j.next_ask, self.t)
        node.last_sig, node.last_leading = sig, leading
        job = self.rules.hand_back(picture, leading, node.balance)
        if job is not None:
            j = node.jobs[job]
            self.give_up(j)
            self.release(job, node.name, "rebalanced")

    def give_up(self, j: Job) -> None:
        """A term this node ended itself: the lease is free from now (as far as it knows)."""
        j.leading, j.next_ask, j.seen_holder = False, self.t + STEP, None
        j.known_expiry, j.free_since = None, self.t

    def elector_step(self, node: Node, job: str) -> None:
        j = node.jobs[job]
        if j.leading:
            return
        if j.campaign_at is not None:
            if self.t < j.campaign_at:
                return
            j.campaign_at = None
            lease = self.lease[job]
            if lease is None or lease[1] <= self.t:
                self.lease[job] = (node.name, self.t + TTL)
                self.changes += 1
                j.leading, j.seen_holder, j.free_since, j.last_resort_at = True, node.name, None, None
                j.watch_at = min(j.watch_at, self.t + TTL // 2)
                if j.adopting:
                    node.balance.adopt(job, self.picture(node))
                self.log(f"{node.name} leads {job}{' (adopted)' if j.adopting else ''}")
            else:
                j.seen_holder, j.known_expiry, j.free_since = lease[0], lease[1], None
                j.next_ask = lease[1]  # the standby wait: until the lease would expire
            return
        if j.next_ask is None or self.t < j.next_ask:
            return
        within = self.rules.HEALTHY_WITHIN_TTLS * TTL
        if j.checked:  # the source rule first
            verdict = self.rules.decide(
                leading=False, healthy=j.health.healthy(self.t, within), failing_for=0.0,
                handover_after=HANDOVER, peers_healthy=bool(j.peers_able),
            )  # fmt: skip
            if verdict is self.rules.Verdict.HOLD_OFF:
                j.next_ask, j.last_resort_at = self.t + TTL, None
                return
            if verdict is self.rules.Verdict.LAST_RESORT:
                if j.last_resort_at is None:
                    j.last_resort_at = self.t + int(self.rules.LAST_RESORT_TTLS * TTL)
                if self.t < j.last_resort_at:
                    j.next_ask = j.last_resort_at
                    return
        # the lease read a held-off node makes (what it knows of the lease being free)
        lease = self.lease[job]
        if lease is None or lease[1] <= self.t:
            if j.free_since is None:
                j.free_since = min(self.t, j.known_expiry) if j.known_expiry is not None else self.t
            j.seen_holder = None
        else:
            j.seen_holder, j.known_expiry, j.free_since = lease[0], lease[1], None
        free_for = None if j.free_since is None else (self.t - j.free_since) / 1000
        decision = self.rules.campaign(
            self.picture(node), job, self.held(node) - {job}, free_for=free_for, ttl=TTL / 1000
        )
        if isinstance(decision, self.rules.HoldOff):
            j.next_ask = self.t + int(self.rules.SHARE_RECHECK_TTLS * TTL)
            return
        j.adopting = decision.adopting
        j.campaign_at = self.t + STEP * -(-int(decision.delay * 1000) // STEP)
        j.last_resort_at = None

    # --- the assertions ---------------------------------------------------------------------

    def serves(self, name: str, job: str) -> bool:
        node = self.nodes.get(name)
        return (
            node is not None and not self.paused(node) and job in node.jobs
            and self.data_ok[(name, job)] and self.stream_ok[(name, job)]
        )  # fmt: skip

    def check(self) -> None:
        bound = bound_ms(self.rules)
        for job in self.all_jobs:
            capable = any(self.serves(n, job) for n in self.nodes)
            lease = self.lease[job]
            led = lease is not None and lease[1] > self.t and self.serves(lease[0], job)
            if led or not capable:
                self.bad_since[job] = None
                continue
            since = self.bad_since[job]
            if since is None:
                self.bad_since[job] = self.t
                continue
            self.worst = max(self.worst, self.t - since)
            if self.t - since > bound:
                raise LivenessViolation(
                    f"{job} has had no leader able to serve it for {self.t - since} ms "
                    f"(> B = {bound} ms) although {sorted(n for n in self.nodes if self.serves(n, job))} "
                    f"could serve it; lease {lease}",
                    self.trace,
                )

    def heal(self) -> None:
        for key in list(self.data_ok):
            self.data_ok[key] = self.root_ok[key] = self.stream_ok[key] = True
        for node in self.nodes.values():
            node.paused_until = -1
        self.log("everything healed")

    def homogeneous(self) -> bool:
        return all(set(n.jobs) == set(self.all_jobs) for n in self.nodes.values())

    def balanced(self) -> bool:
        n = len(self.nodes)
        share = -(-len(self.all_jobs) // n)
        counts = {name: 0 for name in self.nodes}
        for lease in self.lease.values():
            if lease is None or lease[0] not in counts:
                return False
            counts[lease[0]] += 1
        return max(counts.values()) <= share


class LivenessViolation(AssertionError):
    def __init__(self, message: str, trace: list[str]) -> None:
        super().__init__(message + "\n" + "\n".join(trace[-25:]))
        self.trace = trace


def run(
    seed: int,
    rules: ModuleType,
    *,
    events: int = 12,
    probe_root: bool = False,
    probe_stream: bool = True,
) -> World:
    """One random world: a few nodes, ``events`` random faults a few seconds apart (every step
    checked), then everything healed: balanced (when every node hosts every job) and then still."""
    world = World(seed, rules, probe_root=probe_root, probe_stream=probe_stream)
    for _ in range(world.rng.randint(2, 4)):
        world.join(world.all_jobs)
    for _ in range(60):
        world.step()
    for _ in range(events):
        world.random_event()
        for _ in range(world.rng.randint(5, 120)):
            world.step()
    world.heal()
    for _ in range(bound_ms(rules) // STEP + 40):
        world.step()
    if world.homogeneous():
        assert world.balanced(), f"not balanced: {world.lease}\n" + "\n".join(world.trace[-25:])
    before = world.changes
    for _ in range(200):
        world.step()
    assert world.changes == before, "leadership moved after everything settled:\n" + "\n".join(
        world.trace[-25:]
    )
    return world


def _old_rules() -> ModuleType:
    from tests.support import liveness_old_rules

    return liveness_old_rules
