"""The children of a test cluster: starting a process, reading its JSON lines into one log.

:func:`spawn` starts a child (:func:`~ingestion.testing.launch.child_env`) and reads its output
with a trio task; every JSON log line becomes a :class:`~ingestion.testing.launch.LogLine` in the
:class:`EventLog`, stamped with the harness's monotonic receive time, so timings are measured on one
clock whatever the children's own (possibly faked: :class:`ClockFake`) wall clocks say. A
:class:`Child` aims each signal where it keeps its meaning (a node is a parent and its worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from ingestion.testing.launch import LogLine, child_env, log_line
from ingestion.testing.wait import output_lines

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
            + " ".join(f"{k}={v}" for k, v in e.fields.items() if k not in NOISE)
            for e in self.lines[-n:]
        ]
        raw = [f"  [raw {p}] {text}" for p, text in self.raw[-10:]]
        return "\n".join(lines + raw)


NOISE = frozenset({"timestamp", "level", "node", "job", "event"})


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
