"""The queue and its leader that the lease path's renewals and the node's batch share
(actors/lease_store/pipelined.py), driven by a send of the test's own: requests that come while a
send is under way go together in the next; a leader cut short mid-send leaves what it took to the
next; an error reaches its own caller only; one sender per client and trio run."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from actors.lease_store.pipelined import Ask, Pipelined, one_per_run


class Sends:
    """A send that records what each send carried and answers each request times ten, a
    request below zero with an error; the first send waits for ``first`` when it is given."""

    def __init__(self, first: trio.Event | None = None) -> None:
        self.carried: list[list[Any]] = []
        self.first = first

    async def __call__(self, asks: list[Ask]) -> None:
        self.carried.append([ask.request for ask in asks])
        if self.first is not None and len(self.carried) == 1:
            await self.first.wait()
        for ask in asks:
            if ask.request < 0:
                ask.settle(error=ValueError(f"refused {ask.request}"))
            else:
                ask.settle(ask.request * 10)


async def test_requests_that_come_during_a_send_go_together_in_the_next() -> None:
    sends = Sends(first=trio.Event())
    sender = Pipelined(sends)
    got: dict[int, int] = {}

    async def call(i: int) -> None:
        got[i] = await sender.call(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 0)
        await wait_all_tasks_blocked()  # 0 leads, alone, at once: its send is under way
        for i in range(1, 5):
            nursery.start_soon(call, i)
        await wait_all_tasks_blocked()
        assert sends.carried == [[0]]
        assert sends.first is not None
        sends.first.set()
    assert [sorted(carried) for carried in sends.carried] == [[0], [1, 2, 3, 4]]  # (in queue order)
    assert got == {i: i * 10 for i in range(5)}


async def test_a_leader_cut_short_mid_send_leaves_what_it_took_to_the_next() -> None:
    tick = trio.Event()
    sends = Sends(first=trio.Event())  # the first send never ends: its leader is cut short

    async def before() -> None:
        await tick.wait()

    sender = Pipelined(sends, before=before)
    got: list[int] = []
    led = trio.CancelScope()

    async def leader() -> None:
        with led:
            await sender.call(1)

    async def other() -> None:
        got.append(await sender.call(2))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leader)
            await wait_all_tasks_blocked()
            nursery.start_soon(other)  # queued while the leader waits for its moment
            await wait_all_tasks_blocked()
            tick.set()
            await wait_all_tasks_blocked()
            assert sends.carried == [[1, 2]]
            led.cancel()
    assert led.cancelled_caught
    assert sends.carried == [[1, 2], [2]]  # the leader's own request left with it
    assert got == [20]


async def test_an_error_reaches_its_own_caller_only() -> None:
    sender = Pipelined(Sends())
    got: list[int] = []

    async def call(i: int) -> None:
        got.append(await sender.call(i))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 3)
        with pytest.raises(ValueError, match="refused -1"):
            await sender.call(-1)
    assert got == [30]


async def test_one_sender_per_client_and_trio_run() -> None:
    shared: weakref.WeakKeyDictionary[Any, dict[Any, Pipelined]] = weakref.WeakKeyDictionary()

    class Client:
        pass

    a, b = Client(), Client()
    first = one_per_run(shared, a, lambda: Pipelined(Sends()))
    assert one_per_run(shared, a, lambda: Pipelined(Sends())) is first
    assert one_per_run(shared, b, lambda: Pipelined(Sends())) is not first

    async def in_another_run() -> Pipelined:
        return one_per_run(shared, a, lambda: Pipelined(Sends()))

    other = await trio.to_thread.run_sync(trio.run, in_another_run)
    assert other is not first
    assert len(shared[a]) == 1  # (the earlier run's is dropped)
