"""The lease path of a node: its threads, and its renewals sent together.

Acquire, renew, release and commit run on threads of their own (``LEASE_THREADS`` per trio run,
that is per node process), never queued behind the node's other calls (its jobs' reads and
housekeeping, on trio's default limiter).

Renewals of a node's leases on one plain (or Sentinel) client are sent together: whoever finds no
send under way sends every renewal queued by then in one non-transactional pipeline (one thread
hop, one round trip) and hands each its answer; those that come meanwhile go in the next send,
at once after it. Alone, a renewal goes at once, as before; a node of 200 jobs, whose renewals
fall due together, makes a few calls a second instead of 200 (each a thread hop: issue 46's node
could not keep up on a loaded machine). Each renewal keeps its own bound (the caller's): a send
cut short (its sender's bound, or its term's end) leaves what it took to the next sender, and a
renewal run twice only extends the lease it holds twice. On a Redis Cluster each renewal is its
own call (a job's keys are in its own slot). The queue and its sender:
:mod:`actors.lease_store.pipelined`.
"""

from __future__ import annotations

import weakref
from typing import Any

import redis
import trio

from actors.lease_store.pipelined import Ask, Pipelined, one_per_run

LEASE_THREADS = 40  # the lease path's own threads (acquire, renew, release, commit), per trio run
_LEASE_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("lease_limiter")


def lease_limiter() -> trio.CapacityLimiter:
    """The threads of this trio run's (this node's) lease path."""
    try:
        return _LEASE_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(LEASE_THREADS)
        _LEASE_LIMITER.set(limiter)
        return limiter


class Renewals:
    """The renewals of one node (one client), sent together (see the module doc)."""

    def __init__(self, client: Any, script: Any) -> None:
        self._client = client
        self._script = script  # the renew script (redis-py's Script: its sha and text)
        self._sender = Pipelined(self._send)
        self.sent = 0  # pipelines sent (for tests)

    async def renew(self, keys: list[str], args: list[Any]) -> Any:
        """The renew script's answer for ``keys`` and ``args``; unbounded (the caller bounds it).

        Raises:
            redis.RedisError, OSError: the send failed, or this renewal did.
        """
        return await self._sender.call((keys, args))

    async def _send(self, taken: list[Ask]) -> None:
        try:
            requests = [ask.request for ask in taken]
            answers = await trio.to_thread.run_sync(
                self._pipeline, requests, abandon_on_cancel=True, limiter=lease_limiter()
            )
        except (redis.RedisError, OSError) as exc:
            for ask in taken:
                ask.settle(error=exc)
            return
        self.sent += 1
        for ask, answer in zip(taken, answers, strict=True):
            if isinstance(answer, Exception):
                ask.settle(error=answer)
            else:
                ask.settle(answer)

    def _pipeline(self, renewals: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """In a worker thread: the renewals (keys, args) in one pipeline (the script loaded first if
        the server does not have it: a restarted one); their answers, an exception for each that
        failed."""

        def run(some: list[tuple[list[str], list[Any]]]) -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for keys, args in some:
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            return list(pipe.execute(raise_on_error=False))

        answers = run(renewals)
        missing = [i for i, a in enumerate(answers) if isinstance(a, redis.exceptions.NoScriptError)]
        if missing:
            self._client.script_load(self._script.script)
            for i, answer in zip(missing, run([renewals[i] for i in missing]), strict=True):
                answers[i] = answer
        return answers


_shared: weakref.WeakKeyDictionary[Any, dict[Any, Renewals]] = weakref.WeakKeyDictionary()


def renewals(client: Any, script: Any) -> Renewals:
    """The renewals shared by every lease on ``client`` in this trio run (one per node)."""
    return one_per_run(_shared, client, lambda: Renewals(client, script))
