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
own call (a job's keys are in its own slot).
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import redis
import trio

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


@attrs.define(eq=False)
class _Renewal:
    keys: list[str]
    args: list[Any]
    done: trio.Event = attrs.Factory(trio.Event)
    answer: Any = None
    error: BaseException | None = None


class Renewals:
    """The renewals of one node (one client), sent together (see the module doc)."""

    def __init__(self, client: Any, script: Any) -> None:
        self._client = client
        self._script = script  # the renew script (redis-py's Script: its sha and text)
        self._queued: list[_Renewal] = []
        self._under_way: trio.Event | None = None  # set when the send under way has ended
        self.sent = 0  # pipelines sent (for tests)

    async def renew(self, keys: list[str], args: list[Any]) -> Any:
        """The renew script's answer for ``keys`` and ``args``; unbounded (the caller bounds it).

        Raises:
            redis.RedisError, OSError: the send failed, or this renewal did.
        """
        me = _Renewal(keys, args)
        self._queued.append(me)
        try:
            while not me.done.is_set():
                under_way = self._under_way
                if under_way is None:
                    await self._send()
                else:
                    await under_way.wait()
        finally:
            if me in self._queued:
                self._queued.remove(me)
        if me.error is not None:
            raise me.error
        return me.answer

    async def _send(self) -> None:
        ended = self._under_way = trio.Event()
        taken, self._queued = self._queued, []
        try:
            try:
                answers = await trio.to_thread.run_sync(
                    self._pipeline, taken, abandon_on_cancel=True, limiter=lease_limiter()
                )
            except (redis.RedisError, OSError) as exc:
                for r in taken:
                    r.error = exc
                    r.done.set()
                return
            self.sent += 1
            for r, answer in zip(taken, answers, strict=True):
                if isinstance(answer, Exception):
                    r.error = answer
                else:
                    r.answer = answer
                r.done.set()
        finally:
            self._queued[:0] = [r for r in taken if not r.done.is_set()]  # (cut short: the next send's)
            self._under_way = None
            ended.set()

    def _pipeline(self, renewals: list[_Renewal]) -> list[Any]:
        """In a worker thread: the renewals in one pipeline (the script loaded first if the server
        does not have it: a restarted one); their answers, an exception for each that failed."""

        def run(some: list[_Renewal]) -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for r in some:
                pipe.evalsha(self._script.sha, len(r.keys), *r.keys, *r.args)
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
    token = trio.lowlevel.current_trio_token()
    per_run = _shared.setdefault(client, {})
    found = per_run.get(token)
    if found is None:
        for stale in [t for t in per_run if t is not token]:
            del per_run[stale]  # (a client outlived an earlier trio run: tests)
        found = per_run[token] = Renewals(client, script)
    return found
