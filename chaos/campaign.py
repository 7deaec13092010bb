"""The chaos campaign: a real cluster on loopback, random faults from every layer, then the judge.

What runs (all children of this process, on 127.0.0.1): a Redis Sentinel deployment (a primary,
two replicas, three sentinels), a throwaway PostgreSQL when Debian's server is installed, the
simulator (Horizon and Stellar RPC), a webhook receiver that verifies every signature with the
official ``standardwebhooks`` package, and three node processes sharing the five jobs of
:mod:`chaos.jobs`.

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
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.lease_store import connect, job_keys
from chaos.faults import KINDS, Faults, Kind, control
from chaos.jobs import HOOK, OPS, PG, RPC, SECRET, TICK, config_text
from chaos.judge import ALLOWANCE, judge
from chaos.polls import Polls
from chaos.report import Report
from ingestion.testing import partition
from ingestion.testing.cluster import Child, ClockFake, EventLog, faketime_available, spawn
from ingestion.testing.launch import (
    LISTENING,
    joined,
    kill_remaining,
    node_command,
    simulator_command,
    terminate,
)
from ingestion.testing.local_postgres import LocalPostgres, server_bin
from ingestion.testing.receiver import Receiver, serve_receiver
from ingestion.testing.redis_ha import SentinelGroup

GID_BASE = 61_000  # node i runs under group GID_BASE + i (partitions tell them apart by it)
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
        self.pg: LocalPostgres | None = None
        self.receiver = Receiver(SECRET)
        self.links: partition.Links | None = None
        self.children: dict[str, Child] = {}
        self.every: list[Child] = []
        self.impaired: set[str] = set()  # nodes dead, paused, cut off or restarting
        self.horizon = self.rpc = ""
        self.hook_port = 0
        self.t0 = 0.0
        self.jobs: list[str] = []
        self.nursery: trio.Nursery | None = None
        self.config_path = self.dir / "chaos.toml"
        self.clock_file = self.dir / "faketime"  # the last node's wall-clock offset (libfaketime)
        self.polls = Polls(self.redis, None, (), self.now, PG)  # made anew once the jobs are known
        self.faults = Faults(self)

    # -- time -----------------------------------------------------------------------------------

    def now(self) -> float:
        return trio.current_time() - self.t0

    # -- the cluster ----------------------------------------------------------------------------

    def config(self) -> Path:
        path = self.dir / "chaos.toml"
        path.write_text(config_text(self.rpc, self.hook_port, self.pg.url if self.pg is not None else None))
        return path

    def node_gid(self, name: str) -> int | None:
        return GID_BASE + int(name.removeprefix("n")) if self.links is not None else None

    async def start_node(self, name: str) -> None:
        """Start node ``name``; it stays impaired until it has joined (led or stood by)."""
        assert self.nursery is not None
        self.impaired.add(name)
        since = trio.current_time()
        env = {"INGESTION_HORIZON_HANDOVER_AFTER_MS": str(self.o.handover_ms)}
        if self.o.build:
            env["PYTHONPATH"] = self.o.build
        if name == f"n{self.o.nodes}" and "clock-jump" not in self.report.skipped_kinds:
            env.update(ClockFake(timestamp_file=str(self.clock_file)).env())
        args = node_command(
            name, jobs=self.jobs, redis_url=self.redis.url, horizon=self.horizon, ttl_ms=self.o.ttl_ms,
            extra=["--config", str(self.config_path)],
        )  # fmt: skip
        # (python -m imports from its working directory first: the build's, when there is one)
        child = await spawn(
            self.nursery, name, args, self.log, env, group=self.node_gid(name), cwd=self.o.build
        )
        self.children[name] = child
        self.every.append(child)
        self.nursery.start_soon(self._joined, name, since, child)

    async def _joined(self, name: str, since: float, child: Child) -> None:
        with trio.move_on_after(60):
            while not any(joined(e, name, since) for e in self.log.lines):
                if not child.alive:
                    return
                await self.log.changed()
            if self.children.get(name) is child and child.alive:
                self.impaired.discard(name)

    async def _start_everything(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        await trio.to_thread.run_sync(self.redis.start)
        self.say(f"chaos: Redis under Sentinel: {self.redis.url}")
        if server_bin() is not None:
            self.pg = await trio.to_thread.run_sync(LocalPostgres().start)
            self.say(f"chaos: PostgreSQL on 127.0.0.1:{self.pg.port}")
        else:
            for k in KINDS:
                if k.layer == "postgres":
                    self.report.skipped_kinds[k.name] = "PostgreSQL is not installed"
        if faketime_available():
            self.clock_file.write_text("+0s\n")
        else:
            self.report.skipped_kinds["clock-jump"] = "libfaketime is not installed"
        why = partition.available()
        if why is None:
            self.links = partition.Links()
            ports = [s.port for s in self.redis.servers + self.redis.sentinels]
            for i in range(1, self.o.nodes + 1):
                await self.links.route(nursery, GID_BASE + i, ports)
        else:
            self.report.skipped_kinds["node-partition"] = why
        since = trio.current_time()
        sim = await spawn(nursery, "simulator", simulator_command(
            ledger_interval=0.2, ops_per_ledger=6, history_ledgers=20, rpc=True, cache_records=200_000,
        ), self.log)  # fmt: skip
        self.every.append(sim)
        self.children["simulator"] = sim
        with trio.fail_after(30):
            while not (up := self.log.of(LISTENING, "simulator", since=since)):
                await self.log.changed()
        self.horizon, self.rpc = str(up[0].fields["url"]), str(up[0].fields["rpc_url"])
        self.hook_port = await nursery.start(serve_receiver, self.receiver)
        self.jobs = [OPS, RPC, TICK, HOOK] + ([PG] if self.pg is not None else [])
        self.config_path = self.config()
        self.polls = Polls(self.redis, self.pg, self.jobs, self.now, PG)
        for i in range(1, self.o.nodes + 1):
            await self.start_node(f"n{i}")

    async def recovered(self, since: float) -> None:
        """Until every job commits after ``since`` (at most B and the allowance)."""
        await self.polls.until(
            lambda: all(self.polls.committed_since(j, since) for j in self.jobs), self.bound + ALLOWANCE
        )

    async def run(self) -> Report:
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await self._campaign(nursery)
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(20):
                        await self._stop_nodes()
                    nursery.cancel_scope.cancel()
        finally:
            for c in self.every:
                if c.paused:
                    c.send(signal.SIGCONT)
            kill_remaining(c.process for c in self.every)
            if self.links is not None:
                self.links.close()
            self.redis.stop()
            if self.pg is not None:
                self.pg.cleanup()
        return self.report

    async def _campaign(self, nursery: trio.Nursery) -> None:
        if self.o.echo:
            self.log.echo = lambda e: self.say(
                f"{self.now():8.2f} {e.node:>9} {e.event} {e.fields.get('job', '')}"
            )
        await self._start_everything(nursery)
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

        def caught_up() -> bool:
            last: Any = client.xrevrange(job_keys(OPS)["events"], count=1)
            position = client.hget(job_keys(HOOK)["cursor"], "cursor")
            return bool(last) and position == last[0][1]["paging_token"]

        with trio.move_on_after(SETTLE) as settling:
            while not await trio.to_thread.run_sync(caught_up):
                await self.polls.polled()
        if settling.cancelled_caught:
            self.report.violations.append(
                f"{HOOK}: delivery did not reach the last record of {OPS} within {SETTLE:.0f} s of the end"
            )
        await self._stop_nodes()
        self.say(f"chaos: {len(self.report.faults)} faults injected; stopped; judging")
        try:
            await judge(self, begin, min(end, judged_until), client)
        finally:
            client.close()

    async def _stop_nodes(self) -> None:
        nodes = [c for n, c in self.children.items() if n != "simulator"]
        for c in nodes:
            if c.paused:
                c.send(signal.SIGCONT)
        await terminate([c.process for c in nodes], grace=15)

    # -- the judge ------------------------------------------------------------------------------
