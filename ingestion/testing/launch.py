"""How the testing kit starts and stops its children: one way for every driver of them.

The command line of a node (``python -m ingestion``) and of the simulator (``python -m ingestion
simulate``), the environment they run in, a child's JSON log line read as a :class:`LogLine`, when a
child is ready (the simulator's ``simulator-listening``, a node's first ``became-leader`` or
``standby``), and stopping (SIGTERM, a grace period, then SIGKILL). The trio harness
(:mod:`ingestion.testing.cluster`, which the demo and the chaos campaign run on) and the
thread-driven one of the benchmarks (:mod:`ingestion.testing.processes`) call these, so none of
them spells a child's command line on its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

PYTHON = sys.executable
LISTENING = "simulator-listening"  # the simulator's first line: it serves (its url, rpc_url)
JOINED = ("became-leader", "standby")  # a node's first line of either: it has joined its job


@attrs.frozen
class LogLine:
    at: float  # the harness's monotonic time when the line was read
    node: str  # the process's name in the harness
    event: str
    fields: dict[str, Any]


def node_command(
    node_id: str,
    *,
    jobs: Sequence[str],
    redis_url: str,
    horizon: str | None,
    ttl_ms: int,
    start_cursor: str = "0",
    extra: Sequence[str] = (),
) -> list[str]:
    """A node's command line: ``jobs`` are ``--job`` values (``NAME`` or ``NAME=RESOURCE``);
    ``horizon`` None for a node hosting no Horizon job (it refuses a flag no hosted job uses);
    ``extra`` last, so that its flags win."""
    return [
        PYTHON, "-m", "ingestion",
        "--node-id", node_id,
        *(flag for job in jobs for flag in ("--job", job)),
        "--redis", redis_url,
        *(["--horizon", horizon] if horizon else []),
        "--start-cursor", start_cursor,
        "--lease-ttl-ms", str(ttl_ms),
        "--log-format", "json",
        *extra,
    ]  # fmt: skip


def simulator_command(
    *,
    ledger_interval: float | None = None,
    ops_per_ledger: int | None = None,
    history_ledgers: int | None = None,
    response_delay_ms: int | None = None,
    cache_records: int | None = None,
    rpc: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The simulator's command line, on a free port (``--rpc-port 0`` too with ``rpc``); a setting
    left None is the simulator's default."""
    settings = {
        "--ledger-interval": ledger_interval,
        "--ops-per-ledger": ops_per_ledger,
        "--history-ledgers": history_ledgers,
        "--response-delay-ms": response_delay_ms,
        "--cache-records": cache_records,
    }
    return [
        PYTHON, "-m", "ingestion", "simulate", "--port", "0",
        *(a for flag, value in settings.items() if value is not None for a in (flag, str(value))),
        *(["--rpc-port", "0"] if rpc else []),
        *extra,
    ]  # fmt: skip


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: this process's, unbuffered output (every line reaches the harness as
    it is written), and ``extra``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


def log_line(name: str, raw: bytes | str, at: float) -> LogLine | None:
    """``raw``, a line ``name`` wrote, as a :class:`LogLine` read at ``at``; None for a line that
    is not a JSON object with an ``event`` (a traceback, a warning, a blank line)."""
    text = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "event" not in obj:
        return None
    return LogLine(at, name, str(obj.pop("event")), obj)


def listening(line: LogLine) -> bool:
    """The simulator is serving (``line.fields``: its ``url``, and ``rpc_url`` with RPC)."""
    return line.event == LISTENING


def joined(line: LogLine, node: str, since: float) -> bool:
    """``node`` joined its job (led it or stood by) at or after ``since``."""
    return line.node == node and line.at >= since and line.event in JOINED


# -- stopping --------------------------------------------------------------------------------------


async def terminate(processes: Iterable[trio.Process], grace: float) -> None:
    """SIGTERM every one still running (a node hands its leases over), and wait up to ``grace``
    seconds for them all to exit."""
    running = [p for p in processes if p.returncode is None]
    for p in running:
        p.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace):
        for p in running:
            await p.wait()


def kill_remaining(processes: Iterable[trio.Process]) -> None:
    """SIGKILL every one still running."""
    for p in processes:
        if p.returncode is None:
            p.kill()


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """:func:`terminate` and :func:`kill_remaining` for one child driven from a thread."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
