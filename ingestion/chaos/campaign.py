"""The chaos campaign: a real cluster on loopback, random faults from every layer, then the judge.

What runs (all children of this process, on 127.0.0.1): a Redis Sentinel deployment (a primary,
two replicas, three sentinels), a throwaway PostgreSQL when Debian's server is installed, the
simulator (Horizon and Stellar RPC), a webhook receiver that verifies every signature with the
official ``standardwebhooks`` package, and three node processes sharing five jobs:

- ``chaos-ops``: Horizon ``/operations`` into its Redis stream;
- ``chaos-rpc``: the simulator's Stellar RPC contract events into a Redis stream;
- ``chaos-pg``: Horizon ``/payments`` into PostgreSQL (when installed);
- ``chaos-tick``: a scheduled job (``ingestion.jobs:heartbeat``, twice a second);
- ``chaos-hook``: a webhook job delivering ``chaos-ops`` to the receiver (``on_exhausted =
  "block"``: every record, in order).

The faults come in rounds (:data:`KINDS`): one to four at once, from any layers, each started at
a random moment of the round's first 1.5 s; a round ends when the last of its faults is healed,
and the next one starts once every job has committed again (at most B later). The schedule —
which kinds, when, for how long, aimed at which role (the leader of which job, a replica, the
primary) — is a function of the seed alone; which node a role names depends on the run. At most
one node is impaired at a time (dead, paused, cut off, or restarting), so two always host every
job.

At the end every fault is healed, delivery catches up, the nodes stop (SIGTERM), and the judge
(:mod:`ingestion.chaos.check`, :func:`ingestion.verify.check_stream`) reads every sink: each
job's records exactly once and in order, against the source; tokens that never fall; no write
under a token after the next was granted; the audit against the nodes' logs; and liveness within
B. :class:`Report` holds it all, as text and as JSON.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.lease_store import connect, job_keys
from ingestion.chaos import check
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
from ingestion.testing.redis_ha import SentinelGroup
from ingestion.verify import (
    SourceRecord,
    Verification,
    check_stream,
    fetch_source,
    read_evidence,
    read_postgres_evidence,
    verify_job,
    verify_rpc_job,
)
from ingestion.webhook.receiver import Fault as ReceiverFault
from ingestion.webhook.receiver import Receiver, serve_receiver

OPS, RPC, PG, TICK, HOOK = "chaos-ops", "chaos-rpc", "chaos-pg", "chaos-tick", "chaos-hook"
HORIZON_JOBS = frozenset({OPS, PG, HOOK})  # HOOK delivers OPS: what holds OPS up holds it up
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
GID_BASE = 61_000  # node i runs under group GID_BASE + i (partitions tell them apart by it)
POLL = 0.2  # seconds between polls of every job's lease and cursor
ALLOWANCE = 1.5  # seconds beyond B: polling, the log pipe, process start-up on 2 busy cores
WARM_UP = 90.0  # seconds for every job's first commit
SETTLE = 60.0  # seconds for delivery to catch up at the end
REDIS_COOL_DOWN = 12.0  # seconds between failovers: Sentinel's 2 x failover-timeout (5 s), and some


def bound_s(ttl_ms: int, handover_ms: int) -> float:
    """B of docs/FAILOVER.md ("Liveness"), seconds, with 0.1 s for the graceful handoff."""
    ttl = ttl_ms / 1000
    return handover_ms / 1000 + ttl / 2 + ttl / 2 + ttl + 2 * ttl / 4 + ttl + ttl / 2 + 0.5 + 0.1


@attrs.frozen
class Kind:
    """A kind of fault: its layer, how often it is drawn, and whether it lasts (an outage: the jobs
    it holds up are not held to B until it ends) or is instant (B runs from the moment it hit)."""

    name: str
    layer: str
    weight: float
    lasts: bool


KINDS: tuple[Kind, ...] = (
    Kind("node-kill", "node", 3, False),  # SIGKILL parent and worker, restart 0.3-1.5 s later
    Kind("worker-kill", "node", 2, False),  # SIGKILL the worker only (its parent releases)
    Kind("node-pause", "node", 2, False),  # SIGSTOP the worker past the TTL, then SIGCONT
    Kind("node-term", "node", 1.5, False),  # SIGTERM (graceful hand-over), restart later
    Kind("node-partition", "node", 2, False),  # cut off from every Redis port, 2-4 s
    Kind("redis-failover", "redis", 1, True),  # a planned SENTINEL FAILOVER
    Kind("redis-primary-kill", "redis", 1, True),  # SIGKILL the primary; restarted as a replica
    Kind("redis-replica-kill", "redis", 1, False),  # SIGKILL a replica; restarted
    Kind("pg-restart", "postgres", 1, True),  # SIGKILL PostgreSQL (crash recovery), start again
    Kind("pg-terminate", "postgres", 1, False),  # pg_terminate_backend on every node's session
    Kind("horizon-5xx", "horizon", 1.5, True),  # 500/502/503/504 for 0.5-2.5 s
    Kind("horizon-429", "horizon", 1, True),  # 429 with Retry-After 1 for 0.5-2 s
    Kind("horizon-cut", "horizon", 1, False),  # streams closed after a few events
    Kind("horizon-malformed", "horizon", 1, False),  # a broken, regressing or repeated record
    Kind("horizon-stall", "horizon", 1, True),  # streams silent for 1-3 s
    Kind("horizon-lag", "horizon", 1, True),  # history stops advancing for 1-3 s
    Kind("horizon-down", "horizon", 0.5, True),  # not listening for 1-2 s
    Kind("rpc-fail", "rpc", 1.5, True),  # -32001, 429 (Retry-After 1), 503 or 500 for 0.5-2 s
    Kind("rpc-lag", "rpc", 1, True),  # the RPC node reports ledgers 3 behind, 1-3 s
    Kind("rpc-slow", "rpc", 0.5, True),  # every answer 300 ms late, 1-3 s
    Kind("receiver-outage", "webhook", 2, True),  # 503, 429, hangs or drops for 0.5-2.5 s
    Kind("clock-jump", "clock", 1, False),  # the last node's wall clock jumps (libfaketime)
)
BY_NAME = {k.name: k for k in KINDS}
MALFORMED = ("broken_json", "missing_paging_token", "token_regression", "duplicate")


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


@attrs.define
class Report:
    """What the campaign did and what the judge found."""

    seed: int
    seconds: float
    bound: float
    faults: list[check.FaultWindow] = attrs.Factory(list)
    skipped_kinds: dict[str, str] = attrs.Factory(dict)
    skipped_faults: list[str] = attrs.Factory(list)  # drawn but not injected, and why
    jobs: dict[str, dict[str, Any]] = attrs.Factory(dict)
    violations: list[str] = attrs.Factory(list)
    counts: dict[str, int] = attrs.Factory(dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "seconds": self.seconds, "bound_s": round(self.bound, 3),
            "ok": self.ok, "faults": len(self.faults),
            "by_kind": _by_kind(self.faults), "skipped_kinds": self.skipped_kinds,
            "skipped_faults": self.skipped_faults,
            "jobs": self.jobs, "counts": self.counts, "violations": self.violations,
            "fault_list": [
                {"kind": f.kind, "target": f.target, "start": round(f.start, 3), "end": round(f.end, 3),
                 "jobs": sorted(f.jobs), "detail": f.detail}
                for f in self.faults
            ],
        }  # fmt: skip

    def text(self) -> str:
        lines = [
            f"chaos: seed {self.seed}, {self.seconds:.0f} s, {len(self.faults)} faults, "
            f"B = {self.bound:.1f} s"
        ]
        lines += [
            f"  {f.start:8.2f}..{f.end:8.2f}  {f.kind:<19} {f.target:<14} {f.detail}" for f in self.faults
        ]
        lines.append("by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(_by_kind(self.faults).items())))
        for kind, why in sorted(self.skipped_kinds.items()):
            lines.append(f"skipped: {kind}: {why}")
        if self.skipped_faults:
            first = self.skipped_faults[0]
            lines.append(f"drawn but not injected: {len(self.skipped_faults)} (the first: {first})")
        for job, j in self.jobs.items():
            lines.append(
                f"{job}: {j.get('records', 0)} records, {j.get('terms', 0)} terms; longest without a "
                f"commit {j.get('longest_no_commit_s', 0):.1f} s "
                f"(fault-free {j.get('longest_fault_free_no_commit_s', 0):.1f} s), "
                f"longest leaderless {j.get('longest_leaderless_s', 0):.1f} s, against B {self.bound:.1f} s; "
                + str(j.get("summary", ""))
            )
        lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))
        if self.ok:
            lines.append(
                f"chaos: PASSED (seed {self.seed}): 0 lost, 0 duplicated, 0 stale writes, liveness within B"
            )
        else:
            lines.append(f"chaos: FAILED (seed {self.seed}), {len(self.violations)} violations; the first:")
            lines += [f"  {v}" for v in self.violations[:20]]
        return "\n".join(lines)


def _by_kind(faults: Sequence[check.FaultWindow]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in faults:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out


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
        self.redis_busy = False
        self.last_failover = -1e9  # when the last Redis failover ended (campaign seconds)
        self.horizon = self.rpc = ""
        self.hook_port = 0
        self.t0 = 0.0
        self.samples: list[check.Sample] = []
        self.jobs: list[str] = []
        self.nursery: trio.Nursery | None = None
        self.config_path = self.dir / "chaos.toml"
        self.clock_file = self.dir / "faketime"  # the last node's wall-clock offset (libfaketime)
        self._polled = trio.Event()  # set after each poll, then replaced

    # -- time -----------------------------------------------------------------------------------

    def now(self) -> float:
        return trio.current_time() - self.t0

    # -- the cluster ----------------------------------------------------------------------------

    def config(self) -> Path:
        text = (
            f'[jobs.{OPS}]\nkind = "horizon"\nresource = "/operations"\nstart_cursor = "0"\n'
            f'[jobs.{RPC}]\nkind = "rpc"\nrpc = ["{self.rpc}"]\nstart_cursor = "0"\n'
            f'[jobs.{TICK}]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 500\n'
            f'[jobs.{HOOK}]\nkind = "webhook"\nfrom = "{OPS}"\nurl = "http://127.0.0.1:{self.hook_port}/in"\n'
            f'secret = "{SECRET}"\nstart = "first"\ntimeout_ms = 800\nconnect_timeout_ms = 500\n'
            'retry_schedule = ["50ms", "100ms", "200ms", "400ms", "500ms"]\non_exhausted = "block"\n'
        )
        if self.pg is not None:
            text += (f'[jobs.{PG}]\nkind = "horizon"\nresource = "/payments"\nstart_cursor = "0"\n'
                     f'sink = "{self.pg.url}"\n')  # fmt: skip
        path = self.dir / "chaos.toml"
        path.write_text(text)
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
        for i in range(1, self.o.nodes + 1):
            await self.start_node(f"n{i}")

    # -- watching -------------------------------------------------------------------------------

    async def _poll(self) -> None:
        """Every ``POLL`` seconds, each job's lease holder and committed cursor, read from the
        primary the sentinels name now (a client that follows failovers by itself could read a
        restarted old primary before the sentinels have made it a replica)."""
        clients: dict[int, Any] = {}
        pg_conn: Any = None
        redis_jobs = [j for j in self.jobs if j != PG]

        def primary_client() -> Any:
            port = self.redis.primary_port()
            if port not in clients:
                clients[port] = self.redis.client(self.redis.server(port), timeout=0.5)
            return clients[port]

        def once(at: float) -> list[check.Sample]:
            nonlocal pg_conn
            out: list[check.Sample] = []
            try:
                pipe = primary_client().pipeline(transaction=False)
                for job in self.jobs:
                    pipe.get(job_keys(job)["lease"])
                    pipe.hget(job_keys(job)["cursor"], "cursor")
                raw = pipe.execute()
            except Exception:
                return out
            holders = {job: raw[2 * i] for i, job in enumerate(self.jobs)}
            for job in redis_jobs:
                cursor = raw[2 * self.jobs.index(job) + 1]
                holder = holders[job]
                out.append(check.Sample(at, job, str(holder).partition("|")[2] if holder else None, cursor))
            if self.pg is not None:
                try:
                    if pg_conn is None:
                        import psycopg

                        pg_conn = psycopg.connect(self.pg.url, autocommit=True, connect_timeout=1,
                                                  options="-c statement_timeout=500")  # fmt: skip
                    row = pg_conn.execute(
                        "SELECT cursor FROM ingestion.cursors WHERE job = %s", (PG,)
                    ).fetchone()
                    holder = holders[PG]
                    out.append(check.Sample(at, PG, str(holder).partition("|")[2] if holder else None,
                                            row[0] if row else None))  # fmt: skip
                except Exception:
                    if pg_conn is not None:
                        pg_conn.close()
                    pg_conn = None
            return out

        try:
            while True:
                self.samples += await trio.to_thread.run_sync(once, self.now(), abandon_on_cancel=True)
                self._polled.set()
                self._polled = trio.Event()
                await trio.sleep(POLL)
        finally:
            for c in clients.values():
                c.close()

    def committed_since(self, job: str, since: float) -> bool:
        last = None
        for s in self.samples:
            if s.job != job:
                continue
            if s.at >= since and last is not None and s.cursor is not None and s.cursor != last:
                return True
            if s.cursor is not None:
                last = s.cursor
        return False

    async def recovered(self, since: float) -> None:
        """Until every job commits after ``since`` (at most B and the allowance)."""
        await self._until(
            lambda: all(self.committed_since(j, since) for j in self.jobs), self.bound + ALLOWANCE
        )

    async def _until(self, condition: Callable[[], bool], within: float) -> None:
        """Until ``condition`` holds, checked after each poll (at most ``within`` seconds)."""
        with trio.move_on_after(within):
            while not condition():
                await self._polled.wait()

    # -- faults ---------------------------------------------------------------------------------

    def enabled(self) -> list[Kind]:
        kinds = [k for k in KINDS if k.name not in self.report.skipped_kinds]
        if self.o.kinds:
            kinds = [k for k in kinds if k.name in self.o.kinds]
        return kinds

    def draw_round(self) -> list[tuple[Kind, float, random.Random]]:
        """One round: 1-4 faults, at most one per layer, each with its offset and its own
        random stream (so what a fault draws does not shift the next round's draws)."""
        kinds = self.enabled()
        n = self.rng.choices((1, 2, 3, 4), weights=(4, 4, 2, 1))[0]
        chosen: list[Kind] = []
        for _ in range(n):
            pool = [k for k in kinds if k.layer not in {c.layer for c in chosen}]
            if not pool:
                break
            chosen.append(self.rng.choices(pool, weights=[k.weight for k in pool])[0])
        return [(k, self.rng.uniform(0, 1.5), random.Random(self.rng.getrandbits(64))) for k in chosen]

    def leader_of(self, job: str) -> str | None:
        for s in reversed(self.samples):
            if s.job == job:
                return s.holder
        return None

    def pick_node(self, r: random.Random, jobs: Sequence[str] = ()) -> str | None:
        """A healthy node: the leader of a random job (of ``jobs``, default any) when it is
        healthy, else any healthy one."""
        healthy = sorted(
            n for n, c in self.children.items() if n != "simulator" and c.alive and n not in self.impaired
        )
        if len(healthy) < self.o.nodes or not healthy:
            return None  # a node is impaired already: keep two hosting every job
        job = r.choice(sorted(jobs or self.jobs))
        leader = self.leader_of(job)
        return leader if leader in healthy and r.random() < 0.8 else r.choice(healthy)

    def record(
        self, kind: Kind, target: str, start: float, end: float, jobs: frozenset[str], detail: str = ""
    ) -> None:
        self.report.faults.append(
            check.FaultWindow(kind.name, target, start, end if kind.lasts else start, jobs, detail)
        )

    async def inject(self, kind: Kind, r: random.Random) -> None:
        every = frozenset(self.jobs)
        start = self.now()
        layer = kind.layer
        if layer == "node":
            # a partition aims at a leader that commits to Redis: its commit on the way is the
            # delayed write the fence must refuse
            node = self.pick_node(r, (OPS, RPC, TICK) if kind.name == "node-partition" else ())
            if node is None:
                return
            self.impaired.add(node)
            await self._node_fault(kind, node, r, start, every)
        elif layer == "redis":
            if self.redis_busy:
                return
            self.redis_busy = True
            try:
                await self._redis_fault(kind, r, start, every)
            finally:
                self.redis_busy = False
        elif layer == "postgres":
            await self._pg_fault(kind, r, start)
        elif layer == "horizon":
            await self._horizon_fault(kind, r, start)
        elif layer == "rpc":
            await self._rpc_fault(kind, r, start)
        elif layer == "clock":
            offset = r.choice((-1, 1)) * r.uniform(5, 600)
            self.clock_file.write_text(f"{offset:+.0f}s\n")
            self.record(
                kind, f"n{self.o.nodes}", start, start, frozenset(self.jobs), f"wall clock {offset:+.0f} s"
            )
        else:
            await self._receiver_fault(kind, r, start)

    async def _node_fault(
        self, kind: Kind, node: str, r: random.Random, start: float, every: frozenset[str]
    ) -> None:
        child = self.children[node]
        if kind.name == "node-kill":
            child.send(signal.SIGKILL)
            with trio.move_on_after(10):
                await child.process.wait()
            down = r.uniform(0.3, 1.5)
            self.record(kind, node, start, start, every, f"down {down:.1f} s")
            await trio.sleep(down)
            await self.start_node(node)
        elif kind.name == "worker-kill":
            if child.worker_pid is None:
                self.impaired.discard(node)
                return
            child.kill_worker()
            self.record(kind, node, start, start, every, f"worker {child.worker_pid}")
            with trio.move_on_after(10):
                await child.process.wait()
            await trio.sleep(r.uniform(0.2, 1.0))
            await self.start_node(node)
        elif kind.name == "node-term":
            child.send(signal.SIGTERM)
            self.record(kind, node, start, start, every)
            with trio.move_on_after(15):
                await child.process.wait()
            if child.alive:
                child.send(signal.SIGKILL)
                await child.process.wait()
            await trio.sleep(r.uniform(0.2, 1.0))
            await self.start_node(node)
        elif kind.name == "node-pause":
            paused = self.o.ttl_ms / 1000 * r.uniform(1.2, 2.5)
            child.send(signal.SIGSTOP)
            self.record(kind, node, start, start, every, f"paused {paused:.1f} s")
            await trio.sleep(paused)
            child.send(signal.SIGCONT)
            self.impaired.discard(node)
        elif kind.name == "node-partition":
            assert self.links is not None
            gid = self.node_gid(node)
            assert gid is not None
            cut, drop = r.uniform(2.0, 4.0), r.random() < 0.3
            self.links.cut(gid)
            await trio.sleep(cut)
            held = self.links.heal(gid, drop=drop)
            how = "dropped" if drop else "delivered late"
            self.record(kind, node, start, start, every, f"cut off {cut:.1f} s, {held} held chunks {how}")
            self.impaired.discard(node)

    async def _redis_fault(self, kind: Kind, r: random.Random, start: float, every: frozenset[str]) -> None:
        g = self.redis
        if kind.name == "redis-replica-kill":
            # One replica down while the other acknowledges is one fault; both down (the other
            # still resyncing after its own kill) is an outage of every write (redis.
            # min_replicas_acked), which the jobs are not held to B through: wait for the sync
            try:
                await trio.to_thread.run_sync(g.wait_replicas_synced, 10.0)
            except TimeoutError as exc:
                self.report.skipped_faults.append(
                    f"{kind.name} at t={start:.1f}: replicas not in sync ({exc})"
                )
                return
            start = self.now()
            replica = r.choice(await trio.to_thread.run_sync(g.replicas))
            await trio.to_thread.run_sync(g.kill, replica)
            self.record(kind, f"replica:{replica.port}", start, start, every)
            await trio.sleep(r.uniform(0.5, 2.0))
            await trio.to_thread.run_sync(g.restart, replica)
            return
        # Sentinel refuses a failover of the same primary within twice its failover timeout of
        # the last one, and a replica still syncing cannot be promoted: such a round gets none
        since = self.now() - self.last_failover
        if since < REDIS_COOL_DOWN:
            self.report.skipped_faults.append(
                f"{kind.name} at t={start:.1f}: {since:.1f} s after the last failover"
            )
            return
        try:
            await trio.to_thread.run_sync(g.wait_replicas_synced, 10.0)
        except TimeoutError as exc:
            self.report.skipped_faults.append(f"{kind.name} at t={start:.1f}: replicas not in sync ({exc})")
            return
        start = self.now()
        old = await trio.to_thread.run_sync(g.primary_port)
        if kind.name == "redis-failover":
            await trio.to_thread.run_sync(g.failover)
        else:
            await trio.to_thread.run_sync(g.kill, g.server(old))
        try:
            new = await trio.to_thread.run_sync(g.wait_for_new_primary, old, 30.0)
            detail = f"new primary {new.port} after {self.now() - start:.1f} s"
        except TimeoutError:
            # Sentinel did not fail over (the deployment's matter, not the nodes'): bring the old
            # primary back if it was killed; the jobs are not held to B until a primary answers
            if kind.name == "redis-primary-kill":
                await trio.to_thread.run_sync(g.restart, g.server(old))
            await trio.to_thread.run_sync(g.wait_replicas_synced, 60.0)
            detail = "Sentinel did not fail over within 30 s; the old primary serves again"
        end = self.now()
        self.last_failover = end
        self.record(kind, f"primary:{old}", start, end, every, detail)
        if kind.name == "redis-primary-kill" and not detail.startswith("Sentinel did not"):
            await trio.to_thread.run_sync(g.restart, g.server(old))

    async def _pg_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        assert self.pg is not None
        jobs = frozenset({PG})
        if kind.name == "pg-restart":
            await trio.to_thread.run_sync(self.pg.kill)
            await trio.sleep(r.uniform(0.0, 1.0))
            await trio.to_thread.run_sync(self.pg.start)
            self.record(kind, "postgres", start, self.now(), jobs)
        else:
            import psycopg

            def terminate_sessions() -> int:
                assert self.pg is not None
                with psycopg.connect(self.pg.url, autocommit=True, connect_timeout=2) as conn:
                    rows = conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name LIKE 'ingestion%%' AND pid <> pg_backend_pid()"
                    ).fetchall()
                return len(rows)

            try:
                n = await trio.to_thread.run_sync(terminate_sessions)
            except psycopg.Error as exc:
                n, detail = 0, f"not done: {exc}"
            else:
                detail = f"{n} sessions"
            self.record(kind, "postgres", start, start, jobs, detail)

    async def _control(self, url: str, body: dict[str, Any] | None) -> None:
        async with httpx.AsyncClient(timeout=5) as http:
            if body is None:
                await http.delete(f"{url}/_simulator/faults")
            else:
                (await http.post(f"{url}/_simulator/faults", json=body)).raise_for_status()

    async def _horizon_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        jobs = HORIZON_JOBS & frozenset(self.jobs)
        name = kind.name
        if name == "horizon-5xx":
            status, t = r.choice((500, 502, 503, 504)), r.uniform(0.5, 2.5)
            await self._control(self.horizon, {"fail": {"status": status, "seconds": t}})
            await trio.sleep(t)
            self.record(kind, "horizon", start, self.now(), jobs, f"{status} for {t:.1f} s")
        elif name == "horizon-429":
            t = r.uniform(0.5, 2.0)
            await self._control(self.horizon, {"fail": {"status": 429, "seconds": t, "retry_after": 1}})
            await trio.sleep(t + 1)
            self.record(kind, "horizon", start, self.now(), jobs, f"429 Retry-After 1 for {t:.1f} s")
        elif name == "horizon-cut":
            n = r.randint(1, 5)
            await self._control(self.horizon, {"close_stream_after": {"events": n, "streams": 2}})
            self.record(kind, "horizon", start, start, jobs, f"streams closed after {n} events")
        elif name == "horizon-malformed":
            what = r.choice(MALFORMED)
            await self._control(self.horizon, {"malformed": {"kind": what}})
            self.record(kind, "horizon", start, start, jobs, what)
        elif name in ("horizon-stall", "horizon-lag"):
            t = r.uniform(1.0, 3.0)
            key = "stall" if name == "horizon-stall" else "freeze"
            await self._control(self.horizon, {key: {"seconds": t}})
            await trio.sleep(t)
            self.record(kind, "horizon", start, self.now(), jobs, f"{key} {t:.1f} s")
        else:
            t = r.uniform(1.0, 2.0)
            await self._control(self.horizon, {"down": {"seconds": t}})
            await trio.sleep(t + 0.2)
            self.record(kind, "horizon", start, self.now(), jobs | {RPC}, f"down {t:.1f} s")

    async def _rpc_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        jobs = frozenset({RPC})
        t = r.uniform(1.0, 3.0)
        if kind.name == "rpc-fail":
            what = r.choice(("processing_limit", "http_429", "http_503", "http_500"))
            t = r.uniform(0.5, 2.0)
            spec: dict[str, Any] = {"kind": what, "seconds": t}
            if what == "http_429":
                spec["retry_after"] = 1
            await self._control(self.rpc, {"fail": spec})
            await trio.sleep(t + (1 if what == "http_429" else 0))
            detail = f"{what} for {t:.1f} s"
        elif kind.name == "rpc-lag":
            await self._control(self.rpc, {"lag_ledgers": 3})
            await trio.sleep(t)
            await self._control(self.rpc, {"lag_ledgers": 0})
            detail = f"3 ledgers behind for {t:.1f} s"
        else:
            await self._control(self.rpc, {"delay_ms": 300})
            await trio.sleep(t)
            await self._control(self.rpc, {"delay_ms": 0})
            detail = f"300 ms late for {t:.1f} s"
        self.record(kind, "rpc", start, self.now(), jobs, detail)

    async def _receiver_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        t = r.uniform(0.5, 2.5)
        fault = r.choice((ReceiverFault(status=503), ReceiverFault(status=429, retry_after=1),
                          ReceiverFault(hang=1.0), ReceiverFault(drop=True)))  # fmt: skip
        self.receiver.fault = fault
        await trio.sleep(t)
        self.receiver.fault = None
        what = f"status {fault.status}" if fault.status else ("hang" if fault.hang else "drop")
        self.record(kind, "receiver", start, self.now() + (1 if fault.retry_after else 0), frozenset({HOOK}),
                    f"{what} for {t:.1f} s")  # fmt: skip

    # -- the run --------------------------------------------------------------------------------

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
        nursery.start_soon(self._poll)
        await self._until(
            lambda: all(self.committed_since(j, 0) for j in self.jobs) and not self.impaired, WARM_UP
        )
        missing = [j for j in self.jobs if not self.committed_since(j, 0)]
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
            planned = self.draw_round()
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
            await self.inject(kind, r)
        except (OSError, RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            # the harness could not carry the fault out: the run goes on (its records are still
            # judged) but fails, naming it, rather than losing everything to one broken step
            self.report.violations.append(f"harness: {kind.name} at t={at:.1f} failed: {exc!r}")

    async def _finish(self, begin: float) -> None:
        """Heal everything, let delivery catch up, stop the nodes, judge."""
        end = self.now()
        await self._control(self.horizon, None)
        await self._control(self.rpc, None)
        self.receiver.fault = None
        await self._until(lambda: not self.impaired, 30)
        await self.recovered(self.now())
        judged_until = self.now()
        client = connect(self.redis.url, timeout=5.0)

        def caught_up() -> bool:
            last: Any = client.xrevrange(job_keys(OPS)["events"], count=1)
            position = client.hget(job_keys(HOOK)["cursor"], "cursor")
            return bool(last) and position == last[0][1]["paging_token"]

        with trio.move_on_after(SETTLE) as settling:
            while not await trio.to_thread.run_sync(caught_up):
                await self._polled.wait()
        if settling.cancelled_caught:
            self.report.violations.append(
                f"{HOOK}: delivery did not reach the last record of {OPS} within {SETTLE:.0f} s of the end"
            )
        await self._stop_nodes()
        self.say(f"chaos: {len(self.report.faults)} faults injected; stopped; judging")
        try:
            await self._judge(begin, min(end, judged_until), client)
        finally:
            client.close()

    async def _stop_nodes(self) -> None:
        nodes = [c for n, c in self.children.items() if n != "simulator"]
        for c in nodes:
            if c.paused:
                c.send(signal.SIGCONT)
        await terminate([c.process for c in nodes], grace=15)

    # -- the judge ------------------------------------------------------------------------------

    async def _judge(self, begin: float, end: float, client: Any) -> None:
        r = self.report
        v = r.violations
        results: dict[str, Verification] = {}
        results[OPS] = await verify_job(self.redis.url, OPS, self.horizon, "/operations")
        results[RPC] = await verify_rpc_job(self.redis.url, RPC, self.rpc)
        results[TICK] = await self._verify_tick()
        if self.pg is not None:
            entries, trimmed, fence_problems, terms = await read_postgres_evidence(
                self.pg.url, "ingestion", PG
            )
            through = entries[-1].paging_token if entries else None
            source = await fetch_source(self.horizon, "/payments", "0", through=through)
            res = check_stream(entries, source, None, trimmed)
            results[PG] = attrs.evolve(res, problems=res.problems + tuple(fence_problems), fence_terms=terms)
        results[HOOK] = await trio.to_thread.run_sync(self._verify_hook, client)
        rollbacks = bool(
            [
                e
                for e in self.log.lines
                if e.event == "redis-failover-detected" and e.fields.get("rolled_back")
            ]
            or self.log.of("redis-state-lost")
        )
        for job in self.jobs:
            res = results[job]
            v += [f"{job}: {p}" for p in res.problems]
            samples = [s for s in self.samples if s.job == job]
            commits = check.commit_times(samples)
            v += check.liveness_problems(job, commits, r.faults, begin, end, self.bound + ALLOWANCE)
            audit = await trio.to_thread.run_sync(_audit, client, job)
            logged = [
                check.LoggedGrant(e.at, e.node, int(e.fields["token"]), kind)
                for event, kind in (("became-leader", "became-leader"),
                                    ("redis-unavailable", "unconfirmed"),
                                    ("releasing-orphaned-lease", "orphaned"))
                for e in self.log.of(event, job=job)
                if e.fields.get("token") is not None
            ]  # fmt: skip
            # the nodes' lines on Redis's clock (the same host's wall clock) for the audit
            wall_ms = time.time() * 1000 - trio.current_time() * 1000
            unanswered = [
                (e.node, int(wall_ms + e.at * 1000)) for e in self.log.of("redis-unavailable", job=job)
                if e.fields.get("token") is None
            ]  # fmt: skip
            v += check.election_problems(
                job, audit, logged, self.o.ttl_ms, rollbacks=rollbacks, unanswered=unanswered
            )
            gap = check.longest_gap(commits, begin, end)
            quiet = [
                check.longest_gap(commits, q.start, q.end)
                for q in check.fault_free(r.faults, job, begin, end)
            ]
            lost = check.leaderless([s for s in samples if begin <= s.at <= end])
            r.jobs[job] = {
                "records": res.count,
                "terms": len({g.token for g in logged}),
                "summary": res.summary().splitlines()[0],
                "longest_no_commit_s": round(gap.length, 2) if gap else 0,
                "longest_fault_free_no_commit_s": round(max((q.length for q in quiet if q), default=0), 2),
                "longest_fault_free_no_commit_at": _span(
                    max((q for q in quiet if q), key=lambda q: q.length, default=None)
                ),
                "longest_leaderless_s": round(max((s.length for s in lost), default=0), 2),
                "longest_leaderless_at": _span(max(lost, key=lambda q: q.length, default=None)),
                "reissued_tokens": check.reissued_tokens(logged),
            }
        count = {e: len(self.log.of(e)) for e in (
            "became-leader", "lost-leadership", "fencing-token-rejected", "commit-outcome-unknown",
            "commit-unknown", "redis-failover-detected", "ingestion-stopped-at-deadline", "job-stopped",
            "worker-died",
        )}  # fmt: skip
        count["webhook_duplicates"] = self.receiver.duplicates
        count["webhook_stale_refused"] = self.receiver.refused_stale
        count["webhook_bad_signatures"] = self.receiver.refused_signature
        r.counts = count
        if self.receiver.refused_signature:
            v.append(f"{HOOK}: {self.receiver.refused_signature} deliveries with a bad signature")
        stopped = [e for name in ("job-stopped", "ingestion-fatal", "term-failed", "job-failed")
                   for e in self.log.of(name)]  # fmt: skip
        v += [f"{e.node}: {e.event} {e.fields.get('job')}: {e.fields.get('error', '')}" for e in stopped]
        tracebacks = [text for _n, text in self.log.raw if "Traceback (most recent call last)" in text]
        v += [f"a node printed a traceback ({len(tracebacks)} in all)"] if tracebacks else []

    async def _verify_tick(self) -> Verification:
        entries, grants, trimmed = await read_evidence(self.redis.url, TICK)
        source = []
        for i, e in enumerate(entries):
            run = str(trimmed + i + 1)
            body = json.loads(e.record)
            source.append(
                SourceRecord(run, body if e.paging_token == run and str(body.get("run")) == run else None)
            )
        res = check_stream(entries, source, grants, trimmed)
        wrong = [
            f"run {e.paging_token}: its record says token {json.loads(e.record).get('token')}, "
            f"committed under {e.token}"
            for e in entries
            if json.loads(e.record).get("token") != e.token
        ]
        return attrs.evolve(res, problems=res.problems + tuple(wrong[:5]))

    def _verify_hook(self, client: Any) -> Verification:
        source = [f["paging_token"] for _id, f in client.xrange(job_keys(OPS)["events"])]
        position = client.hget(job_keys(HOOK)["cursor"], "cursor")
        delivered = [str(rec.get("paging_token")) for rec in self.receiver.records()]
        problems = []
        upto = source[: source.index(position) + 1] if position in source else []
        if position is not None and position not in source:
            problems.append(f"the delivery position {position} is not a record of {OPS}")
        if delivered[: len(upto)] != upto:
            first = next(
                (i for i, (a, b) in enumerate(zip(delivered, upto, strict=False)) if a != b),
                min(len(delivered), len(upto)),
            )
            problems.append(
                f"the receiver's records differ from {OPS}'s at {first}: "
                f"{delivered[first : first + 3]} where the stream has {upto[first : first + 3]} "
                f"({len(delivered)} delivered, {len(upto)} up to the position)"
            )
        rest = delivered[len(upto) :]
        if rest != source[len(upto) : len(upto) + len(rest)]:
            problems.append(f"past the position, the receiver has {rest[:3]}, not the stream's next records")
        return Verification(
            count=len(delivered),
            first=delivered[0] if delivered else None,
            last=delivered[-1] if delivered else None,
            tokens=(),
            problems=tuple(problems),
        )


def _span(stretch: check.Stretch | None) -> list[float] | None:
    return None if stretch is None else [round(stretch.start, 2), round(stretch.end, 2)]


def _audit(client: Any, job: str) -> list[check.AuditGrant]:
    out = []
    for entry_id, f in client.xrange(job_keys(job)["audit"]):
        if f.get("event") not in ("became-leader", "released"):
            continue
        prev = f.get("previous_token") or ""
        take = f.get("takeover_ms") or ""
        out.append(check.AuditGrant(
            int(entry_id.partition("-")[0]), f["event"], f["node"], int(f["token"]),
            int(prev) if prev else None, int(float(take)) if take else None,
        ))  # fmt: skip
    return out


def write_json(
    report: Report, path: str | os.PathLike[str], log: EventLog | None = None, t0: float = 0.0
) -> None:
    """The summary at ``path``; with ``log``, every node's log line beside it (``PATH.log``,
    JSON lines, ``t`` on the campaign's clock)."""
    Path(path).write_text(json.dumps(report.as_json(), indent=1) + "\n")
    if log is not None:
        with open(f"{path}.log", "w") as f:
            for e in log.lines:
                f.write(
                    json.dumps({"t": round(e.at - t0, 3), "process": e.node, "event": e.event, **e.fields})
                    + "\n"
                )
            for process, text in log.raw:  # what was not a log line (a traceback, say), at the end
                f.write(json.dumps({"process": process, "raw": text}) + "\n")
