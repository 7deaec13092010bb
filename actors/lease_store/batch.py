"""Short periodic reads of many jobs of a node, made together: one pipeline a tick for them all.

A webhook job looks at its operators' requests every second and counts its held dead letters
every few seconds. One call each, per job, on the node's threads: with 150 webhook jobs on a node
that was hundreds of thread hops a second beside the renewals and commits (issue 46). Here the
jobs of a node (of one Redis client) queue their commands, and whoever finds no batch under way
leads the next one: it waits for the next tick (the multiples of ``every`` seconds, trio's clock),
sends every command queued by then in one non-transactional pipeline (one thread hop, one round
trip) and hands each caller its answers. A caller waits at most a tick and the call.

Cancelling the leader (its job's term ended) puts what it took back in the queue, for the next
leader; the commands are reads, so one that may have run already runs again harmlessly. (The
queue and its leader are the lease path's too: :mod:`actors.lease_store.pipelined`.)
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import trio

from actors.lease_store.connect import describe_redis_error
from actors.lease_store.pipelined import Ask, Pipelined, one_per_run
from actors.lease_store.results import RedisUnavailable
from actors.lease_store.store import LeaseStore

EVERY = 1.0  # seconds: the tick of a node's batch


class Batch:
    """The batched reads of one node (one Redis client), a pipeline every ``every`` seconds."""

    def __init__(self, client: Any, call_timeout: float, every: float = EVERY) -> None:
        self._client = client
        self._store = LeaseStore(client, "-", call_timeout)  # for its bounded calls
        self.every = every
        self._sender = Pipelined(self._send, before=self._tick)
        self.sent = 0  # pipelines sent (for tests)

    async def call(self, add: Callable[[Any], object]) -> list[Any]:
        """The answers to the commands ``add`` puts on a pipeline (in order), once the node's next
        batch has run: within a tick and the call.

        Raises:
            RedisUnavailable: the batch failed or timed out, or one of these commands failed.
        """
        answers: list[Any] = await self._sender.call(add)
        return answers

    async def _tick(self) -> None:
        await trio.sleep_until(math.floor(trio.current_time() / self.every + 1) * self.every)

    async def _send(self, taken: list[Ask]) -> None:
        try:
            answers = await self._store.run(self._pipeline, [ask.request for ask in taken])
        except RedisUnavailable as exc:
            for ask in taken:
                ask.settle(error=exc)
            return
        self.sent += 1
        for ask, got in zip(taken, answers, strict=True):
            failed = next((a for a in got if isinstance(a, Exception)), None)
            error = None if failed is None else RedisUnavailable(describe_redis_error(failed, where="batch"))
            ask.settle(got, error)

    def _pipeline(self, adds: list[Callable[[Any], object]]) -> list[list[Any]]:
        """In a worker thread: every caller's commands in one pipeline; each caller's answers."""
        pipe = self._client.pipeline(transaction=False)
        counts = []
        for add in adds:
            before = len(pipe)
            add(pipe)
            counts.append(len(pipe) - before)
        answers = pipe.execute(raise_on_error=False) if counts and sum(counts) else []
        out, at = [], 0
        for n in counts:
            out.append(list(answers[at : at + n]))
            at += n
        return out


_shared: weakref.WeakKeyDictionary[Any, dict[Any, Batch]] = weakref.WeakKeyDictionary()


def batch(client: Any, call_timeout: float) -> Batch:
    """The batch shared by every caller on ``client`` in this trio run (one per node)."""
    return one_per_run(_shared, client, lambda: Batch(client, call_timeout))
