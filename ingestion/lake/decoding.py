"""Decoding lake objects in worker processes, so that one lake job can use more than one core.

stellar-sdk's XDR decoder is pure Python and holds the GIL: decoded in threads of the node, a lake
job uses one core, and every decode competes with the node's own tasks (lease renewals, commits)
for the interpreter. :func:`open_decoders` yields a :class:`Decoders` whose
``await decoders.decode(data)`` runs :func:`~ingestion.lake.events.object_events` in one of
``processes`` worker processes. The caller bounds how many objects are in flight (the source's
``read_ahead``) and keeps their order; a pool only runs them.

Lifetime: the workers are spawned (not forked: the node has threads) on the first decode and are
terminated and reaped when the context exits, by cancellation too, so no worker outlives the
stream that opened it. A worker also dies with the node (Linux: ``PR_SET_PDEATHSIG``), so a
SIGKILLed node leaves none behind, and ignores SIGINT (a terminal's Ctrl-C reaches the whole
process group; the node stops its pool itself). ``processes = 0`` decodes in a thread of the
node's process (no pool: small lakes, tests).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ProcessPoolExecutor

import trio

from ingestion.lake.events import LedgerEvents, object_events

_STOP_WAIT = 5.0  # seconds the exit waits for terminated workers to be reaped


class Decoders:
    """Runs :func:`~ingestion.lake.events.object_events` off the node's interpreter (see the
    module docstring); made by :func:`open_decoders`."""

    def __init__(self, executor: ProcessPoolExecutor | None, processes: int) -> None:
        self._executor = executor
        self.processes = processes

    async def decode(self, data: bytes) -> Sequence[LedgerEvents]:
        """A compressed object's ledgers and events.

        Raises:
            LakeFormatError: the object cannot be read (raised in the worker, re-raised here).
        """
        if self._executor is None:
            return await trio.to_thread.run_sync(object_events, data)
        # submitted from the trio thread, which lives as long as the node: PR_SET_PDEATHSIG
        # follows the thread that started a worker
        future = self._executor.submit(object_events, data)
        try:
            return await _result(future)
        except trio.Cancelled:
            future.cancel()  # not started yet: never started; running: the exit kills it
            raise


async def _result(future: concurrent.futures.Future[list[LedgerEvents]]) -> list[LedgerEvents]:
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


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
    executor = ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start
    )
    try:
        yield Decoders(executor, processes)
    finally:
        with trio.move_on_after(_STOP_WAIT, shield=True):
            await trio.to_thread.run_sync(_stop, executor)


def _stop(executor: ProcessPoolExecutor) -> None:
    """Terminate and reap the workers, a decode in progress included (``shutdown`` alone would
    wait for it). ``_processes`` is the one private attribute used: Python 3.11's executor has no
    ``terminate_workers`` (3.14 has)."""
    workers = list((executor._processes or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(_STOP_WAIT)


def _worker_start() -> None:
    """In each worker: die with the node, leave Ctrl-C to the node, ready the decoder once."""
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ingestion.lake.events import compile_walks

    compile_walks()  # the first decode should not pay for importing stellar-sdk and compiling
