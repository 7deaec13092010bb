"""An idle standby's source-health report rides on its campaign (issue 27): one round trip per TTL,
not an acquire and a report_health each. Real Redis; the lease is held by the test, renewed as a
leader would; the standby is a real node (Elector, SourceWatch) on a source that answers probes.

When no campaign carries the report (the standby is held off: its source fails while another
node's works), the watch still reports on its own, once per TTL, so peers see the failure at once.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import redis
import structlog
import trio

from actors.health import SourceWatch
from actors.lease_store import Acquired, HealthReport, Held, LeaseStore
from actors.liveness import SourceHealth
from actors.observe import NodeObserver
from actors.source import SyntheticSource
from actors.supervisor import NodeHandle
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.nodes import FAST_TIMING, OpenStore, Recorder, start_node

TTL = FAST_TIMING.ttl
WINDOW_MS = 10_000


@attrs.frozen
class ProbedSynthetic(SyntheticSource):
    """A synthetic source that can tell its own health (a :class:`actors.health.ProbedSource`);
    ``answers[0]`` says whether its probes succeed; ``probed`` holds when each probe came."""

    health: SourceHealth = attrs.Factory(SourceHealth)
    answers: list[bool] = attrs.Factory(lambda: [True])
    probed: list[float] = attrs.Factory(list)

    @property
    def probes(self) -> int:
        return len(self.probed)

    async def probe(self) -> bool:
        self.probed.append(trio.current_time())
        await trio.sleep(0.005)
        return self.answers[0]


class CountingStore(LeaseStore):
    """A real lease store that counts the calls a standby sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acquires = self.carried = self.reports = 0

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self.acquires += 1
        health = kwargs.get("health", args[4] if len(args) > 4 else None)
        self.carried += health is not None
        return await super().acquire(*args, **kwargs)

    async def report_health(self, *args: Any, **kwargs: Any) -> list[str]:
        self.reports += 1
        return await super().report_health(*args, **kwargs)


async def test_an_acquire_carries_a_health_report_and_answers_the_able_nodes(
    redis_server: LocalRedis, redis_client: redis.Redis, open_store: OpenStore, job: str
) -> None:
    store = open_store(redis_server.url, job)
    assert await store.report_health("other", 0, WINDOW_MS) == ["other"]
    granted = await store.acquire("n1", 2000, health=HealthReport(age_ms=100, window_ms=WINDOW_MS))
    assert isinstance(granted, Acquired) and set(granted.able or ()) == {"n1", "other"}
    held = await store.acquire("n2", 2000, health=HealthReport(None, WINDOW_MS, failing_ms=500))
    assert isinstance(held, Held) and held.holder == "n1"
    assert set(held.able or ()) == {"n1", "other"}  # n2 fails: not able
    health = redis_client.hgetall(store.keys["health"])
    assert set(health) == {"other", "n1", "failing:n2"}
    plain = await store.acquire("n3", 2000)  # no report: nothing recorded, nothing listed
    assert isinstance(plain, Held) and plain.able is None
    assert set(redis_client.hgetall(store.keys["health"])) == {"other", "n1", "failing:n2"}
    # The same rules as report_health: a failing node that answers again is able again.
    again = await store.acquire("n2", 2000, health=HealthReport(age_ms=0, window_ms=WINDOW_MS))
    assert isinstance(again, Held) and set(again.able or ()) == {"n1", "n2", "other"}
    assert "failing:n2" not in redis_client.hgetall(store.keys["health"])


async def _hold_lease(store: LeaseStore, stop: trio.Event) -> None:
    """The test leads the job as "leader": renews every TTL/5 and reports its source answering."""
    granted = await store.acquire("leader", int(TTL * 1000))
    assert isinstance(granted, Acquired)
    while not stop.is_set():
        assert await store.renew("leader", granted.token, int(TTL * 1000))
        await store.report_health("leader", 0, WINDOW_MS)
        with trio.move_on_after(TTL / 5):
            await stop.wait()


@attrs.frozen
class Standby:
    holder: LeaseStore  # the test's store, which leads the job
    store: CountingStore  # the standby's
    handle: NodeHandle


@asynccontextmanager
async def standby_beside_a_leader(
    url: str, open_store: OpenStore, job: str, source: ProbedSynthetic
) -> AsyncIterator[Standby]:
    """Node "n1" on ``source`` (a TTL after it started), while the test leads the job."""
    holder = open_store(url, job)
    store = open_store(url, job, store_class=CountingStore)
    assert isinstance(store, CountingStore)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold_lease, holder, stop)
        await trio.sleep(0.05)
        handle = await start_node(
            nursery, Recorder(), url, job, "n1", source, store=store, handover_after=3 * TTL
        )
        await trio.sleep(TTL)  # settle: the first look reports on its own, then it aligns
        yield Standby(holder, store, handle)
        await handle.shutdown()
        stop.set()


async def test_an_idle_standby_sends_one_command_per_ttl(
    redis_server: LocalRedis, open_store: OpenStore, job: str
) -> None:
    source = ProbedSynthetic()
    async with standby_beside_a_leader(redis_server.url, open_store, job, source) as s:
        acquires, carried, reports = s.store.acquires, s.store.carried, s.store.reports
        probes = source.probes
        await trio.sleep(4 * TTL)
        acquires = s.store.acquires - acquires
        carried = s.store.carried - carried
        reports = s.store.reports - reports
        probes = source.probes - probes
        # About one campaign per TTL, each carrying the report; no report of its own.
        assert 3 <= acquires <= 5, acquires
        assert carried == acquires
        assert reports == 0, f"{reports} report_health calls besides {acquires} acquires"
        assert 3 <= probes <= 6, probes  # the source is still looked at about once per TTL
        watch = s.handle.watch
        assert watch is not None and watch.able == frozenset({"leader"})
        # The leader sees the standby as able: its report is fresh.
        assert set(await s.holder.report_health("leader", 0, round(1000 * 2 * TTL))) == {"leader", "n1"}


async def test_a_held_off_standby_still_reports_its_failing_source_each_ttl(
    redis_server: LocalRedis, redis_client: redis.Redis, open_store: OpenStore, job: str
) -> None:
    source = ProbedSynthetic(answers=[False])
    async with standby_beside_a_leader(redis_server.url, open_store, job, source) as s:
        reports = s.store.reports
        await trio.sleep(3 * TTL)
        assert s.store.reports - reports >= 2  # held off: nothing carries it
        assert "failing:n1" in redis_client.hgetall(s.holder.keys["health"])
        assert set(await s.holder.report_health("leader", 0, WINDOW_MS)) == {"leader"}


async def test_a_standby_whose_source_starts_failing_says_so_at_the_probe_that_saw_it(
    redis_server: LocalRedis, redis_client: redis.Redis, open_store: OpenStore, job: str
) -> None:
    """A failing look is not left to a campaign (which the failure holds off): the report goes
    out at once, so peers stop counting the node within a probe, as before the fold."""
    source = ProbedSynthetic()
    async with standby_beside_a_leader(redis_server.url, open_store, job, source) as s:
        await trio.sleep(TTL / 2)
        switched_at = trio.current_time()
        source.answers[0] = False
        with trio.fail_after(3 * TTL):
            while "failing:n1" not in redis_client.hgetall(s.holder.keys["health"]):  # noqa: ASYNC110
                await trio.sleep(0.01)
        said_at = trio.current_time()
        saw = min(t for t in source.probed if t >= switched_at)
        assert said_at - saw < 0.3, f"the failure was reported {said_at - saw:.2f} s after the probe"


def _watch(store: LeaseStore, source: ProbedSynthetic, job: str) -> SourceWatch:
    async def hand_over(_token: int) -> None:
        raise AssertionError("a standby has nothing to hand over")

    return SourceWatch(
        store, "n1", source, TTL, 3 * TTL, structlog.get_logger(), NodeObserver("n1", job),
        leading=lambda: None, hand_over=hand_over,
    )  # fmt: skip


async def test_a_campaign_put_off_again_and_again_does_not_put_off_the_look(
    redis_server: LocalRedis, redis_client: redis.Redis, open_store: OpenStore, job: str
) -> None:
    """The Elector keeps announcing a campaign three TTLs away (a gate delaying it, say) and never
    campaigns: the watch still looks at the source about once per TTL and reports on its own, so
    the node's entry never ages past what peers count (two TTLs)."""
    store = open_store(redis_server.url, job)
    source = ProbedSynthetic()
    watch = _watch(store, source, job)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        ages = []
        for _ in range(16):
            watch.campaign_at(trio.current_time() + 3 * TTL)
            await trio.sleep(TTL / 4)
            (now_s, now_us), entry = redis_client.time(), redis_client.hget(store.keys["health"], "n1")
            assert entry is not None
            ages.append(now_s * 1000 + now_us // 1000 - int(entry))
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(source.probed)]
    assert max(gaps) <= 1.1 * TTL + 0.1, gaps
    assert max(ages) < 2 * TTL * 1000, ages


async def test_a_report_taken_before_the_look_left_to_the_campaign_does_not_count_as_carrying_it(
    redis_server: LocalRedis, open_store: OpenStore, job: str
) -> None:
    """The Elector took its report (an early campaign, woken by a release notice), then the watch
    looked and left that look to the campaign, then the campaign's answer came: what it carried
    was the older look, so the watch still reports the new one itself."""
    store = open_store(redis_server.url, job, store_class=CountingStore)
    assert isinstance(store, CountingStore)
    source = ProbedSynthetic()
    watch = _watch(store, source, job)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        await trio.sleep(0.1)  # the first look, reported on its own
        first_look, reports = source.probed[-1], store.reports
        taken = watch.report()  # the campaign's report: of the first look
        assert taken is not None
        # a campaign announced just after the next look is due (half a TTL after the first)
        watch.campaign_at(first_look + TTL / 2 + watch.lead / 2)
        with trio.fail_after(TTL):
            while len(source.probed) < 2:  # noqa: ASYNC110
                await trio.sleep(0.005)
        await trio.sleep(0.05)
        assert store.reports == reports  # that look was left to the campaign
        watch.carried(("leader",))  # the answer to the campaign that carried the first look
        # the fallback reports the second look a quarter TTL after the campaign was due
        await wait_until(lambda: store.reports > reports, watch.lead + TTL / 4 + 0.5,
                         what="the second look reported")  # fmt: skip
        assert store.reports == reports + 1
        nursery.cancel_scope.cancel()
