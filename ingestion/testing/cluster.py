"""A failover test harness with real processes: redis-server, the Horizon simulator and N nodes.

Everything runs on 127.0.0.1. Each child's JSON log lines are read into one
:class:`~ingestion.testing.children.EventLog`, stamped with the harness's monotonic receive time.
Faults: signals
(SIGKILL, SIGSTOP/SIGCONT, SIGTERM), a :class:`~tests.tcp_proxy.TcpProxy` between a node and Redis,
and Redis restarts. :meth:`Cluster.verify` checks the events stream against the simulator's own
records with :mod:`ingestion.verify`.

Every child is killed when :func:`open_cluster` exits, however it exits.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import redis
import trio

from actors.lease_store import connect, job_keys, read_states
from ingestion.testing.children import (
    NOISE,
    Child,
    ClockFake,
    EventLog,
    faketime_available,
    spawn,
)
from ingestion.testing.cluster_config import NO_FAULTS, Endpoints, Job, NodeFaults, check_delivery, render
from ingestion.testing.launch import (
    LISTENING,
    LogLine,
    joined,
    kill_remaining,
    node_command,
    simulator_command,
    terminate,
)
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis, free_port
from ingestion.testing.partition import Links
from ingestion.testing.wait import wait_until
from ingestion.verify import Verification, verify_job, verify_rpc_job

if TYPE_CHECKING:  # (the receiver needs the receiver extra: a cluster without one runs without it)
    from ingestion.testing.receiver import Receiver

# (the children's pieces, as the tests have always imported them from here)
__all__ = ["ClockFake", "Cluster", "EventLog", "faketime_available", "open_cluster", "spawn"]

CLEANUP_TIMEOUT = 10.0  # seconds for the whole teardown
GID_BASE = 61_000  # with partitions, the n-th node started runs under group GID_BASE + n


class RedisDeployment(Protocol):
    """A Redis deployment the cluster starts and stops (:class:`~ingestion.testing.redis_ha.
    SentinelGroup`): blocking calls, run in a thread."""

    @property
    def url(self) -> str: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def ports(self) -> list[int]: ...


class Cluster:
    """The running system of one test. Made by :func:`open_cluster`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        redis_server: LocalRedis | None,
        job: str,
        ttl_ms: int,
        log: EventLog,
        redis_url: str | None = None,
        *,
        directory: Path | None = None,
        jobs: Sequence[Job] = (),
        postgres: LocalPostgres | None = None,
        receiver: Receiver | None = None,
        faults: NodeFaults = NO_FAULTS,
        sentinel: RedisDeployment | None = None,
        build: str | None = None,
        console: bool = False,
        api_job: str | None = None,
    ) -> None:
        self.nursery = nursery
        self._redis = redis_server
        self.redis_url = redis_url or (redis_server.url if redis_server else "")
        self.job = job
        self.ttl_ms = ttl_ms
        self.log = log
        self.keys = job_keys(job)
        self.horizon = ""
        self.rpc = ""  # the simulator's Stellar RPC URL, when it serves one
        self.children: dict[str, Child] = {}
        self.history: list[Child] = []  # every child ever started, for cleanup
        self.client = connect(self.redis_url, timeout=2.0)
        self.node_env: dict[str, str] = {}  # extra environment every node gets
        self.directory = directory or Path(tempfile.mkdtemp(prefix="ingestion-cluster-"))
        self.jobs = tuple(jobs)
        self.postgres = postgres
        self.receiver = receiver
        self.receiver_url = ""
        self.faults = faults
        self.sentinel = sentinel
        self.build = build  # run the nodes from this copy of the code (PYTHONPATH and cwd)
        self.console = console  # each node serves the console (and /metrics) on a port of its own
        self.api_job = api_job  # each node serves this job's events API on a port of its own
        self.ports: dict[str, tuple[int, int]] = {}  # node -> (console, events API)
        self.config_path: Path | None = None  # the nodes' config, rendered once from ``jobs``
        self.links: Links | None = None  # with faults.partition
        self.gids: dict[str, int] = {}
        self.clock_file = self.directory / "faketime"  # the faked nodes' wall-clock offset

    async def arm(self) -> None:
        """Once the simulator serves: the receiver served, partitions routed, the faked clocks at
        +0 s, and the config rendered from the jobs (every node reads that one file)."""
        if self.receiver is not None:
            from ingestion.testing.receiver import serve_receiver  # lazy: the receiver extra (see above)

            port = await self.nursery.start(serve_receiver, self.receiver)
            self.receiver_url = f"http://127.0.0.1:{port}/in"
        if self.faults.partition:
            self.links = Links()
        if self.faults.clock:
            self.clock_file.write_text("+0s\n")
        if self.jobs:
            self.config_path = self.directory / "cluster.toml"
            secret = self.receiver.secret if self.receiver is not None else None
            at = Endpoints(self.horizon, self.rpc, self.postgres.url if self.postgres else None,
                           self.receiver_url or None, secret)  # fmt: skip
            self.config_path.write_text(render(self.jobs, at, api_job=self.api_job))

    def node_gid(self, name: str) -> int | None:
        """The group node ``name`` runs under (None: no partitions)."""
        if self.links is None:
            return None
        return self.gids.setdefault(name, GID_BASE + len(self.gids) + 1)

    def redis_ports(self) -> list[int]:
        return self.sentinel.ports() if self.sentinel is not None else [self.redis.port]

    def console_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name][0]}/"

    def api_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name][1]}/"

    @property
    def redis(self) -> LocalRedis:
        """The single redis-server of a cluster that started one (not a Sentinel deployment)."""
        assert self._redis is not None, "this cluster runs on an external Redis deployment"
        return self._redis

    # -- processes ------------------------------------------------------------------------------

    async def _spawn(
        self, name: str, args: Sequence[str], env: dict[str, str] | None = None,
        group: int | None = None, cwd: str | None = None,
    ) -> Child:  # fmt: skip
        child = await spawn(self.nursery, name, args, self.log, env, group=group, cwd=cwd)
        self.children[name] = child
        self.history.append(child)
        return child

    async def start_simulator(
        self,
        *,
        ledger_interval: float = 0.1,
        ops_per_ledger: int = 10,
        history_ledgers: int = 10,
        response_delay_ms: int = 0,
        rpc: bool = False,
        cache_records: int | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        await self._spawn(
            "simulator",
            simulator_command(
                ledger_interval=ledger_interval,
                ops_per_ledger=ops_per_ledger,
                history_ledgers=history_ledgers,
                response_delay_ms=response_delay_ms,
                cache_records=cache_records or max(60_000, 4 * ops_per_ledger * history_ledgers),
                rpc=rpc,
                extra=extra,
            ),
        )
        ready = await self.log.wait_for(LISTENING, "simulator", within=30)
        self.horizon = str(ready.fields["url"])
        self.rpc = str(ready.fields.get("rpc_url") or "")
        return self.horizon

    def node_args(
        self, name: str, *, redis_url: str | None = None, horizon: str | None = None,
        extra: Sequence[str] = (),
    ) -> list[str]:  # fmt: skip
        served = []
        if name in self.ports and self.console:
            served = ["--metrics-port", str(self.ports[name][0])]
        if self.config_path is not None:  # every job a table of the one config file
            return node_command(
                name, jobs=[], redis_url=redis_url or self.redis_url, horizon=None, ttl_ms=self.ttl_ms,
                extra=["--config", str(self.config_path), *served, *extra],
            )  # fmt: skip
        # --horizon only for a Horizon job: the node refuses a flag no hosted job uses.
        source = extra[list(extra).index("--source") + 1] if "--source" in extra else "horizon"
        return node_command(
            name,
            jobs=[self.job],
            redis_url=redis_url or self.redis_url,
            horizon=(horizon or self.horizon) if source == "horizon" else None,
            ttl_ms=self.ttl_ms,
            extra=[*served, *extra],
        )

    async def start_node(
        self,
        name: str,
        *,
        redis_url: str | None = None,
        horizon: str | None = None,
        clock: ClockFake | None = None,
        env: dict[str, str] | None = None,
        extra: Sequence[str] = (),
        wait: bool = True,
    ) -> Child:
        """Start node ``name`` (again: under the same ports, group and faults); with ``wait``,
        return once it has joined (led or stood by)."""
        since = trio.current_time()
        if (self.console or self.api_job) and name not in self.ports:
            self.ports[name] = (free_port(), free_port())
        armed = dict(self.node_env)
        if self.api_job is not None:
            armed["INGESTION_API_PORT"] = str(self.ports[name][1])
        if self.build is not None:
            armed["PYTHONPATH"] = self.build
        if name in self.faults.clock:
            armed.update(ClockFake(timestamp_file=str(self.clock_file)).env())
        gid = self.node_gid(name)
        if gid is not None and self.links is not None and gid not in self.links.proxies:
            await self.links.route(self.nursery, gid, self.redis_ports())
        child = await self._spawn(
            name,
            self.node_args(name, redis_url=redis_url, horizon=horizon, extra=extra),
            {**armed, **(clock.env() if clock else {}), **(env or {})},
            # (python -m imports from its working directory first: the build's, when there is one)
            group=gid,
            cwd=self.build,
        )
        if wait:
            await self.joined(name, since=since)
        return child

    async def joined(self, name: str, *, since: float, within: float = 20.0) -> LogLine:
        """The node's first ``became-leader`` or ``standby`` line after ``since``."""
        pid = self.children[name].process.pid
        with trio.fail_after(within):
            while True:
                for e in self.log.lines:
                    if joined(e, name, since):
                        return e
                    if e.node == name and e.event == "process-exited" and e.fields["pid"] == pid:
                        raise AssertionError(f"{name} exited before joining:\n{self.log.tail()}")
                await self.log.changed()

    def signal(self, name: str, sig: signal.Signals) -> float:
        """Send ``sig`` to ``name``; returns the harness time it was sent at."""
        at = trio.current_time()
        self.children[name].send(sig)
        return at

    async def kill(self, name: str) -> float:
        """SIGKILL ``name`` (a node: parent and worker, a host crash) and wait until it is gone;
        returns when the signal was sent."""
        child = self.children[name]
        at = self.signal(name, signal.SIGKILL)
        with trio.fail_after(5):
            await child.process.wait()
        return at

    def kill_worker(self, name: str) -> float:
        """SIGKILL ``name``'s worker process only (its parent stays to release its leases);
        returns the harness time it was sent at."""
        at = trio.current_time()
        self.children[name].kill_worker()
        return at

    async def terminate(self, name: str, within: float = 10.0) -> int:
        """SIGTERM ``name``; its exit status once it is gone."""
        self.children[name].send(signal.SIGTERM)
        return await self.exited(name, within)

    async def exited(self, name: str, within: float = 10.0) -> int:
        """``name``'s exit status once it is gone (no signal sent)."""
        with trio.fail_after(within):
            return await self.children[name].process.wait()

    # -- Redis ----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Lease holder, token counter, cursor hash and stream length, read now."""
        (s,) = read_states(self.client, [self.job])
        return {
            "lease": f"{s.lease_token}|{s.leader}" if s.leader is not None else None,
            "token": s.token or None,
            "cursor": s.cursor,
            "cursor_token": s.cursor_token,
            "events": s.events,
        }

    def events_added(self) -> int:
        """Entries ever appended to the events stream (its length, plus any that retention
        trimmed)."""
        try:
            info: Any = self.client.xinfo_stream(self.keys["events"])
        except redis.ResponseError:
            return 0  # no stream yet
        return int(info["entries-added"])

    async def wait_for_events(self, count: int, within: float = 20.0) -> int:
        """Wait until at least ``count`` entries were appended to the events stream (polled: no
        log line marks a commit)."""

        def reached() -> list[int]:
            try:
                n = self.events_added()
            except redis.RedisError:
                return []  # a Redis failover in progress: the harness asks again
            return [n] if n >= count else []

        (n,) = await wait_until(reached, within, what=f"{count} entries added to the events", every=0.05)
        return n

    async def events_now(self, within: float = 20.0) -> int:
        """The events stream's length, asked until Redis answers (through a failover)."""
        return await self.wait_for_events(0, within)

    async def wait_for_progress(self, more: int = 50, within: float = 20.0) -> int:
        """Wait until ``more`` entries were added to the events stream after now."""
        return await self.wait_for_events(await self.events_now() + more, within)

    async def restart_redis(self, *, down_for: float = 0.0) -> None:
        """Kill redis-server (SIGKILL: no shutdown save) and start it again on the same port."""
        self.client.close()
        await trio.to_thread.run_sync(self.redis.kill)
        if down_for:
            await trio.sleep(down_for)
        await trio.to_thread.run_sync(self.redis.start)
        self.client = connect(self.redis.url, timeout=2.0)

    async def verify(self) -> Verification:
        return await verify_job(self.redis_url, self.job, self.horizon)

    async def verify_rpc(
        self,
        filters: Sequence[dict[str, Any]] = (),
        job: str | None = None,
        *,
        start_ledger: int | None = None,
        lake: str | None = None,
    ) -> Verification:
        """The job's stream against the simulator's own getEvents paging from the oldest ledger
        (with ``lake``: its lake's events from ``start_ledger`` up to RPC's oldest ledger first)."""
        return await verify_rpc_job(self.redis_url, job or self.job, self.rpc, filters, start_ledger, lake)

    def verify_delivery(self, hook: str, source: str) -> Verification:
        """What the receiver holds against job ``source``'s stream, which webhook job ``hook``
        delivers: each record once, in the stream's order, up to the hook's position exactly
        (blocking: run it in a thread while the nodes run)."""
        assert self.receiver is not None, "this cluster runs no receiver"
        entries: Any = self.client.xrange(job_keys(source)["events"])
        stream = [str(f["paging_token"]) for _id, f in entries]
        position: Any = self.client.hget(job_keys(hook)["cursor"], "cursor")
        delivered = [str(record.get("paging_token")) for record in self.receiver.records()]
        return check_delivery(stream, position, delivered)

    def delivered_all(self, hook: str, source: str) -> bool:
        """``hook``'s position is at ``source``'s last record now (blocking)."""
        last: Any = self.client.xrevrange(job_keys(source)["events"], count=1)
        position = self.client.hget(job_keys(hook)["cursor"], "cursor")
        return bool(last) and position == last[0][1]["paging_token"]

    def leaders(self) -> list[LogLine]:
        return self.log.of("became-leader")

    # -- teardown -------------------------------------------------------------------------------

    async def stop_nodes(self, grace: float = 5.0) -> None:
        """SIGTERM every node still running (SIGCONT first if paused); wait up to ``grace``."""
        nodes = [c for c in self.history if c.alive and c.name != "simulator"]
        for c in nodes:
            if c.paused:
                c.send(signal.SIGCONT)
        await terminate([c.process for c in nodes], grace=grace)

    async def stop_all(self) -> None:
        """:meth:`stop_nodes`, then SIGKILL stragglers."""
        await self.stop_nodes()
        kill_remaining(c.process for c in self.history)


@asynccontextmanager
async def open_cluster(
    job: str | None = None,
    *,
    jobs: Sequence[Job] = (),
    ttl_ms: int = 1500,
    persistence: bool = False,
    ledger_interval: float = 0.1,
    ops_per_ledger: int = 10,
    echo: bool = False,
    log: EventLog | None = None,
    redis_url: str | None = None,
    redis_env: dict[str, str] | None = None,
    sentinel: RedisDeployment | None = None,
    postgres: bool = False,
    receiver: Receiver | None = None,
    faults: NodeFaults = NO_FAULTS,
    build: str | None = None,
    console: bool = False,
    api_job: str | None = None,
    history_ledgers: int = 10,
    response_delay_ms: int = 0,
    rpc: bool = False,
    cache_records: int | None = None,
    simulator_extra: Sequence[str] = (),
) -> AsyncIterator[Cluster]:
    """Start Redis, the simulator and what the parameters ask for; yield a :class:`Cluster` to
    start nodes in.

    ``job``: the job of the nodes' flags (``--job``), which :meth:`Cluster.verify` and the other
    one-job helpers read; with ``jobs`` instead, the nodes read every job from one config file
    rendered from them (``job`` then names the first by default). Redis: a redis-server of its own,
    or ``sentinel`` (a Sentinel deployment the cluster starts and stops), or an external
    ``redis_url``. ``postgres``: a throwaway PostgreSQL (a job's ``sink = POSTGRES``);
    ``receiver``: the example webhook receiver, served here (a webhook job's default endpoint);
    ``faults``: armed on the nodes as they start; ``build``: the nodes run that copy of the code;
    ``console``/``api_job``: each node serves the console, the events API, on ports of its own.
    ``log``: the log to read the children into (its ``echo`` shows lines as they come).
    On exit, however it happens, every child is stopped (SIGKILL if it does not stop by itself)
    and every server it started is stopped.
    """
    first = job or (jobs[0].name if jobs else None)
    assert first is not None, "open_cluster needs a job or jobs"
    log = log if log is not None else EventLog()
    if echo:
        log.echo = lambda e: print(f"{e.at:9.3f} {e.node:>9} {e.event} {_fields(e)}", flush=True)
    directory = Path(tempfile.mkdtemp(prefix="ingestion-cluster-"))
    server = None if redis_url or sentinel else LocalRedis(persistence=persistence, env=redis_env)
    pg: LocalPostgres | None = None
    try:
        if server is not None:
            await trio.to_thread.run_sync(server.start)
        if sentinel is not None:
            await trio.to_thread.run_sync(sentinel.start)
            redis_url = sentinel.url
        if postgres:
            pg = await trio.to_thread.run_sync(LocalPostgres().start)
        async with trio.open_nursery() as nursery:
            cluster = Cluster(
                nursery, server, first, ttl_ms, log, redis_url, directory=directory, jobs=jobs,
                postgres=pg, receiver=receiver, faults=faults, sentinel=sentinel, build=build,
                console=console, api_job=api_job,
            )  # fmt: skip
            try:
                await cluster.start_simulator(
                    ledger_interval=ledger_interval, ops_per_ledger=ops_per_ledger,
                    history_ledgers=history_ledgers, response_delay_ms=response_delay_ms,
                    rpc=rpc, cache_records=cache_records, extra=simulator_extra,
                )  # fmt: skip
                await cluster.arm()
                yield cluster
            except BaseException:
                # pytest shows a failed test's captured output: the cluster's last words
                print(f"cluster log at the failure (harness time {trio.current_time():.3f}):\n{log.tail(80)}")
                raise
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT):
                    await cluster.stop_all()
                kill_remaining(c.process for c in cluster.history)
                cluster.client.close()
                if cluster.links is not None:
                    cluster.links.close()
                nursery.cancel_scope.cancel()
    finally:
        if server is not None:
            server.kill()
        if sentinel is not None:
            sentinel.stop()
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


def _fields(e: LogLine) -> str:
    return " ".join(f"{k}={v}" for k, v in e.fields.items() if k not in NOISE)


def figure(name: str, **values: Any) -> None:
    """Print a measured figure (run pytest with ``-s`` to see them)."""
    text = " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"\nFAILOVER-FIGURE {name}: {text}", flush=True)


def redis_client(url: str) -> redis.Redis:
    return connect(url, timeout=2.0)


# What the real-process failover scenarios share.
TTL_MS = 1500  # their lease TTL
# Beyond the lease arithmetic: Redis round trips, process scheduling and the log pipe to the
# harness. About 0.3 s on an idle machine; 1 s leaves room for a 2-core machine starved by other
# suites, and stays below what a takeover that waited out one more lease would add (a TTL less
# at most one renew interval, 1.2 s), so such a takeover still fails the scenarios' bounds.
ALLOWANCE = 1.0


async def assert_verified(cluster: Cluster, at_least: int) -> None:
    result = await cluster.verify()
    print(f"\nverification: {result.summary()}")
    assert result.ok, result.summary()
    assert result.count >= at_least, result.summary()
