"""Short periodic reads of many jobs of a node, made together: one pipeline a tick for them all.

A webhook job looks at its operators' requests every second and counts its held dead letters
every few seconds. One call each, per job, on the node's threads: with 150 webhook jobs on a node
that was hundreds of thread hops a second beside the renewals and commits (issue 46). Here the
jobs of a node (of one Redis client) queue their commands, and whoever finds no batch under way
leads the next one: it waits for the next tick (the multiples of ``every`` seconds, trio's clock),
sends every command queued by then in one non-transactional pipeline (one thread hop, one round
trip) and hands each caller its answers. A caller waits at most a tick and the call.

Cancelling the leader (its job's term ended) puts what it took back in the queue, for the next
leader; the commands are reads, so one that may have run already runs again harmlessly.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import trio

from actors.lease_store.connect import describe_redis_error
from actors.lease_store.results import RedisUnavailable
from actors.lease_store.store import LeaseStore

EVERY = 1.0  # seconds: the tick of a node's batch


@attrs.define(eq=False)
class _Ask:
    add: Callable[[Any], object]  # puts the caller's commands on the pipeline
    done: trio.Event = attrs.Factory(trio.Event)
    answers: list[Any] = attrs.Factory(list)
    error: RedisUnavailable | None = None


class Batch:
    """The batched reads of one node (one Redis client), a pipeline every ``every`` seconds."""

    def __init__(self, client: Any, call_timeout: float, every: float = EVERY) -> None:
        self._client = client
        self._store = LeaseStore(client, "-", call_timeout)  # for its bounded calls
        self.every = every
        self._queued: list[_Ask] = []
        self._under_way: trio.Event | None = None  # set when the batch under way has ended
        self.sent = 0  # pipelines sent (for tests)

    async def call(self, add: Callable[[Any], object]) -> list[Any]:
        """The answers to the commands ``add`` puts on a pipeline (in order), once the node's next
        batch has run: within a tick and the call.

        Raises:
            RedisUnavailable: the batch failed or timed out, or one of these commands failed.
        """
        me = _Ask(add)
        self._queued.append(me)
        try:
            while not me.done.is_set():
                under_way = self._under_way
                if under_way is None:
                    await self._lead()
                else:
                    await under_way.wait()
        finally:
            if me in self._queued:
                self._queued.remove(me)
        if me.error is not None:
            raise me.error
        return me.answers

    async def _lead(self) -> None:
        ended = self._under_way = trio.Event()
        taken: list[_Ask] = []
        try:
            now = trio.current_time()
            await trio.sleep_until(math.floor(now / self.every + 1) * self.every)
            taken, self._queued = self._queued, []
            if not taken:
                return
            try:
                answers = await self._store.run(self._send, taken)
            except RedisUnavailable as exc:
                for ask in taken:
                    ask.error = exc
                    ask.done.set()
                return
            self.sent += 1
            for ask, got in zip(taken, answers, strict=True):
                failed = next((a for a in got if isinstance(a, Exception)), None)
                if failed is not None:
                    ask.error = RedisUnavailable(describe_redis_error(failed, where="batch"))
                ask.answers = got
                ask.done.set()
        finally:
            # (cancelled: what it took goes to the next leader)
            self._queued[:0] = [ask for ask in taken if not ask.done.is_set()]
            self._under_way = None
            ended.set()

    def _send(self, asks: list[_Ask]) -> list[list[Any]]:
        """In a worker thread: every ask's commands in one pipeline; each ask's answers."""
        pipe = self._client.pipeline(transaction=False)
        counts = []
        for ask in asks:
            before = len(pipe)
            ask.add(pipe)
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
    token = trio.lowlevel.current_trio_token()
    per_run = _shared.setdefault(client, {})
    found = per_run.get(token)
    if found is None:
        for stale in [t for t in per_run if t is not token]:
            del per_run[stale]  # (a client outlived an earlier trio run: tests)
        found = per_run[token] = Batch(client, call_timeout)
    return found
