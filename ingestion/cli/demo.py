"""``python -m ingestion demo``: watch a failover happen, on one machine, in about 40 seconds.

Starts a throwaway redis-server, the bundled Horizon simulator and N nodes as child processes (all
on 127.0.0.1), prints their election events interleaved, one line each, with a progress line every
couple of seconds. The nodes share ``--jobs`` Horizon jobs (default 3: operations, payments,
effects) and one job following the simulator's Stellar RPC contract events (``--no-rpc-job`` leaves
it out), and the balancer spreads their leadership. Then it SIGKILLs the leader of the first job
(parent and worker: a host crash, the lease expires) and reports how long that job was leaderless,
restarts the killed node (it rejoins and gets its share back), SIGKILLs the next leader's worker
only (a process crash: its parent releases the lease at once) and reports that time, restarts it,
hands leadership over gracefully with SIGTERM and reports that time too, showing where
every job is led after each step; and finally checks every job's events stream against the
simulator's own records (:mod:`ingestion.verify`). When a PostgreSQL server is installed (Debian's
``postgresql``), a throwaway one is started as well (``ingestion/testing/local_postgres.py``) and one more
job writes there (``[jobs.NAME] sink``) through the same failovers; its rows are verified against
the simulator and judged by their fence history; the contract-events job writes there too, and
the nodes serve it with the events API (:mod:`ingestion.cli.demo_api`: the simulated RPC keeps only
its newest ``RPC_WINDOW`` ledgers, and the API answers from the job's first ledger where the RPC
refuses). Without it, one line says so. The operator console's address is printed once the nodes
are up (each node serves it on a port of its own). Exit status: 0
when the stream verified, 1 when it did not or the demo could not run, 2 for a bad flag. Every
child is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import tempfile
from typing import TextIO

import attrs
import httpx
import psycopg
import redis
import trio

from actors.lease_store import connect, job_keys
from ingestion.cli import demo_api
from ingestion.testing.cluster import Child, EventLog, spawn
from ingestion.testing.launch import (
    LISTENING,
    LogLine,
    joined,
    kill_remaining,
    node_command,
    simulator_command,
    terminate,
)
from ingestion.testing.local_postgres import LocalPostgres, server_bin
from ingestion.testing.local_redis import LocalRedis, RedisServerMissing, free_port
from ingestion.verify import (
    Verification,
    check_stream,
    fetch_source,
    read_postgres_evidence,
    verify_job,
    verify_rpc_job,
)

SHOWN = (
    "node-starting",
    "became-leader",
    "standby",
    "lost-leadership",
    "fencing-token-rejected",
    "ingestion-stopped-at-deadline",
    "releasing-orphaned-lease",
    "lease-released",
    "redis-state-lost",
    "redis-unavailable",
    "ingestion-fatal",
    "handing-back",
    "node-stopped",
    "worker-died",
)
FIELDS = {
    "node-starting": ("lease_ttl_ms", "renew_interval_ms", "safety_margin_ms", "pid"),
    "worker-died": ("worker_pid", "signal", "leases_released", "release_ms"),
    "became-leader": ("token", "cursor", "previous_node", "previous_token", "takeover_ms"),
    "standby": ("leader", "token"),
    "lost-leadership": ("token", "reason"),
    "handing-back": ("handed_job", "share", "leading", "live"),
    "fencing-token-rejected": ("token", "current_token", "cursor"),
}
COLORS = ("\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[91m", "\033[96m")
BOLD, RESET = "\033[1m", "\033[0m"
PROGRESS_EVERY = 2.0  # seconds
STEP_TIMEOUT = 30.0  # seconds: the most any one step of the demo may take
RPC_WINDOW = 50  # ledgers the simulated RPC keeps (10 s of them; stellar-rpc keeps 7 days)
# The demo's jobs: (name suffix, Horizon collection); the first is "the" job whose leader is hit.
JOBS = (("", "/operations"), ("-payments", "/payments"), ("-effects", "/effects"),
        ("-transactions", "/transactions"), ("-ledgers", "/ledgers"), ("-trades", "/operations"))  # fmt: skip


class DemoFailed(Exception):
    pass


@attrs.define
class Demo:
    nodes: int
    ttl_ms: int
    duration: float
    out: TextIO
    color: bool
    jobs: int = 1
    rpc_job: bool = False  # also one job following the simulator's Stellar RPC contract events
    redis: LocalRedis = attrs.field(factory=LocalRedis)
    job: str = "demo"
    horizon: str = ""
    rpc: str = ""
    config_dir: str = ""
    postgres: LocalPostgres | None = None  # a job on PostgreSQL too, when it is installed
    lake: str = ""  # the simulator's data lake (file://...): every ledger, for verifying past the RPC
    ports: dict[str, tuple[int, int]] = attrs.Factory(dict)  # node -> (console/metrics, events API)
    log: EventLog = attrs.Factory(EventLog)
    procs: dict[str, Child] = attrs.Factory(dict)
    every: list[trio.Process] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.log.echo = self._show

    # -- output ---------------------------------------------------------------------------------

    def say(self, who: str, what: str, detail: str = "", *, bold: bool = False) -> None:
        clock = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        color = ""
        if self.color:
            names = sorted(self.procs) or [who]
            color = COLORS[names.index(who) % len(COLORS)] if who in names else ""
            color += BOLD if bold else ""
        reset = RESET if color else ""
        print(f"{clock}  {color}{who:<8}  {what:<24}{reset} {detail}".rstrip(), file=self.out)
        self.out.flush()

    def _show(self, line: LogLine) -> None:
        if line.event not in SHOWN:
            return
        keys = FIELDS.get(line.event) or tuple(
            k for k in line.fields if k not in ("timestamp", "level", "node", "job")
        )
        detail = " ".join(f"{k}={line.fields.get(k)}" for k in keys if k in line.fields)
        if self.jobs > 1 and line.event not in ("node-starting", "node-stopped", "handing-back"):
            detail = f"job={line.fields.get('job')} {detail}"
        self.say(line.node, line.event, detail, bold=line.event == "became-leader")

    # -- processes ------------------------------------------------------------------------------

    async def _spawn(
        self, nursery: trio.Nursery, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> Child:
        """The child ``name``: its JSON lines are shown as they come (a traceback or a warning is
        not part of the show)."""
        child = await spawn(nursery, name, args, self.log, env)
        self.procs[name] = child
        self.every.append(child.process)
        return child

    async def wait_for(
        self, event: str, *, since: float, node: str | None = None, job: str | None = None
    ) -> LogLine:
        fields = {} if job is None else {"job": job}
        with trio.fail_after(STEP_TIMEOUT):
            while not (found := self.log.of(event, node, since=since, **fields)):
                await self.log.changed()
            return found[0]

    @property
    def job_specs(self) -> list[tuple[str, str]]:
        """(job name, resource) of every job the nodes host."""
        return [(self.job + suffix, resource) for suffix, resource in JOBS[: self.jobs]]

    @property
    def rpc_job_name(self) -> str:
        return f"{self.job}-contract-events"

    @property
    def pg_job_name(self) -> str:
        return f"{self.job}-postgres"

    @property
    def api(self) -> bool:
        """The nodes serve the events API over the RPC job (its sink then is PostgreSQL)."""
        return self.rpc_job and self.postgres is not None

    def _pg_jobs(self) -> list[str]:
        return ([self.rpc_job_name] if self.api else []) + ([self.pg_job_name] if self.postgres else [])

    def _other_jobs(self) -> list[str]:
        return ([self.rpc_job_name] if self.rpc_job else []) + ([self.pg_job_name] if self.postgres else [])

    def write_config(self) -> list[str]:
        """The flags that add the RPC job: a [jobs.NAME] table in a config file of the demo's own
        (a node's flags describe Horizon jobs only)."""
        if not self._other_jobs():
            return []
        path = os.path.join(self.config_dir, "demo.toml")
        with open(path, "w") as f:
            if self.rpc_job:
                f.write(
                    f'[jobs.{self.rpc_job_name}]\nkind = "rpc"\nrpc = ["{self.rpc}"]\n'
                    'start_cursor = "0"\n'
                )
                if self.api and self.postgres is not None:  # its rows in PostgreSQL, served by the API
                    f.write(f'sink = "{self.postgres.url}"\n')
            if self.postgres:
                f.write(
                    f'[jobs.{self.pg_job_name}]\nkind = "horizon"\nresource = "/payments"\n'
                    f'start_cursor = "0"\nsink = "{self.postgres.url}"\n'
                )
            if self.api:
                f.write(f'[api]\njob = "{self.rpc_job_name}"\n')
        return ["--config", path, *(a for job in self._other_jobs() for a in ("--job", job))]

    def node_args(self, name: str) -> list[str]:
        return node_command(
            name,
            jobs=[f"{job}={res}" for job, res in self.job_specs],
            redis_url=self.redis.url,
            horizon=self.horizon,
            ttl_ms=self.ttl_ms,
            extra=[*self.write_config(), "--metrics-port", str(self.ports[name][0])],
        )

    async def start_node(self, nursery: trio.Nursery, name: str) -> None:
        since = trio.current_time()
        self.ports.setdefault(name, (free_port(), free_port()))
        env = {"INGESTION_API_PORT": str(self.ports[name][1])} if self.api else {}
        await self._spawn(nursery, name, self.node_args(name), env)
        with trio.fail_after(STEP_TIMEOUT):
            while not any(joined(ln, name, since) for ln in self.log.lines):
                await self.log.changed()

    def _read_state(self) -> tuple[int, str | None, str | None]:
        """(events, cursor, lease holder) read now; blocking, so run it in a thread."""
        keys = job_keys(self.job)
        client = connect(self.redis.url, timeout=1.0)
        try:
            pipe = client.pipeline(transaction=False)
            pipe.xlen(keys["events"])
            pipe.hget(keys["cursor"], "cursor")
            pipe.get(keys["lease"])
            events, cursor, lease = pipe.execute()
        finally:
            client.close()
        holder = str(lease).partition("|")[2] if lease else None
        return int(events), cursor, holder

    async def leader(self) -> str | None:
        """The lease holder in Redis right now."""
        return (await trio.to_thread.run_sync(self._read_state))[2]

    def _placement(self) -> dict[str, tuple[str | None, int]]:
        """job -> (lease holder, events) read now; blocking, so run it in a thread."""
        client = connect(self.redis.url, timeout=1.0)
        jobs = [job for job, _ in self.job_specs] + self._other_jobs()
        try:
            pipe = client.pipeline(transaction=False)
            for job in jobs:
                pipe.get(job_keys(job)["lease"])
                pipe.xlen(job_keys(job)["events"])
            raw = pipe.execute()
        finally:
            client.close()
        out = {}
        for i, job in enumerate(jobs):
            lease, events = raw[2 * i], raw[2 * i + 1]
            out[job] = (str(lease).partition("|")[2] if lease else None, int(events))
        if self.postgres is not None:  # its records are rows in PostgreSQL, not a Redis stream
            from ingestion.postgres.connection import connect as pg_connect

            with pg_connect(self.postgres.url, 1.0) as conn:
                for job in self._pg_jobs():
                    row = conn.execute(
                        "SELECT count(*) FROM ingestion.events WHERE job = %s", (job,)
                    ).fetchone()
                    out[job] = (out[job][0], int(row[0]) if row else 0)
        return out

    async def show_placement(self, what: str = "placement") -> None:
        placed = await trio.to_thread.run_sync(self._placement)
        by_node: dict[str, list[str]] = {}
        for job, (holder, _) in placed.items():
            by_node.setdefault(holder or "(nobody)", []).append(job)
        text = " | ".join(f"{node}: {', '.join(jobs)}" for node, jobs in sorted(by_node.items()))
        self.say("redis", what, text, bold=True)

    async def progress(self) -> None:
        while True:
            await trio.sleep(PROGRESS_EVERY)
            try:
                if self.jobs > 1:
                    placed = await trio.to_thread.run_sync(self._placement)
                    text = " ".join(
                        f"{job}={events}@{holder or 'nobody'}" for job, (holder, events) in placed.items()
                    )
                    self.say("redis", "progress", f"events: {text}")
                    continue
                events, cursor, holder = await trio.to_thread.run_sync(self._read_state)
            except (redis.RedisError, OSError, psycopg.Error) as exc:
                self.say("redis", "progress", f"unreadable: {exc}")
                continue
            self.say("redis", "progress", f"events={events} cursor={cursor} leader={holder or 'nobody'}")

    # -- the show -------------------------------------------------------------------------------

    async def run(self) -> bool:
        with tempfile.TemporaryDirectory(prefix="ingestion-demo-") as config_dir:
            self.config_dir = config_dir
            self.lake = "file://" + os.path.join(config_dir, "lake")
            return await self._run()

    async def _run(self) -> bool:
        await trio.to_thread.run_sync(self.redis.start)
        self.say("demo", "redis-server", f"{self.redis.url} (throwaway, no persistence)")
        if server_bin() is None:
            self.say("demo", "postgres", "not installed: the PostgreSQL job is skipped "
                     "(Debian: apt-get install -y postgresql)")  # fmt: skip
        else:
            self.postgres = await trio.to_thread.run_sync(LocalPostgres().start)
            self.say("demo", "postgres", f"127.0.0.1:{self.postgres.port} (throwaway): job "
                     f"{self.pg_job_name} writes there")  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                try:
                    return await self._show_failovers(nursery)
                finally:
                    with trio.CancelScope(shield=True):
                        await self._stop_all()
                    nursery.cancel_scope.cancel()
        finally:
            self.redis.kill()
            if self.postgres is not None:
                await trio.to_thread.run_sync(self.postgres.cleanup)

    async def _show_failovers(self, nursery: trio.Nursery) -> bool:
        since = trio.current_time()
        rpc_flags = ["--rpc-retention-ledgers", str(RPC_WINDOW), "--lake-dir", self.lake[len("file://"):]]
        await self._spawn(
            nursery,
            "horizon",
            simulator_command(
                ledger_interval=0.2, ops_per_ledger=10, history_ledgers=20, rpc=self.rpc_job,
                extra=rpc_flags if self.rpc_job else (),
            ),
        )  # fmt: skip
        listening = await self.wait_for(LISTENING, since=since, node="horizon")
        self.horizon = str(listening.fields["url"])
        self.say("demo", "horizon-simulator", f"{self.horizon} (a ledger every 0.2 s)")
        if self.rpc_job:
            self.rpc = str(listening.fields["rpc_url"])
            self.say("demo", "rpc-simulator", f"{self.rpc} (Stellar RPC: {self.rpc_job_name}; it keeps "
                     f"the newest {RPC_WINDOW} ledgers, its data lake every one)")  # fmt: skip

        names = [f"node-{i}" for i in range(1, self.nodes + 1)]
        for name in names:
            await self.start_node(nursery, name)
        console = f"http://127.0.0.1:{self.ports[names[0]][0]}/"
        self.say("demo", "console", f"{console} (any node's console shows the whole cluster; "
                 "open it now, it updates live)", bold=True)  # fmt: skip
        nursery.start_soon(self.progress)
        phase = self.duration / 4

        await trio.sleep(phase)
        if self.jobs > 1 or self.rpc_job:
            await self.show_placement("spread")
        leader = await self.leader()
        if leader is None:
            raise DemoFailed("no leader after the warm-up")
        what = f"the leader of {self.job}" if self.jobs > 1 else "the leader"
        self.say(
            "demo", "SIGKILL", f"{leader} ({what}), parent and worker: a host crash, no goodbye",
            bold=True,
        )
        killed_at = trio.current_time()
        self.procs[leader].send(signal.SIGKILL)  # the parent, then its worker
        taken = await self.wait_for("became-leader", since=killed_at, job=self.job)
        failover_ms = (taken.at - killed_at) * 1000
        self.say(
            "demo",
            "failover-time",
            f"{failover_ms:.0f} ms from SIGKILL to {taken.node} leading "
            f"(bound: lease TTL {self.ttl_ms} ms + standby jitter 25 ms + Redis round trips)",
            bold=True,
        )

        await trio.sleep(phase / 2)
        if self.jobs > 1 or self.rpc_job:
            await self.show_placement("after-the-crash")
        rejoins = "it rejoins and gets its share of the jobs back" if self.jobs > 1 else (
            "it rejoins as a standby"
        )
        self.say("demo", "restart", f"{leader} under the same id: {rejoins}")
        await self.start_node(nursery, leader)

        await trio.sleep(phase / 2)
        if self.jobs > 1 or self.rpc_job:
            await self.show_placement("after-the-restart")
        process_crash_ms = await self._kill_a_worker(nursery, what)

        await trio.sleep(phase / 2)
        current = await self.leader()
        if current is None:
            raise DemoFailed("no leader before the graceful handoff")
        self.say("demo", "SIGTERM", f"{current} ({what}): a graceful handoff", bold=True)
        asked_at = trio.current_time()
        self.procs[current].send(signal.SIGTERM)
        handed = await self.wait_for("became-leader", since=asked_at, job=self.job)
        handoff_ms = (handed.at - asked_at) * 1000
        self.say(
            "demo",
            "handoff-time",
            f"{handoff_ms:.0f} ms from SIGTERM to {handed.node} leading "
            "(the lease is released, standbys hear it at once)",
            bold=True,
        )

        await trio.sleep(phase)
        if self.jobs > 1 or self.rpc_job:
            await self.show_placement("after-the-handoff")
        api_ok = await self._show_api() if self.api else True
        self.say("demo", "stopping", "SIGTERM to every node")
        await self._stop_nodes()
        ok = True
        for job, resource in self.job_specs:
            result = await verify_job(self.redis.url, job, self.horizon, resource)
            ok = ok and result.ok
            self.say("demo", "verify", (f"{job}: " if self.jobs > 1 else "") + result.summary(), bold=True)
        if self.rpc_job:
            if self.api and self.postgres is not None:
                result = await demo_api.verify_rows(self.postgres.url, self.rpc_job_name, self.rpc, self.lake)
            else:
                start = await demo_api.first_entry_ledger(self.redis.url, self.rpc_job_name)
                result = await verify_rpc_job(
                    self.redis.url, self.rpc_job_name, self.rpc, start_ledger=start, lake=self.lake
                )
            ok = ok and result.ok
            self.say("demo", "verify", f"{self.rpc_job_name}: {result.summary()}", bold=True)
        if self.postgres is not None:
            result = await self._verify_postgres()
            ok = ok and result.ok
            self.say("demo", "verify", f"{self.pg_job_name}: {result.summary()}", bold=True)
        self.say(
            "demo",
            "summary",
            f"crash failover {failover_ms:.0f} ms, process crash failover {process_crash_ms:.0f} ms, "
            f"graceful handoff {handoff_ms:.0f} ms, "
            f"lease TTL {self.ttl_ms} ms"
            + (
                f", {self.jobs + len(self._other_jobs())} jobs on {self.nodes} nodes"
                if self.jobs > 1 or self.rpc_job
                else ""
            ),
        )
        return ok and api_ok

    async def _show_api(self) -> bool:
        """The events API of a node still running against the RPC, from the first ledger the job
        holds (the RPC's oldest when the job began: past its window by now)."""
        assert self.postgres is not None
        start = await demo_api.first_row_ledger(self.postgres.url, self.rpc_job_name)
        if start is None:
            self.say("demo", "events-api", f"{self.rpc_job_name} holds no events", bold=True)
            return False
        live = [name for name, child in self.procs.items() if name in self.ports and child.alive]
        api = f"http://127.0.0.1:{self.ports[live[0]][1]}/"
        self.say("demo", "events-api", f"{api} on {live[0]} (stellar-rpc's JSON-RPC, every node "
                 f"serves it): {self.rpc_job_name}'s events from PostgreSQL")  # fmt: skip
        try:
            compared = await demo_api.compare(self.rpc, api, start)
        except (OSError, ValueError, KeyError, RuntimeError, httpx.HTTPError) as exc:
            self.say("demo", "events-api", f"failed: {exc}", bold=True)
            return False
        for line in compared.lines():
            self.say("demo", "events-api", line, bold=True)
        return compared.api_events > 0 and compared.api_held[0] <= start

    async def _verify_postgres(self) -> Verification:
        """The PostgreSQL job's rows against the simulator, judged by the fence history."""
        assert self.postgres is not None
        entries, trimmed, fence_problems, terms = await read_postgres_evidence(
            self.postgres.url, "ingestion", self.pg_job_name
        )
        through = entries[-1].paging_token if entries else None
        source = await fetch_source(self.horizon, "/payments", "0", through=through)
        result = check_stream(entries, source, None, trimmed)
        return attrs.evolve(result, problems=result.problems + tuple(fence_problems), fence_terms=terms)

    async def _kill_a_worker(self, nursery: trio.Nursery, what: str) -> float:
        """SIGKILL the current leader's worker: its parent releases the lease and exits, a
        standby leads within milliseconds; the node is restarted. The time to the new leader."""
        current = await self.leader()
        worker = self.procs[current].worker_pid if current is not None else None
        if current is None or worker is None:
            raise DemoFailed("no leader (or no worker pid) before the process crash")
        self.say(
            "demo", "SIGKILL", f"{current}'s worker, pid {worker} ({what}): a process crash "
            "(an OOM kill, a segfault); the parent stays", bold=True,
        )  # fmt: skip
        killed_at = trio.current_time()
        self.procs[current].kill_worker()
        taken = await self.wait_for("became-leader", since=killed_at, job=self.job)
        took_ms = (taken.at - killed_at) * 1000
        self.say(
            "demo",
            "process-crash-time",
            f"{took_ms:.0f} ms from SIGKILL to {taken.node} leading (the parent released the dead "
            "worker's lease: no TTL to wait out)",
            bold=True,
        )
        with trio.fail_after(STEP_TIMEOUT):
            status = await self.procs[current].process.wait()
        self.say("demo", "restart", f"{current} (its parent exited {status}, as a service manager "
                 "would see it) under the same id")  # fmt: skip
        await self.start_node(nursery, current)
        return took_ms

    async def _stop_nodes(self) -> None:
        await terminate([c.process for name, c in self.procs.items() if name != "horizon"], grace=10)

    async def _stop_all(self) -> None:
        with trio.move_on_after(10):
            await self._stop_nodes()
        kill_remaining(self.every)


def parser() -> argparse.ArgumentParser:
    from ingestion.cli.usage import OneLineParser

    p = OneLineParser(
        prog="ingestion demo",
        description="Run redis-server, the Horizon simulator and N nodes locally; kill the leader, "
        "hand over gracefully, and verify the ingested stream against the simulator.",
    )
    p.add_argument("--nodes", type=int, default=3, help="how many nodes (2 to 7, default 3)")
    p.add_argument("--ttl-ms", type=int, default=2000, help="lease TTL in ms (default 2000)")
    p.add_argument(
        "--jobs", type=int, default=3,
        help=f"how many jobs the nodes share (1 to {len(JOBS)}, default 3)",
    )
    p.add_argument(
        "--no-rpc-job", action="store_true",
        help="leave out the job that follows the simulator's Stellar RPC contract events",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=40.0, help="seconds, roughly (default 40)")
    p.add_argument("--no-color", action="store_true", help="never color the output")
    return p


def main(argv: list[str]) -> int:
    """Run the demo with these flags (no ``demo`` word); return the exit status."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help; a bad flag is a UsageError, one line from ingestion.cli
        return int(exc.code or 0)
    problems = []
    if not 2 <= args.nodes <= 7:
        problems.append(f"--nodes: must be between 2 and 7, got {args.nodes}")
    if not 1 <= args.jobs <= len(JOBS):
        problems.append(f"--jobs: must be between 1 and {len(JOBS)}, got {args.jobs}")
    if not 500 <= args.ttl_ms <= 60_000:
        problems.append(f"--ttl-ms: must be between 500 and 60000, got {args.ttl_ms}")
    if not 8 <= args.duration <= 3600:
        problems.append(f"--duration: must be between 8 and 3600 seconds, got {args.duration}")
    for problem in problems:
        print(f"ingestion demo: {problem}", file=sys.stderr)
    if problems:
        return 2
    demo = Demo(
        nodes=args.nodes,
        ttl_ms=args.ttl_ms,
        duration=args.duration,
        out=sys.stdout,
        color=sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ,
        jobs=args.jobs,
        rpc_job=not args.no_rpc_job,
    )
    status = 1
    try:
        status = 0 if trio.run(demo.run) else 1
    except* RedisServerMissing as group:
        print(f"ingestion demo: {group.exceptions[0]}", file=sys.stderr)
    except* DemoFailed as group:
        for error in group.exceptions:
            print(f"ingestion demo: failed: {error}", file=sys.stderr)
    except* trio.TooSlowError:
        print(f"ingestion demo: failed: a step took over {STEP_TIMEOUT:.0f} s", file=sys.stderr)
    return status
