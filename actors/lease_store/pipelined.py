"""Requests of many tasks on one Redis client, sent together: the node's lease path sends its
renewals so (:mod:`actors.lease_store.lease_path`) and its batch its short reads
(:mod:`actors.lease_store.batch`).

Each caller queues its request and waits for its answer. Whoever finds no send under way leads
the next one: it waits for its moment (``before``: at once, or the next tick), takes every request
queued by then and hands them to ``send`` (one pipeline: one thread hop, one round trip), which
fills in each request's answer or error; requests that come meanwhile go in the next send, led by
one of their callers. A leader cut short (its caller's bound, or its term's end) puts what it took
back in front of the queue for the next leader: a request may run twice, so only requests that
may (reads, renewals) are sent this way.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.define(eq=False)
class Ask:
    """One caller's request; ``send`` settles it: its answer or its error."""

    request: Any
    done: trio.Event = attrs.Factory(trio.Event)
    answer: Any = None
    error: BaseException | None = None  # raised to the caller

    def settle(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer, self.error = answer, error
        self.done.set()


class Pipelined:
    """The requests of one client's callers, sent together (see the module docstring).

    ``send(asks)`` sends the asks' requests and settles each; an ask it leaves unsettled goes to
    the next send. ``before()`` (None: nothing) is awaited by
    each leader before it takes the queue.
    """

    def __init__(
        self,
        send: Callable[[list[Ask]], Awaitable[None]],
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._send = send
        self._before = before
        self._queued: list[Ask] = []
        self._under_way: trio.Event | None = None  # set when the send under way has ended

    async def call(self, request: Any) -> Any:
        """``request``'s answer, once a send has carried it; unbounded (the caller bounds it).

        Raises:
            BaseException: the error ``send`` set for this request.
        """
        me = Ask(request)
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
        return me.answer

    async def _lead(self) -> None:
        ended = self._under_way = trio.Event()
        taken: list[Ask] = []
        try:
            if self._before is not None:
                await self._before()
            taken, self._queued = self._queued, []
            if taken:
                await self._send(taken)
        finally:
            self._queued[:0] = [ask for ask in taken if not ask.done.is_set()]  # (cut short: the next send's)
            self._under_way = None
            ended.set()


def one_per_run(
    shared: weakref.WeakKeyDictionary[Any, dict[Any, T]], client: Any, make: Callable[[], T]
) -> T:
    """The one ``make()`` of ``client`` in this trio run (one per node), kept in ``shared``."""
    token = trio.lowlevel.current_trio_token()
    per_run = shared.setdefault(client, {})
    found = per_run.get(token)
    if found is None:
        for stale in [t for t in per_run if t is not token]:
            del per_run[stale]  # (a client outlived an earlier trio run: tests)
        found = per_run[token] = make()
    return found
