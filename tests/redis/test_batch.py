"""The node's batch (actors/lease_store/batch.py): many callers' short reads, one pipeline a tick;
a failed command fails its caller only; a cancelled leader's callers are served by the next.
In-process, with a real redis-server."""

from __future__ import annotations

from typing import Any

import redis
import trio
import trio.testing

from actors.lease_store import RedisUnavailable, batch

CALLERS = 100


async def test_many_callers_share_one_pipeline_and_each_gets_its_own_answers(
    redis_client: redis.Redis, job: str
) -> None:
    for i in range(CALLERS):
        redis_client.rpush(f"{job}-{i}", *range(i + 1))
    redis_client.set(f"{job}-string", "x")
    shared = batch(redis_client, 1.0)
    got: dict[int, list[Any]] = {}
    failed: list[str] = []

    async def call(i: int) -> None:
        got[i] = await shared.call(lambda pipe: (pipe.llen(f"{job}-{i}"), pipe.lindex(f"{job}-{i}", 0)))

    async def wrong() -> None:
        try:
            await shared.call(lambda pipe: pipe.llen(f"{job}-string"))
        except RedisUnavailable as exc:
            failed.append(str(exc))

    async with trio.open_nursery() as nursery:
        for i in range(CALLERS):
            nursery.start_soon(call, i)
        nursery.start_soon(wrong)
    assert got == {i: [i + 1, "0"] for i in range(CALLERS)}
    assert shared.sent == 1
    assert len(failed) == 1 and "WRONGTYPE" in failed[0]


async def test_a_cancelled_leader_leaves_the_others_to_the_next(redis_client: redis.Redis, job: str) -> None:
    redis_client.set(f"{job}-x", "1")
    shared = batch(redis_client, 1.0)
    got: list[Any] = []
    led = trio.CancelScope()

    async def leader() -> None:
        with led:  # the first caller leads the batch; its term ends while it waits for the tick
            await shared.call(lambda pipe: pipe.get(f"{job}-x"))

    async def other() -> None:
        got.extend(await shared.call(lambda pipe: pipe.get(f"{job}-x")))

    with trio.fail_after(2 * shared.every + 1.0):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leader)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(other)  # queued behind the leader's batch
            await trio.testing.wait_all_tasks_blocked()
            led.cancel()
    assert led.cancelled_caught
    assert got == ["1"]
    assert shared.sent == 1
