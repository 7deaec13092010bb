"""A node going away says so, and a standby at its share believes it at once.

- The release of a node that is exiting (its worker died: ingestion/node/parent.py) carries the
  reason ``node-exiting``: the audit says it, and the notice names the holder and the reason,
  which has a standby at its share take over at once, as for a hand-over.
- The balancer's fresh view after a release notice is read after the notice: a read already in
  flight may have been answered before the node left the registry, and would still count it.

In-process, with a real redis-server (the balanced real-process test is
tests/node/test_balanced_process_crash.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
import structlog
import trio
import trio.testing

from actors.balance import Balancer
from actors.lease_store import NODE_EXITING, Acquired, NodeRegistry, job_keys
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import OpenStore


async def test_a_release_by_an_exiting_node_is_audited_and_its_notice_names_the_holder(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, job)
    granted = await store.acquire("node-a", 5000)
    assert isinstance(granted, Acquired)
    notices = open_store(redis_server.url, job).release_notices()
    try:
        assert await notices.wait(0.05) is None  # subscribed
        assert await store.release("node-a", granted.token, NODE_EXITING)
        assert await notices.wait(2.0) == "node-a"
        assert notices.reason == NODE_EXITING and notices.handed_over
        # a plain release says nothing more
        again = await store.acquire("node-b", 5000)
        assert isinstance(again, Acquired)
        assert await store.release("node-b", again.token)
        assert await notices.wait(2.0) == "node-b"
        assert notices.reason == "" and not notices.handed_over
    finally:
        notices.close()
    released = [f for _id, f in redis_client.xrange(job_keys(job)["audit"]) if f["event"] == "released"]
    assert released[0]["reason"] == NODE_EXITING and "reason" not in released[1]


class HeldRegistry(NodeRegistry):
    """The real registry, whose first answer is held back until the test lets it through (a
    read in flight: Redis answered it, the answer has not arrived yet)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        super().__init__(client, key=key)
        self.answered = trio.Event()
        self.deliver = trio.Event()
        self.reads = 0

    async def heartbeat(self, node: str, live_ms: int, *, hosting: Iterable[str] | None = None) -> list[str]:
        live = await super().heartbeat(node, live_ms, hosting=hosting)
        self.reads += 1
        if self.reads == 1:
            self.answered.set()
            await self.deliver.wait()
        return live


async def test_a_fresh_view_after_a_notice_is_read_after_it_not_shared_with_an_older_read(
    redis_client: redis.Redis, job: str
) -> None:
    key = f"{job}:nodes"
    await NodeRegistry(redis_client, key=key).heartbeat("a", 10_000)
    registry = HeldRegistry(redis_client, key)
    jobs = [f"{job}-{i}" for i in range(4)]
    balancer = Balancer(
        registry, "b", jobs, leading=lambda j: j in jobs[:2], hand_back=trio.sleep, wake=lambda j: None,
        log=structlog.get_logger(), interval=10.0, live_window_ms=10_000, ttl=1.0,
    )  # fmt: skip
    decision: list[float | None] = []

    async def ask(job: str, since: float) -> None:
        decision.append(await balancer.campaign_delay(job, fresh_since=since))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(balancer.tick)  # a tick's read: a is live when Redis answers it
        await registry.answered.wait()
        # a leaves (its worker died), then its release notices wake this node's standbys
        await NodeRegistry(redis_client, key=key).leave("a")
        noticed = trio.current_time()
        nursery.start_soon(ask, jobs[2], noticed)
        await trio.testing.wait_all_tasks_blocked()
        registry.deliver.set()
    assert registry.reads == 2
    assert balancer.live == ("b",)
    # the second notice, which arrived before that read started, is answered from its view
    await ask(jobs[3], noticed)
    assert registry.reads == 2
    # b alone: its share is all four jobs, so it campaigns at once for those a released
    assert decision == [0.0, 0.0]
