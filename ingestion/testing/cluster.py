"""A failover test harness with real processes: redis-server, the Horizon simulator and N nodes.

Everything runs on 127.0.0.1. Each child's stdout is read continuously by a trio task; every JSON log
line becomes a :class:`LogLine` stamped with the harness's monotonic receive time, so timings are
measured on one clock, whatever the nodes' own (possibly faked) wall clocks say. Faults: signals
(SIGKILL, SIGSTOP/SIGCONT, SIGTERM), a :class:`~tests.tcp_proxy.TcpProxy` between a node and Redis,
and Redis restarts. :meth:`Cluster.verify` checks the events stream against the simulator's own
records with :mod:`ingestion.verify`.

Every child is killed when :func:`open_cluster` exits, however it exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import connect, job_keys
from ingestion.testing.launch import (
    LISTENING,
    LogLine,
    child_env,
    joined,
    kill_remaining,
    log_line,
    node_command,
    simulator_command,
    terminate,
)
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import output_lines, wait_until
from ingestion.verify import Verification, verify_job, verify_rpc_job

CLEANUP_TIMEOUT = 10.0  # seconds for the whole teardown
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


class EventLog:
    """Every process's log lines, in the order the harness read them."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []
        self.raw: list[tuple[str, str]] = []  # (process, line) for lines that are not JSON
        self._changed = trio.Event()
        self.echo: Callable[[LogLine], None] | None = None

    def add(self, line: LogLine) -> None:
        self.lines.append(line)
        if self.echo is not None:
            self.echo(line)
        self._changed.set()
        self._changed = trio.Event()

    def of(
        self, event: str, node: str | None = None, *, since: float | None = None, **fields: Any
    ) -> list[LogLine]:
        return [
            e
            for e in self.lines
            if e.event == event
            and (node is None or e.node == node)
            and (since is None or e.at >= since)
            and all(e.fields.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(
        self,
        event: str,
        node: str | None = None,
        *,
        since: float | None = None,
        count: int = 1,
        within: float = 10.0,
        **fields: Any,
    ) -> LogLine:
        """The ``count``-th matching line, waiting for it (at most ``timeout`` seconds)."""
        try:
            with trio.fail_after(within):
                while True:
                    found = self.of(event, node, since=since, **fields)
                    if len(found) >= count:
                        return found[count - 1]
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(
                f"no {event!r} from {node or 'any node'} {fields or ''} within {within}s; "
                f"log tail:\n{self.tail()}"
            ) from None

    async def changed(self) -> None:
        await self._changed.wait()

    def tail(self, n: int = 40) -> str:
        lines = [
            f"  {e.at:10.3f} {e.node:>8} {e.event} "
            + " ".join(f"{k}={v}" for k, v in e.fields.items() if k not in _NOISE)
            for e in self.lines[-n:]
        ]
        raw = [f"  [raw {p}] {text}" for p, text in self.raw[-10:]]
        return "\n".join(lines + raw)


_NOISE = frozenset({"timestamp", "level", "node", "job", "event"})


@attrs.define
class Child:
    """One child process and what the harness knows about it.

    A node is two processes (ingestion/node/parent.py): the parent, which the harness started, and
    the worker it forked, which holds the leases (``worker_pid``, from its ``node-starting``
    line). :meth:`send` aims each signal where it keeps its meaning.
    """

    name: str
    process: trio.Process
    started_at: float
    paused: bool = False
    worker_pid: int | None = None  # a node's worker, once it logged node-starting

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def send(self, sig: signal.Signals) -> None:
        """SIGSTOP/SIGCONT pause and resume a node's worker (the parent stays: a paused worker
        is not dead); SIGKILL kills the parent, then the worker (a host crash: nobody is left to
        release the lease, the TTL path); any other signal goes to the parent, which forwards
        SIGTERM and SIGINT to the worker."""
        if not self.alive:
            return
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            # (a child that is not a node has no worker: the process itself)
            _signal_pid(self.worker_pid or self.process.pid, sig)
            self.paused = sig is signal.SIGSTOP
            return
        self.process.send_signal(sig)
        if sig is signal.SIGKILL and self.worker_pid is not None:
            _signal_pid(self.worker_pid, sig)  # the kernel would too (PR_SET_PDEATHSIG)

    def kill_worker(self) -> None:
        """SIGKILL the node's worker only (a process crash): its parent releases its leases."""
        assert self.worker_pid is not None, f"{self.name}: no node-starting line yet"
        _signal_pid(self.worker_pid, signal.SIGKILL)


def _signal_pid(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # already gone


async def spawn(
    nursery: trio.Nursery,
    name: str,
    args: Sequence[str],
    log: EventLog,
    env: dict[str, str] | None = None,
    *,
    group: int | None = None,
    cwd: str | None = None,
) -> Child:
    """Start ``args`` as the child ``name`` (:func:`~ingestion.testing.launch.child_env` plus
    ``env``), its output read into ``log`` by a task in ``nursery`` until it exits. ``group``: the
    child's group id (root only), by which a packet filter can tell its connections apart; ``cwd``
    its working directory (``python -m`` imports from there first)."""
    process = await trio.lowlevel.open_process(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=child_env(env),
        group=group,
        cwd=cwd,
    )
    child = Child(name, process, trio.current_time())
    nursery.start_soon(_read_lines, child, log)
    return child


async def _read_lines(child: Child, log: EventLog) -> None:
    stream = child.process.stdout
    assert stream is not None
    async for raw in output_lines(stream):
        line = _record(child.name, raw, trio.current_time(), log)  # no checkpoint since it arrived
        if line is not None and line.event == "node-starting" and "pid" in line.fields:
            child.worker_pid = int(line.fields["pid"])
    await child.process.wait()
    log.add(LogLine(trio.current_time(), child.name, "process-exited",
                    {"returncode": child.process.returncode, "pid": child.process.pid}))  # fmt: skip


def _record(name: str, raw: bytes, at: float, log: EventLog) -> LogLine | None:
    line = log_line(name, raw, at)
    if line is not None:
        log.add(line)
    elif text := raw.decode(errors="replace").strip():
        log.raw.append((name, text))
    return line


@attrs.frozen
class ClockFake:
    """Run a node under libfaketime. ``spec`` is FAKETIME (e.g. ``"+3d"``, ``"@2030-01-01 00:00:00
    x2"``); with ``timestamp_file`` the spec is re-read from that file every second, so a test can
    make the wall clock jump while the node runs. ``fake_monotonic=False`` (the realistic case) sets
    DONT_FAKE_MONOTONIC=1: the wall clock lies, the monotonic clock does not.
    """

    spec: str = ""
    timestamp_file: str | None = None
    fake_monotonic: bool = False

    def env(self) -> dict[str, str]:
        env = {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_DONT_RESET": "1"}
        if self.timestamp_file:
            env["FAKETIME_TIMESTAMP_FILE"] = self.timestamp_file
            # Re-read at most every second: FAKETIME_NO_CACHE=1 reads the file on every clock call,
            # which slows the process so much that a lease round trip outlives the ingest deadline.
            env["FAKETIME_CACHE_DURATION"] = "1"
        else:
            env["FAKETIME"] = self.spec
        if not self.fake_monotonic:
            env["DONT_FAKE_MONOTONIC"] = "1"
        return env


def faketime_available() -> bool:
    return os.path.exists(FAKETIME_LIB)


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
        self.node_env: dict[str, str] = {}  # extra environment a test gives its nodes

    @property
    def redis(self) -> LocalRedis:
        """The single redis-server of a cluster that started one (not a Sentinel deployment)."""
        assert self._redis is not None, "this cluster runs on an external Redis deployment"
        return self._redis

    # -- processes ------------------------------------------------------------------------------

    async def _spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> Child:
        child = await spawn(self.nursery, name, args, self.log, env)
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
        extra: Sequence[str] = (),
    ) -> str:
        await self._spawn(
            "simulator",
            simulator_command(
                ledger_interval=ledger_interval,
                ops_per_ledger=ops_per_ledger,
                history_ledgers=history_ledgers,
                response_delay_ms=response_delay_ms,
                cache_records=max(60_000, 4 * ops_per_ledger * history_ledgers),
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
        # --horizon only for a Horizon job: the node refuses a flag no hosted job uses.
        source = extra[list(extra).index("--source") + 1] if "--source" in extra else "horizon"
        return node_command(
            name,
            jobs=[self.job],
            redis_url=redis_url or self.redis_url,
            horizon=(horizon or self.horizon) if source == "horizon" else None,
            ttl_ms=self.ttl_ms,
            extra=extra,
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
        """Start node ``name``; with ``wait``, return once it has joined (led or stood by)."""
        since = trio.current_time()
        child = await self._spawn(
            name,
            self.node_args(name, redis_url=redis_url, horizon=horizon, extra=extra),
            {**(clock.env() if clock else {}), **(env or {})},
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
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys["lease"])
        pipe.get(self.keys["token"])
        pipe.hgetall(self.keys["cursor"])
        pipe.xlen(self.keys["events"])
        lease, token, cursor, events = pipe.execute()
        return {
            "lease": lease,
            "token": int(token) if token is not None else None,
            "cursor": cursor.get("cursor"),
            "cursor_token": int(cursor["token"]) if "token" in cursor else None,
            "events": int(events),
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

    def leaders(self) -> list[LogLine]:
        return self.log.of("became-leader")

    # -- teardown -------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        """SIGTERM every node still running (SIGCONT first if paused), then SIGKILL stragglers."""
        nodes = [c for c in self.history if c.alive and c.name != "simulator"]
        for c in nodes:
            if c.paused:
                c.send(signal.SIGCONT)
        await terminate([c.process for c in nodes], grace=5)
        kill_remaining(c.process for c in self.history)


@asynccontextmanager
async def open_cluster(
    job: str,
    *,
    ttl_ms: int = 1500,
    persistence: bool = False,
    ledger_interval: float = 0.1,
    ops_per_ledger: int = 10,
    echo: bool = False,
    redis_url: str | None = None,
    redis_env: dict[str, str] | None = None,
    history_ledgers: int = 10,
    response_delay_ms: int = 0,
    rpc: bool = False,
    simulator_extra: Sequence[str] = (),
) -> AsyncIterator[Cluster]:
    """Start redis-server and the simulator; yield a :class:`Cluster` to start nodes in.

    With ``redis_url`` (e.g. a Sentinel deployment's URL) no redis-server is started: the nodes
    and the harness use that URL. On exit, however it happens, every child is stopped (SIGKILL if
    it does not stop by itself) and the redis-server it started is killed.
    """
    log = EventLog()
    if echo:
        log.echo = lambda e: print(f"{e.at:9.3f} {e.node:>9} {e.event} {_fields(e)}", flush=True)
    server = None if redis_url else LocalRedis(persistence=persistence, env=redis_env)
    if server is not None:
        await trio.to_thread.run_sync(server.start)
    try:
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, server, job, ttl_ms, log, redis_url)
            try:
                await cluster.start_simulator(
                    ledger_interval=ledger_interval, ops_per_ledger=ops_per_ledger,
                    history_ledgers=history_ledgers, response_delay_ms=response_delay_ms,
                    rpc=rpc, extra=simulator_extra,
                )  # fmt: skip
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
                nursery.cancel_scope.cancel()
    finally:
        if server is not None:
            server.kill()


def _fields(e: LogLine) -> str:
    return " ".join(f"{k}={v}" for k, v in e.fields.items() if k not in _NOISE)


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
