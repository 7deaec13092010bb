"""Waiting for a condition, and running a child and reading its JSON lines: what many tests do.

A test that polls (Redis, a counter, a flag another process sets) calls :func:`wait_until` with the
bound it allows and words for what it waits for, so a run that times out says what never happened
instead of a bare ``TooSlowError``. A test that runs a node or a tool as a child process reads its
structured log with :func:`json_lines` (the whole output, after exit) or :func:`read_json_lines`
(as it is written, in a task of its own). Processes that are not the test's own children are
watched through ``/proc``: :func:`alive`, :func:`children`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, overload

import trio

T = TypeVar("T")

POLL_EVERY = 0.02


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]], within: float, *, what: str, every: float = POLL_EVERY
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T], within: float, *, what: str, every: float = POLL_EVERY
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any], within: float, *, what: str, every: float = POLL_EVERY
) -> Any:
    """Call ``predicate`` every ``every`` seconds until it returns something true, and return that.

    Args:
        predicate: a cheap check (a Redis read, a counter, a list of log lines), or an async one
            (a request: its awaitable is awaited); it is called once more at the deadline, so a
            condition met while the test slept still counts.
        within: seconds to wait, at most.
        what: the condition in words, for the failure message.

    Raises:
        AssertionError: ``predicate`` was still false ``within`` seconds later, naming ``what``.
    """

    async def check() -> Any:
        value = predicate()
        return await value if inspect.isawaitable(value) else value

    with trio.move_on_after(within):
        while True:
            value = await check()
            if value:
                return value
            await trio.sleep(every)
    value = await check()
    if value:
        return value
    raise AssertionError(f"waited {within} s for {what}, in vain")


def child_env() -> dict[str, str]:
    """The environment for a child ``python -m ingestion``: ours without ``INGESTION_*``, so a
    setting exported where the tests run cannot change what the child is told."""
    return {k: v for k, v in os.environ.items() if not k.startswith("INGESTION_")}


def json_lines(output: bytes | str) -> list[dict[str, Any]]:
    """The JSON objects among a finished child's output lines (other lines, e.g. a traceback, are
    skipped)."""
    text = output.decode() if isinstance(output, bytes) else output
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def output_lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    """Each complete line a child writes to ``stream`` (without its newline) as it arrives, then
    the unterminated rest, if any, once the stream ends (or is closed under us)."""
    buffer = b""
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            chunk = b""
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line
    if buffer:
        yield buffer


async def read_json_lines(stream: trio.abc.ReceiveStream, into: list[dict[str, Any]]) -> None:
    """Append each JSON object line the child writes to ``stream`` to ``into``, until it ends."""
    async for line in output_lines(stream):
        if line.startswith(b"{"):
            into.append(json.loads(line))


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces and
    parentheses): state, parent pid, ...

    Raises:
        OSError: no such process.
    """
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def children(pid: int, command: str) -> list[int]:
    """The pids of ``pid``'s child processes whose command line holds ``command``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile
            if int(_stat(int(proc.name))[1]) == pid and command.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found
