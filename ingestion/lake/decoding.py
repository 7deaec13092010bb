"""Decoding lake objects in worker processes, so that one lake job can use more than one core.

stellar-sdk's XDR decoder is pure Python and holds the GIL: decoded in threads of the node, a lake
job uses one core, and every decode competes with the node's own tasks (lease renewals, commits)
for the interpreter. :func:`open_decoders` yields a :class:`Decoders` whose
``await decoders.decode(data)`` runs :func:`~ingestion.lake.events.object_events` in one of
``processes`` worker processes (trio-parallel). The caller bounds how many objects are in flight
(the source's ``read_ahead``) and keeps their order; the workers only run them.

Lifetime: the workers are spawned (not forked: the node has threads) on the first decode. A decode
that is cancelled (the term ends) kills its worker at once: its half-made answer dies with it, on
a pipe of its own, and nothing else waits for it. When the context exits, idle workers are told
to stop and are reaped (killed if they have not stopped within ``_STOP_WAIT``), so no worker
outlives the stream that opened it. A worker also leaves when the node dies: it watches its
parent and exits within ``PARENT_WATCH`` seconds of being orphaned (a worker between decodes
sees its pipe close at once). It ignores SIGINT (trio-parallel's workers do: a terminal's Ctrl-C
reaches the whole process group, and the node stops its workers itself). A worker killed by
something else while it decodes is replaced and the object decoded again (``DECODE_ATTEMPTS``
in all). ``processes = 0`` decodes in a thread of the node's process (no workers: small lakes,
tests).

Why not ``concurrent.futures.ProcessPoolExecutor`` (used before): its workers answer on one shared
queue read by a manager thread. A worker terminated while it wrote an answer leaves that thread
blocked on the rest of the message forever, and the interpreter joins that thread at exit: a node
that handed its lease over cleanly then never exited (seen: 1 of 10 SIGTERMs during a catch-up,
under load).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import structlog
import trio
import trio_parallel

from ingestion.lake.events import LedgerEvents, compile_walks, object_events

_STOP_WAIT = 5.0  # seconds the exit waits for idle workers to stop before killing them
PARENT_WATCH = 1.0  # seconds between a worker's looks at whether its node is still its parent

DECODE_ATTEMPTS = 3  # decodes of one object whose worker died before the job gives up on it

log = structlog.get_logger()
T = TypeVar("T")


class DecoderDied(Exception):
    """An object's decode worker died on every attempt (the message says how, the caller adds
    the ledger and the object's key)."""


def _describe(exc: BaseException) -> str:
    """How a worker died: its exit status when trio-parallel gives the process."""
    for arg in getattr(exc, "args", ()):
        code = getattr(arg, "exitcode", None)
        if isinstance(code, int):
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            return f"{exc.args[0]} ({how})"
    return str(exc) or type(exc).__name__


class Decoders:
    """Runs :func:`~ingestion.lake.events.object_events` off the node's interpreter (see the
    module docstring); made by :func:`open_decoders`."""

    def __init__(self, workers: trio_parallel.WorkerContext | None, processes: int) -> None:
        self._workers = workers
        self._limiter = trio.CapacityLimiter(max(processes, 1))
        self.processes = processes

    async def decode(self, data: bytes) -> Sequence[LedgerEvents]:
        """A compressed object's ledgers and events. Cancellable: a worker decoding when its
        caller is cancelled is killed.

        A worker that dies while it decodes (killed by something else than this node) is logged
        (``lake-decoder-died``) and the object decoded again on a fresh worker, up to
        ``DECODE_ATTEMPTS`` times in all.

        Raises:
            LakeFormatError: the object cannot be read (raised in the worker, re-raised here).
            DecoderDied: its worker died on each of ``DECODE_ATTEMPTS`` attempts.
        """
        return await self.run(object_events, data)

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on a worker (a module-level function, its arguments and answer
        picklable), as :meth:`decode` runs ``object_events``: the same attempts and errors (the
        audit runs its own per-object function, ``ingestion.audit.expect.object_expectation``)."""
        if self._workers is None:
            return await trio.to_thread.run_sync(work, *args)
        for attempt in range(1, DECODE_ATTEMPTS + 1):
            try:
                return await self._workers.run_sync(work, *args, kill_on_cancel=True, limiter=self._limiter)
            except (trio_parallel.BrokenWorkerError, OSError) as exc:
                # killed by something else (the OOM killer, an operator): on a fresh worker again
                if attempt == DECODE_ATTEMPTS:
                    raise DecoderDied(f"its decode worker died {attempt} times: {_describe(exc)}") from exc
                log.warning("lake-decoder-died", attempt=attempt, error=_describe(exc))
        raise AssertionError("unreachable")  # pragma: no cover


@contextlib.asynccontextmanager
async def open_decoders(processes: int) -> AsyncIterator[Decoders]:
    """A :class:`Decoders` of ``processes`` worker processes (0: a thread of this process),
    stopped on exit.

    Raises:
        ValueError: ``processes`` < 0.
    """
    if processes < 0:
        raise ValueError(f"decode processes must be >= 0, got {processes}")
    if processes == 0:
        yield Decoders(None, 0)
        return
    # An idle worker lives as long as the context (no idle timeout: the next object may be a
    # poll interval away, and a new worker pays for stellar-sdk's import again).
    workers = trio_parallel.open_worker_context(
        idle_timeout=math.inf, init=functools.partial(_worker_start, os.getpid()), grace_period=_STOP_WAIT
    )
    context = await workers.__aenter__()
    try:
        yield Decoders(context, processes)
    finally:
        # Not ``async with``: what ended the stream (a cancellation, an error) must go on as it
        # is, never be replaced by the exit's own complaint.
        try:
            await workers.__aexit__(None, None, None)
        except trio_parallel.BrokenWorkerError as exc:
            # a worker had died (non-zero exit) or did not stop when told to and was killed;
            # every worker is reaped either way
            log.warning("lake-decoder-unclean-exit", error=str(exc))


def _worker_start(parent: int) -> None:
    """In each worker: leave when the node (``parent``, its pid) dies, ready the decoder."""

    def watch_parent() -> None:
        # Orphaned (the node was killed): the kernel gave this process a new parent. Not
        # PR_SET_PDEATHSIG: it fires when the *thread* that started the worker ends, and
        # trio-parallel starts workers from trio's cached threads, which end when idle.
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH)
        os._exit(1)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()

    compile_walks()  # the first decode should not pay for importing stellar-sdk and compiling
