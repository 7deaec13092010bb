"""A hand-back names the term it means: one that arrives after that term ended is ignored.

In-process node, the real actors, a real redis-server. The store pauses a campaign (a real acquire
on a real Redis, only held back before it is sent) so that a hand-back can be queued exactly while
the node is between terms: the balancer or the source watch decided on the term that just ended.
"""

from __future__ import annotations

from typing import Any

import redis
import trio

from actors.lease_store import Acquired, Held, LeaseStore, StateLost
from actors.source import SyntheticSource
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import OpenStore, Recorder, start_node

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)


class PausedCampaigns(LeaseStore):
    """A real lease store whose acquires wait, once armed, until the test lets them go."""

    def __init__(self, base: LeaseStore) -> None:
        super().__init__(base.client, base.job, base.call_timeout)
        self.armed = False
        self.waiting = trio.Event()
        self.go = trio.Event()

    async def acquire(self, *args: Any, **kwargs: Any) -> Acquired | Held | StateLost:
        if self.armed:
            self.armed = False
            self.waiting.set()
            await self.go.wait()
        return await super().acquire(*args, **kwargs)


async def test_a_hand_back_queued_during_a_campaign_does_not_end_the_next_term(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    rec = Recorder()
    store = PausedCampaigns(open_store(redis_server.url, job))
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", LIVE, store=store)
        await rec.wait_for("became-leader", "a", token=1)
        await rec.wait_for("committed", "a", count=2)
        store.armed = True
        await a.hand_back()  # term 1 ends gracefully; the node campaigns again at once
        await rec.wait_for("lost-leadership", "a", token=1, reason="rebalanced")
        with trio.fail_after(5):
            await store.waiting.wait()
        # Between terms: a hand-back meant for term 1 (a balancer tick that saw it leading, a
        # source watch that decided during it) reaches the Elector's inbox now.
        await a.hand_back()
        await a.hand_back(1)
        store.go.set()
        await rec.wait_for("became-leader", "a", token=2)
        commits = len(rec.of("committed", "a"))
        await rec.wait_for("committed", "a", count=commits + 5)
        assert not [e for e in rec.of("lost-leadership", "a") if e.fields["token"] == 2]
        # A hand-back for the term it leads still ends it.
        await a.hand_back()
        await rec.wait_for("lost-leadership", "a", token=2, reason="rebalanced")
        await a.shutdown()
        await rec.wait_for("stopped", "a")
