"""``python -m ingestion demo``: watch a failover happen, on one machine, in about 40 seconds.

A script over the testing kit's cluster (:func:`ingestion.testing.cluster.open_cluster`): a
throwaway redis-server, the bundled simulator and N nodes on 127.0.0.1, their election events
printed interleaved (:mod:`ingestion.cli.demo_show`), with a progress line every couple of seconds.
The nodes share ``--jobs`` Horizon jobs (default 3), one job following the simulator's Stellar RPC
contract events (``--no-rpc-job``: not) and a webhook job pushing the first job's records to the
kit's example receiver, which verifies each signature with ``standardwebhooks``
(``--no-webhook-job``: not). It SIGKILLs the first job's leader (a host crash: the lease expires),
restarts it, SIGKILLs the next leader's worker only (a process crash: its parent releases the
lease at once), restarts it, hands leadership over with SIGTERM, and reports each time; then
checks every job against the simulator's own records and the receiver's records against the
delivered stream, each once and in order across the failovers (:mod:`ingestion.cli.demo_verify`).
With Debian's ``postgresql`` installed, one more job writes to a throwaway PostgreSQL, judged by its
fence history, and the contract-events job too, served by the nodes' events API
(:mod:`ingestion.cli.demo_api`: the simulated RPC keeps only its newest ``RPC_WINDOW`` ledgers;
the API answers from the job's first ledger where the RPC refuses). The console's address is
printed once the nodes are up. Exit status: 0 when everything verified, 1 when not or the demo
could not run, 2 for a bad flag. Every child is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import tempfile
from typing import TextIO

import attrs
import psycopg
import redis
import trio

from ingestion.cli import demo_api, demo_verify
from ingestion.cli.demo_show import Screen
from ingestion.testing.cluster import Cluster, EventLog, open_cluster
from ingestion.testing.cluster_config import POSTGRES, SECRET, Job
from ingestion.testing.launch import LogLine
from ingestion.testing.local_postgres import server_bin
from ingestion.testing.local_redis import RedisServerMissing
from ingestion.verify import Verification

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
    webhook: bool = True  # also a webhook job delivering the first job to the example receiver
    job: str = "demo"
    postgres: bool = False  # a job on PostgreSQL too, when it is installed
    lake: str = ""  # the simulator's data lake (file://...): every ledger, for verifying past the RPC
    log: EventLog = attrs.Factory(EventLog)
    c: Cluster | None = None
    hook_result: Verification | None = None  # the webhook job's, once verified
    screen: Screen = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        names = lambda: self.c.children if self.c else ()  # noqa: E731
        self.screen = Screen(self.out, self.color, names, self.many)
        self.log.echo = self.screen.show

    @property
    def cluster(self) -> Cluster:
        assert self.c is not None
        return self.c

    def say(self, who: str, what: str, detail: str = "", *, bold: bool = False) -> None:
        self.screen.say(who, what, detail, bold=bold)

    # -- the jobs -------------------------------------------------------------------------------

    @property
    def many(self) -> bool:
        return self.jobs > 1 or self.rpc_job or self.webhook

    @property
    def horizon_jobs(self) -> list[tuple[str, str]]:
        """(job name, resource) of every Horizon job into Redis."""
        return [(self.job + suffix, resource) for suffix, resource in JOBS[: self.jobs]]

    @property
    def rpc_job_name(self) -> str:
        return f"{self.job}-contract-events"

    @property
    def pg_job_name(self) -> str:
        return f"{self.job}-postgres"

    @property
    def hook_job_name(self) -> str:
        return f"{self.job}-webhook"

    @property
    def api(self) -> bool:
        """The nodes serve the events API over the RPC job (its sink then is PostgreSQL)."""
        return self.rpc_job and self.postgres

    def specs(self) -> list[Job]:
        specs = [Job.horizon(name, resource) for name, resource in self.horizon_jobs]
        if self.rpc_job:
            specs.append(Job.rpc(self.rpc_job_name, **({"sink": POSTGRES} if self.api else {})))
        if self.postgres:
            specs.append(Job.horizon(self.pg_job_name, "/payments", sink=POSTGRES))
        if self.webhook:
            specs.append(Job.webhook(self.hook_job_name, self.job))
        return specs

    async def start_node(self, name: str) -> None:
        since = trio.current_time()
        await self.cluster.start_node(name, wait=False)
        await self.cluster.joined(name, since=since, within=STEP_TIMEOUT)

    async def wait_for(self, event: str, *, since: float, job: str) -> LogLine:
        with trio.fail_after(STEP_TIMEOUT):
            while not (found := self.log.of(event, since=since, job=job)):
                await self.log.changed()
            return found[0]

    def _placement(self) -> dict[str, tuple[str | None, int]]:
        return demo_verify.placement(self.cluster, self.hook_job_name if self.webhook else None)

    async def leader(self) -> str | None:
        """The first job's lease holder in Redis right now."""
        return (await trio.to_thread.run_sync(self._placement))[self.job][0]

    async def show_placement(self, what: str) -> None:
        if not self.many:
            return
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
                placed = await trio.to_thread.run_sync(self._placement)
            except (redis.RedisError, OSError, psycopg.Error) as exc:
                self.say("redis", "progress", f"unreadable: {exc}")
                continue
            text = " ".join(f"{job}={n}@{holder or 'nobody'}" for job, (holder, n) in placed.items())
            self.say("redis", "progress", f"records: {text}")

    # -- the show -------------------------------------------------------------------------------

    async def run(self) -> bool:
        self.postgres = server_bin() is not None
        if self.webhook and importlib.util.find_spec("standardwebhooks") is None:
            self.webhook = False
            self.say("demo", "webhook", "standardwebhooks is not installed (the receiver extra): "
                     "the webhook job is skipped")  # fmt: skip
        receiver = None
        if self.webhook:
            from ingestion.testing.receiver import Receiver  # lazy: the receiver extra (checked above)

            receiver = Receiver(SECRET)
        with tempfile.TemporaryDirectory(prefix="ingestion-demo-") as lake_dir:
            self.lake = "file://" + lake_dir
            rpc_flags = ["--rpc-retention-ledgers", str(RPC_WINDOW), "--lake-dir", lake_dir]
            async with open_cluster(
                jobs=self.specs(), ttl_ms=self.ttl_ms, log=self.log, postgres=self.postgres,
                receiver=receiver, console=True, api_job=self.rpc_job_name if self.api else None,
                ledger_interval=0.2, ops_per_ledger=10, history_ledgers=20, rpc=self.rpc_job,
                simulator_extra=rpc_flags if self.rpc_job else (),
            ) as self.c, trio.open_nursery() as nursery:  # fmt: skip
                try:
                    return await self._show_failovers(nursery)
                finally:
                    nursery.cancel_scope.cancel()

    def _introduce(self) -> None:
        c = self.cluster
        self.say("demo", "redis-server", f"{c.redis_url} (throwaway, no persistence)")
        if c.postgres is None:
            self.say("demo", "postgres", "not installed: the PostgreSQL job is skipped "
                     "(Debian: apt-get install -y postgresql)")  # fmt: skip
        else:
            self.say("demo", "postgres", f"127.0.0.1:{c.postgres.port} (throwaway): job "
                     f"{self.pg_job_name} writes there")  # fmt: skip
        self.say("demo", "horizon-simulator", f"{c.horizon} (a ledger every 0.2 s)")
        if self.rpc_job:
            self.say("demo", "rpc-simulator", f"{c.rpc} (Stellar RPC: {self.rpc_job_name}; it keeps "
                     f"the newest {RPC_WINDOW} ledgers, its data lake every one)")  # fmt: skip
        if self.webhook:
            self.say("demo", "webhook-receiver", f"{c.receiver_url} (the example receiver: "
                     f"{self.hook_job_name} POSTs {self.job}'s records there, signed)")  # fmt: skip

    async def _show_failovers(self, nursery: trio.Nursery) -> bool:
        self._introduce()
        names = [f"node-{i}" for i in range(1, self.nodes + 1)]
        for name in names:
            await self.start_node(name)
        self.say("demo", "console", f"{self.cluster.console_url(names[0])} (any node's console shows "
                 "the whole cluster; open it now, it updates live)", bold=True)  # fmt: skip
        nursery.start_soon(self.progress)
        phase = self.duration / 4

        await trio.sleep(phase)
        await self.show_placement("spread")
        leader = await self.leader()
        if leader is None:
            raise DemoFailed("no leader after the warm-up")
        what = f"the leader of {self.job}" if self.many else "the leader"
        self.say("demo", "SIGKILL", f"{leader} ({what}), parent and worker: a host crash, no goodbye",
                 bold=True)  # fmt: skip
        killed_at = self.cluster.signal(leader, signal.SIGKILL)  # the parent, then its worker
        taken = await self.wait_for("became-leader", since=killed_at, job=self.job)
        failover_ms = (taken.at - killed_at) * 1000
        self.say("demo", "failover-time", f"{failover_ms:.0f} ms from SIGKILL to {taken.node} leading "
                 f"(bound: lease TTL {self.ttl_ms} ms + standby jitter 25 ms + Redis round trips)",
                 bold=True)  # fmt: skip

        await trio.sleep(phase / 2)
        await self.show_placement("after-the-crash")
        rejoins = "it rejoins and gets its share of the jobs back" if self.many else "it rejoins as a standby"
        self.say("demo", "restart", f"{leader} under the same id: {rejoins}")
        await self.cluster.exited(leader, STEP_TIMEOUT)
        await self.start_node(leader)

        await trio.sleep(phase / 2)
        await self.show_placement("after-the-restart")
        process_crash_ms = await self._kill_a_worker(what)

        await trio.sleep(phase / 2)
        current = await self.leader()
        if current is None:
            raise DemoFailed("no leader before the graceful handoff")
        self.say("demo", "SIGTERM", f"{current} ({what}): a graceful handoff", bold=True)
        asked_at = self.cluster.signal(current, signal.SIGTERM)
        handed = await self.wait_for("became-leader", since=asked_at, job=self.job)
        handoff_ms = (handed.at - asked_at) * 1000
        self.say("demo", "handoff-time", f"{handoff_ms:.0f} ms from SIGTERM to {handed.node} leading "
                 "(the lease is released, standbys hear it at once)", bold=True)  # fmt: skip

        await trio.sleep(phase)
        await self.show_placement("after-the-handoff")
        api_ok = await self._show_api() if self.api else True
        if self.webhook:
            await demo_verify.caught_up(self.cluster, self.hook_job_name, self.job, STEP_TIMEOUT)
        self.say("demo", "stopping", "SIGTERM to every node")
        await self.cluster.stop_nodes(grace=10)
        ok = await self._verify()
        self.say(
            "demo",
            "summary",
            f"crash failover {failover_ms:.0f} ms, process crash failover {process_crash_ms:.0f} ms, "
            f"graceful handoff {handoff_ms:.0f} ms, lease TTL {self.ttl_ms} ms"
            + (f", {len(self.cluster.jobs)} jobs on {self.nodes} nodes" if self.many else "")
            + (f"; {self._hook_summary()}" if self.hook_result is not None else ""),
        )
        return ok and api_ok

    def _hook_summary(self) -> str:
        assert self.hook_result is not None and self.cluster.receiver is not None
        terms = len({e.fields.get("token") for e in self.log.of("became-leader", job=self.hook_job_name)})
        state = "each once, in order" if self.hook_result.ok else "FAILED"
        again = self.cluster.receiver.duplicates
        posts = "1 POST" if again == 1 else f"{again} POSTs"
        return (f"webhook {self.hook_result.count} records over {terms} deliverer terms: {state} "
                f"({posts} repeated after a failover, none stored twice)")  # fmt: skip

    async def _verify(self) -> bool:
        c = self.cluster
        results = await demo_verify.horizon_jobs(c, self.horizon_jobs)
        if self.rpc_job:
            results.append((self.rpc_job_name, await demo_verify.rpc_job(c, self.rpc_job_name, self.lake)))
        if c.postgres is not None:
            results.append((self.pg_job_name, await demo_verify.postgres_job(c, self.pg_job_name)))
        for job, result in results:
            self.say("demo", "verify", f"{job}: {result.summary()}", bold=True)
        ok = all(result.ok for _, result in results)
        if self.webhook:
            self.hook_result = await demo_verify.webhook_job(c, self.hook_job_name, self.job)
            self.say("demo", "verify", demo_verify.webhook_summary(self.hook_job_name, self.hook_result),
                     bold=True)  # fmt: skip
            ok = ok and self.hook_result.ok
        return ok

    async def _show_api(self) -> bool:
        c = self.cluster
        assert c.postgres is not None
        live = [name for name, child in c.children.items() if name in c.ports and child.alive]
        say = lambda line: self.say("demo", "events-api", line, bold=True)  # noqa: E731
        return await demo_api.show(c.postgres.url, self.rpc_job_name, c.rpc, c.api_url(live[0]), live[0], say)

    async def _kill_a_worker(self, what: str) -> float:
        """SIGKILL the current leader's worker: its parent releases the lease and exits, a
        standby leads within milliseconds; the node is restarted. The time to the new leader."""
        current = await self.leader()
        worker = self.cluster.children[current].worker_pid if current is not None else None
        if current is None or worker is None:
            raise DemoFailed("no leader (or no worker pid) before the process crash")
        self.say("demo", "SIGKILL", f"{current}'s worker, pid {worker} ({what}): a process crash "
                 "(an OOM kill, a segfault); the parent stays", bold=True)  # fmt: skip
        killed_at = self.cluster.kill_worker(current)
        taken = await self.wait_for("became-leader", since=killed_at, job=self.job)
        took_ms = (taken.at - killed_at) * 1000
        self.say("demo", "process-crash-time", f"{took_ms:.0f} ms from SIGKILL to {taken.node} leading "
                 "(the parent released the dead worker's lease: no TTL to wait out)", bold=True)  # fmt: skip
        status = await self.cluster.exited(current, STEP_TIMEOUT)
        self.say("demo", "restart", f"{current} (its parent exited {status}, as a service manager "
                 "would see it) under the same id")  # fmt: skip
        await self.start_node(current)
        return took_ms


def parser() -> argparse.ArgumentParser:
    from ingestion.cli.usage import OneLineParser  # lazy: CLI start-up

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
    p.add_argument(
        "--no-webhook-job", action="store_true",
        help="leave out the job that delivers the first job's records to the example webhook receiver",
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
        webhook=not args.no_webhook_job,
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
