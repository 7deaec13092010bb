"""The campaign's faults: the kinds it draws from (:data:`KINDS`), how a round is drawn, and how
each kind is carried out on the running cluster and recorded (a :class:`~chaos.check.FaultWindow`).

The schedule (which kinds, when, for how long, aimed at which role) is a function of the seed
alone; which node a role names depends on the run. At most one node is impaired at a time (dead,
paused, cut off, or restarting), so two always host every job.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import trio

from chaos import check
from chaos.jobs import HOOK, HORIZON_JOBS, OPS, PG, RPC, TICK
from ingestion.testing.receiver import Fault as ReceiverFault

if TYPE_CHECKING:
    from chaos.campaign import Campaign

REDIS_COOL_DOWN = 12.0  # seconds between failovers: Sentinel's 2 x failover-timeout (5 s), and some


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


async def control(url: str, body: dict[str, Any] | None) -> None:
    """Set the simulator's faults at ``url`` (``None``: clear them all)."""
    async with httpx.AsyncClient(timeout=5) as http:
        if body is None:
            await http.delete(f"{url}/_simulator/faults")
        else:
            (await http.post(f"{url}/_simulator/faults", json=body)).raise_for_status()


class Faults:
    """Draws the rounds and carries each fault out on campaign ``c``'s cluster."""

    def __init__(self, c: Campaign) -> None:
        self.c = c
        self.redis_busy = False
        self.last_failover = -1e9  # when the last Redis failover ended (campaign seconds)

    def enabled(self) -> list[Kind]:
        kinds = [k for k in KINDS if k.name not in self.c.report.skipped_kinds]
        if self.c.o.kinds:
            kinds = [k for k in kinds if k.name in self.c.o.kinds]
        return kinds

    def draw_round(self) -> list[tuple[Kind, float, random.Random]]:
        """One round: 1-4 faults, at most one per layer, each with its offset and its own
        random stream (so what a fault draws does not shift the next round's draws)."""
        kinds = self.enabled()
        n = self.c.rng.choices((1, 2, 3, 4), weights=(4, 4, 2, 1))[0]
        chosen: list[Kind] = []
        for _ in range(n):
            pool = [k for k in kinds if k.layer not in {c.layer for c in chosen}]
            if not pool:
                break
            chosen.append(self.c.rng.choices(pool, weights=[k.weight for k in pool])[0])
        return [(k, self.c.rng.uniform(0, 1.5), random.Random(self.c.rng.getrandbits(64))) for k in chosen]

    def pick_node(self, r: random.Random, jobs: Sequence[str] = ()) -> str | None:
        """A healthy node: the leader of a random job (of ``jobs``, default any) when it is
        healthy, else any healthy one."""
        healthy = sorted(
            n for n, c in self.c.children.items() if n != "simulator" and c.alive and n not in self.c.impaired
        )
        if len(healthy) < self.c.o.nodes or not healthy:
            return None  # a node is impaired already: keep two hosting every job
        job = r.choice(sorted(jobs or self.c.jobs))
        leader = self.c.polls.leader_of(job)
        return leader if leader in healthy and r.random() < 0.8 else r.choice(healthy)

    def record(
        self, kind: Kind, target: str, start: float, end: float, jobs: frozenset[str], detail: str = ""
    ) -> None:
        self.c.report.faults.append(
            check.FaultWindow(kind.name, target, start, end if kind.lasts else start, jobs, detail)
        )

    async def inject(self, kind: Kind, r: random.Random) -> None:
        every = frozenset(self.c.jobs)
        start = self.c.now()
        layer = kind.layer
        if layer == "node":
            # a partition aims at a leader that commits to Redis: its commit on the way is the
            # delayed write the fence must refuse
            node = self.pick_node(r, (OPS, RPC, TICK) if kind.name == "node-partition" else ())
            if node is None:
                return
            self.c.impaired.add(node)
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
            self.c.clock_file.write_text(f"{offset:+.0f}s\n")
            self.record(
                kind,
                f"n{self.c.o.nodes}",
                start,
                start,
                frozenset(self.c.jobs),
                f"wall clock {offset:+.0f} s",
            )
        else:
            await self._receiver_fault(kind, r, start)

    async def _node_fault(
        self, kind: Kind, node: str, r: random.Random, start: float, every: frozenset[str]
    ) -> None:
        child = self.c.children[node]
        if kind.name == "node-kill":
            child.send(signal.SIGKILL)
            with trio.move_on_after(10):
                await child.process.wait()
            down = r.uniform(0.3, 1.5)
            self.record(kind, node, start, start, every, f"down {down:.1f} s")
            await trio.sleep(down)
            await self.c.start_node(node)
        elif kind.name == "worker-kill":
            if child.worker_pid is None:
                self.c.impaired.discard(node)
                return
            child.kill_worker()
            self.record(kind, node, start, start, every, f"worker {child.worker_pid}")
            with trio.move_on_after(10):
                await child.process.wait()
            await trio.sleep(r.uniform(0.2, 1.0))
            await self.c.start_node(node)
        elif kind.name == "node-term":
            child.send(signal.SIGTERM)
            self.record(kind, node, start, start, every)
            with trio.move_on_after(15):
                await child.process.wait()
            if child.alive:
                child.send(signal.SIGKILL)
                await child.process.wait()
            await trio.sleep(r.uniform(0.2, 1.0))
            await self.c.start_node(node)
        elif kind.name == "node-pause":
            paused = self.c.o.ttl_ms / 1000 * r.uniform(1.2, 2.5)
            child.send(signal.SIGSTOP)
            self.record(kind, node, start, start, every, f"paused {paused:.1f} s")
            await trio.sleep(paused)
            child.send(signal.SIGCONT)
            self.c.impaired.discard(node)
        elif kind.name == "node-partition":
            assert self.c.links is not None
            gid = self.c.node_gid(node)
            assert gid is not None
            cut, drop = r.uniform(2.0, 4.0), r.random() < 0.3
            self.c.links.cut(gid)
            await trio.sleep(cut)
            held = self.c.links.heal(gid, drop=drop)
            how = "dropped" if drop else "delivered late"
            self.record(kind, node, start, start, every, f"cut off {cut:.1f} s, {held} held chunks {how}")
            self.c.impaired.discard(node)

    async def _redis_fault(self, kind: Kind, r: random.Random, start: float, every: frozenset[str]) -> None:
        g = self.c.redis
        if kind.name == "redis-replica-kill":
            # One replica down while the other acknowledges is one fault; both down (the other
            # still resyncing after its own kill) is an outage of every write (redis.
            # min_replicas_acked), which the jobs are not held to B through: wait for the sync
            try:
                await trio.to_thread.run_sync(g.wait_replicas_synced, 10.0)
            except TimeoutError as exc:
                self.c.report.skipped_faults.append(
                    f"{kind.name} at t={start:.1f}: replicas not in sync ({exc})"
                )
                return
            start = self.c.now()
            replica = r.choice(await trio.to_thread.run_sync(g.replicas))
            await trio.to_thread.run_sync(g.kill, replica)
            self.record(kind, f"replica:{replica.port}", start, start, every)
            await trio.sleep(r.uniform(0.5, 2.0))
            await trio.to_thread.run_sync(g.restart, replica)
            return
        # Sentinel refuses a failover of the same primary within twice its failover timeout of
        # the last one, and a replica still syncing cannot be promoted: such a round gets none
        since = self.c.now() - self.last_failover
        if since < REDIS_COOL_DOWN:
            self.c.report.skipped_faults.append(
                f"{kind.name} at t={start:.1f}: {since:.1f} s after the last failover"
            )
            return
        try:
            await trio.to_thread.run_sync(g.wait_replicas_synced, 10.0)
        except TimeoutError as exc:
            self.c.report.skipped_faults.append(f"{kind.name} at t={start:.1f}: replicas not in sync ({exc})")
            return
        start = self.c.now()
        old = await trio.to_thread.run_sync(g.primary_port)
        if kind.name == "redis-failover":
            await trio.to_thread.run_sync(g.failover)
        else:
            await trio.to_thread.run_sync(g.kill, g.server(old))
        try:
            new = await trio.to_thread.run_sync(g.wait_for_new_primary, old, 30.0)
            detail = f"new primary {new.port} after {self.c.now() - start:.1f} s"
        except TimeoutError:
            # Sentinel did not fail over (the deployment's matter, not the nodes'): bring the old
            # primary back if it was killed; the jobs are not held to B until a primary answers
            if kind.name == "redis-primary-kill":
                await trio.to_thread.run_sync(g.restart, g.server(old))
            await trio.to_thread.run_sync(g.wait_replicas_synced, 60.0)
            detail = "Sentinel did not fail over within 30 s; the old primary serves again"
        end = self.c.now()
        self.last_failover = end
        self.record(kind, f"primary:{old}", start, end, every, detail)
        if kind.name == "redis-primary-kill" and not detail.startswith("Sentinel did not"):
            await trio.to_thread.run_sync(g.restart, g.server(old))

    async def _pg_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        assert self.c.pg is not None
        jobs = frozenset({PG})
        if kind.name == "pg-restart":
            await trio.to_thread.run_sync(self.c.pg.kill)
            await trio.sleep(r.uniform(0.0, 1.0))
            await trio.to_thread.run_sync(self.c.pg.start)
            self.record(kind, "postgres", start, self.c.now(), jobs)
        else:
            import psycopg

            def terminate_sessions() -> int:
                assert self.c.pg is not None
                with psycopg.connect(self.c.pg.url, autocommit=True, connect_timeout=2) as conn:
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

    async def _horizon_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        jobs = HORIZON_JOBS & frozenset(self.c.jobs)
        name = kind.name
        if name == "horizon-5xx":
            status, t = r.choice((500, 502, 503, 504)), r.uniform(0.5, 2.5)
            await control(self.c.horizon, {"fail": {"status": status, "seconds": t}})
            await trio.sleep(t)
            self.record(kind, "horizon", start, self.c.now(), jobs, f"{status} for {t:.1f} s")
        elif name == "horizon-429":
            t = r.uniform(0.5, 2.0)
            await control(self.c.horizon, {"fail": {"status": 429, "seconds": t, "retry_after": 1}})
            await trio.sleep(t + 1)
            self.record(kind, "horizon", start, self.c.now(), jobs, f"429 Retry-After 1 for {t:.1f} s")
        elif name == "horizon-cut":
            n = r.randint(1, 5)
            await control(self.c.horizon, {"close_stream_after": {"events": n, "streams": 2}})
            self.record(kind, "horizon", start, start, jobs, f"streams closed after {n} events")
        elif name == "horizon-malformed":
            what = r.choice(MALFORMED)
            await control(self.c.horizon, {"malformed": {"kind": what}})
            self.record(kind, "horizon", start, start, jobs, what)
        elif name in ("horizon-stall", "horizon-lag"):
            t = r.uniform(1.0, 3.0)
            key = "stall" if name == "horizon-stall" else "freeze"
            await control(self.c.horizon, {key: {"seconds": t}})
            await trio.sleep(t)
            self.record(kind, "horizon", start, self.c.now(), jobs, f"{key} {t:.1f} s")
        else:
            t = r.uniform(1.0, 2.0)
            await control(self.c.horizon, {"down": {"seconds": t}})
            await trio.sleep(t + 0.2)
            self.record(kind, "horizon", start, self.c.now(), jobs | {RPC}, f"down {t:.1f} s")

    async def _rpc_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        jobs = frozenset({RPC})
        t = r.uniform(1.0, 3.0)
        if kind.name == "rpc-fail":
            what = r.choice(("processing_limit", "http_429", "http_503", "http_500"))
            t = r.uniform(0.5, 2.0)
            spec: dict[str, Any] = {"kind": what, "seconds": t}
            if what == "http_429":
                spec["retry_after"] = 1
            await control(self.c.rpc, {"fail": spec})
            await trio.sleep(t + (1 if what == "http_429" else 0))
            detail = f"{what} for {t:.1f} s"
        elif kind.name == "rpc-lag":
            await control(self.c.rpc, {"lag_ledgers": 3})
            await trio.sleep(t)
            await control(self.c.rpc, {"lag_ledgers": 0})
            detail = f"3 ledgers behind for {t:.1f} s"
        else:
            await control(self.c.rpc, {"delay_ms": 300})
            await trio.sleep(t)
            await control(self.c.rpc, {"delay_ms": 0})
            detail = f"300 ms late for {t:.1f} s"
        self.record(kind, "rpc", start, self.c.now(), jobs, detail)

    async def _receiver_fault(self, kind: Kind, r: random.Random, start: float) -> None:
        t = r.uniform(0.5, 2.5)
        fault = r.choice((ReceiverFault(status=503), ReceiverFault(status=429, retry_after=1),
                          ReceiverFault(hang=1.0), ReceiverFault(drop=True)))  # fmt: skip
        self.c.receiver.fault = fault
        await trio.sleep(t)
        self.c.receiver.fault = None
        what = f"status {fault.status}" if fault.status else ("hang" if fault.hang else "drop")
        end = self.c.now() + (1 if fault.retry_after else 0)
        self.record(kind, "receiver", start, end, frozenset({HOOK}), f"{what} for {t:.1f} s")

    # -- the run --------------------------------------------------------------------------------
