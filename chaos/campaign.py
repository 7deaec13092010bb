"""The chaos campaign: a real cluster on loopback, random faults from every layer, then the judge.

What runs (all children of this process, on 127.0.0.1), one cluster of the testing kit
(:func:`~ingestion.testing.cluster.open_cluster`, which starts and restarts every node): a Redis
Sentinel deployment (a primary, two replicas, three sentinels), a throwaway PostgreSQL when
Debian's server is installed, the simulator (Horizon and Stellar RPC), a webhook receiver that
verifies every signature with the official ``standardwebhooks`` package, and three node processes
sharing the five jobs of :mod:`chaos.jobs` (each node in a group of its own for partitions, the
last one's wall clock faked).

The faults come in rounds (:mod:`chaos.faults`): one to four at once, from any layers, each
started at a random moment of the round's first 1.5 s; a round ends when the last of its faults is
healed, and the next one starts once every job has committed again (at most B later, seen by the
polls of :mod:`chaos.polls`).

At the end every fault is healed, delivery catches up, the nodes stop (SIGTERM), and the judge
(:mod:`chaos.judge`) reads every sink. :class:`~chaos.report.Report` holds it all, as text and as
JSON.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx
import trio

from actors.lease_store import connect
from chaos.faults import KINDS, Faults, Kind, control
from chaos.jobs import HOOK, OPS, PG, SECRET, specs
from chaos.judge import ALLOWANCE, judge
from chaos.polls import Polls
from chaos.report import Report
from ingestion.testing import partition
from ingestion.testing.children import Child
from ingestion.testing.cluster import Cluster, EventLog, faketime_available, open_cluster
from ingestion.testing.cluster_config import NodeFaults
from ingestion.testing.launch import joined
from ingestion.testing.local_postgres import LocalPostgres, server_bin
from ingestion.testing.receiver import Receiver
from ingestion.testing.redis_ha import SentinelGroup

WARM_UP = 90.0  # seconds for every job's first commit
SETTLE = 60.0  # seconds for delivery to catch up at the end


def bound_s(ttl_ms: int, handover_ms: int) -> float:
    """B of docs/FAILOVER.md ("Liveness"), seconds, with 0.1 s for the graceful handoff."""
    ttl = ttl_ms / 1000
    return handover_ms / 1000 + ttl / 2 + ttl / 2 + ttl + 2 * ttl / 4 + ttl + ttl / 2 + 0.5 + 0.1


@attrs.frozen
class Options:
    seconds: float
    seed: int
    nodes: int = 3
    ttl_ms: int = 1500
    handover_ms: int = 3000
    build: str | None = None  # run the nodes from this copy of the code (PYTHONPATH)
    kinds: tuple[str, ...] = ()  # only these kinds (default: every kind the machine can do)
    echo: bool = False


class Campaign:
    """One run (see the module docstring). ``run()`` returns the :class:`Report`."""

    def __init__(self, options: Options, out: Callable[[str], None] = print) -> None:
        self.o = options
        self.say = out
        self.rng = random.Random(options.seed)
        self.log = EventLog()
        self.bound = bound_s(options.ttl_ms, options.handover_ms)
        self.report = Report(options.seed, options.seconds, self.bound)
        self.dir = Path(tempfile.mkdtemp(prefix="ingestion-chaos-"))
        self.redis = SentinelGroup(directory=self.dir / "redis")
        self.receiver = Receiver(SECRET)
        self.c: Cluster | None = None  # the kit's cluster, once it runs
        self.impaired: set[str] = set()  # nodes dead, paused, cut off or restarting
        self.t0 = 0.0
        self.jobs: list[str] = []
        self.polls = Polls(self.redis, None, (), self.now, PG)  # made anew once the jobs are known
        self.faults = Faults(self)

    # -- time -----------------------------------------------------------------------------------

    def now(self) -> float:
        return trio.current_time() - self.t0

    # -- the cluster (the kit's: what the faults and the judge reach through it) -------------------

    @property
    def cluster(self) -> Cluster:
        assert self.c is not None, "the cluster is not running"
        return self.c

    @property
    def pg(self) -> LocalPostgres | None:
        return self.c.postgres if self.c is not None else None

    @property
    def links(self) -> partition.Links | None:
        return self.cluster.links

    @property
    def children(self) -> dict[str, Child]:
        return self.cluster.children

    @property
    def horizon(self) -> str:
        return self.cluster.horizon

    @property
    def rpc(self) -> str:
        return self.cluster.rpc

    @property
    def clock_file(self) -> Path:
        return self.cluster.clock_file

    def node_gid(self, name: str) -> int | None:
        return self.cluster.node_gid(name)

    async def start_node(self, name: str) -> None:
        """Start node ``name`` (again); it stays impaired until it has joined (led or stood by)."""
        self.impaired.add(name)
        since = trio.current_time()
        child = await self.cluster.start_node(name, wait=False)
        self.cluster.nursery.start_soon(self._joined, name, since, child)

    async def _joined(self, name: str, since: float, child: Child) -> None:
        with trio.move_on_after(60):
            while not any(joined(e, name, since) for e in self.log.lines):
                if not child.alive:
                    return
                await self.log.changed()
            if self.children.get(name) is child and child.alive:
                self.impaired.discard(name)

    def _arming(self) -> tuple[bool, NodeFaults]:
        """Whether to run PostgreSQL, and the faults to arm on the nodes: what the machine can
        do (the rest is reported skipped)."""
        postgres = server_bin() is not None
        if not postgres:
            for k in KINDS:
                if k.layer == "postgres":
                    self.report.skipped_kinds[k.name] = "PostgreSQL is not installed"
        clock: frozenset[str] = frozenset()
        if faketime_available():
            clock = frozenset({f"n{self.o.nodes}"})  # the last node's wall clock jumps
        else:
            self.report.skipped_kinds["clock-jump"] = "libfaketime is not installed"
        why = partition.available()
        if why is not None:
            self.report.skipped_kinds["node-partition"] = why
        return postgres, NodeFaults(partition=why is None, clock=clock)

    async def _start_nodes(self) -> None:
        c = self.cluster
        self.say(f"chaos: Redis under Sentinel: {self.redis.url}")
        if c.postgres is not None:
            self.say(f"chaos: PostgreSQL on 127.0.0.1:{c.postgres.port}")
        c.node_env["INGESTION_HORIZON_HANDOVER_AFTER_MS"] = str(self.o.handover_ms)
        self.jobs = [spec.name for spec in c.jobs]
        self.polls = Polls(self.redis, c.postgres, self.jobs, self.now, PG)
        for i in range(1, self.o.nodes + 1):
            await self.start_node(f"n{i}")

    async def recovered(self, since: float) -> None:
        """Until every job commits after ``since`` (at most B and the allowance)."""
        await self.polls.until(
            lambda: all(self.polls.committed_since(j, since) for j in self.jobs), self.bound + ALLOWANCE
        )

    async def run(self) -> Report:
        postgres, faults = self._arming()
        try:
            async with open_cluster(
                jobs=specs(postgres), ttl_ms=self.o.ttl_ms, log=self.log, sentinel=self.redis,
                postgres=postgres, receiver=self.receiver, faults=faults, build=self.o.build,
                ledger_interval=0.2, ops_per_ledger=6, history_ledgers=20, rpc=True,
                cache_records=200_000,
            ) as self.c, trio.open_nursery() as nursery:  # fmt: skip
                try:
                    await self._campaign(nursery)
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(20):
                        await self.cluster.stop_nodes(grace=15)
                    nursery.cancel_scope.cancel()
        finally:
            self.c = None
        return self.report

    async def _campaign(self, nursery: trio.Nursery) -> None:
        if self.o.echo:
            self.log.echo = lambda e: self.say(
                f"{self.now():8.2f} {e.node:>9} {e.event} {e.fields.get('job', '')}"
            )
        await self._start_nodes()
        self.t0 = trio.current_time()
        nursery.start_soon(self.polls.run)
        await self.polls.until(
            lambda: all(self.polls.committed_since(j, 0) for j in self.jobs) and not self.impaired, WARM_UP
        )
        missing = [j for j in self.jobs if not self.polls.committed_since(j, 0)]
        if missing:
            self.report.violations.append(
                f"warm-up: {', '.join(missing)} never committed within {WARM_UP:.0f} s"
            )
            return
        begin = self.now()
        self.say(
            f"chaos: every job commits (t={begin:.1f} s); faults for {self.o.seconds:.0f} s, "
            f"seed {self.o.seed}"
        )
        while self.now() < begin + self.o.seconds:
            planned = self.faults.draw_round()
            async with trio.open_nursery() as faults:
                for kind, offset, r in planned:
                    faults.start_soon(self._after, offset, kind, r)
            await self.recovered(self.now())
            await trio.sleep(self.rng.uniform(0, 0.5))
        await self._finish(begin)

    async def _after(self, offset: float, kind: Kind, r: random.Random) -> None:
        await trio.sleep(offset)
        at = self.now()
        try:
            await self.faults.inject(kind, r)
        except (OSError, RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            # the harness could not carry the fault out: the run goes on (its records are still
            # judged) but fails, naming it, rather than losing everything to one broken step
            self.report.violations.append(f"harness: {kind.name} at t={at:.1f} failed: {exc!r}")

    async def _finish(self, begin: float) -> None:
        """Heal everything, let delivery catch up, stop the nodes, judge."""
        end = self.now()
        await control(self.horizon, None)
        await control(self.rpc, None)
        self.receiver.fault = None
        await self.polls.until(lambda: not self.impaired, 30)
        await self.recovered(self.now())
        judged_until = self.now()
        client = connect(self.redis.url, timeout=5.0)
        with trio.move_on_after(SETTLE) as settling:
            while not await trio.to_thread.run_sync(self.cluster.delivered_all, HOOK, OPS):
                await self.polls.polled()
        if settling.cancelled_caught:
            self.report.violations.append(
                f"{HOOK}: delivery did not reach the last record of {OPS} within {SETTLE:.0f} s of the end"
            )
        await self.cluster.stop_nodes(grace=15)
        self.say(f"chaos: {len(self.report.faults)} faults injected; stopped; judging")
        try:
            await judge(self, begin, min(end, judged_until), client)
        finally:
            client.close()
