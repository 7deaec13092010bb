"""The clock a signature's timestamp is taken from (``ServerClock``), on trio's MockClock: Redis's
``TIME`` read once, carried forward by trio's clock, read again every ``CLOCK_REFRESH`` s and at a
new term; never the node's own wall clock (it waits for Redis's first answer); a skew said once a term."""

from __future__ import annotations

import time

import attrs
import pytest
import trio
import trio.testing

from actors.lease_store import RedisUnavailable
from ingestion.webhook.source import CLOCK_REFRESH, CLOCK_RETRY, SKEW_WARN, ServerClock


@attrs.define
class Redis:
    """Redis's clock as the store answers it: ``at`` seconds when read, or unavailable."""

    at: float
    up: bool = True
    reads: int = 0

    async def read(self) -> float:
        self.reads += 1
        if not self.up:
            raise RedisUnavailable("redis://127.0.0.1:1/0: timed out: no answer within 150 ms")
        return self.at


@attrs.define
class Log:
    warnings: list[tuple[str, dict[str, object]]] = attrs.Factory(list)

    def warning(self, event: str, **fields: object) -> None:
        self.warnings.append((event, fields))


async def test_redis_time_is_carried_forward_by_the_monotonic_clock_between_reads(
    mock_clock: trio.testing.MockClock,
) -> None:
    redis = Redis(at=time.time() + 0.5)  # within SKEW_WARN of this machine's clock
    clock = ServerClock(redis.read, Log())
    assert await clock.now() == pytest.approx(redis.at, abs=1e-6)
    start = redis.at
    mock_clock.jump(7.25)
    redis.at += 1000  # what Redis would say now is not asked: the anchor carries on
    assert await clock.now() == pytest.approx(start + 7.25, abs=1e-6)
    assert redis.reads == 1
    mock_clock.jump(CLOCK_REFRESH)  # due again: a fresh reading replaces the anchor
    assert await clock.now() == pytest.approx(redis.at, abs=1e-6)
    assert redis.reads == 2


async def test_without_an_answer_yet_it_waits_for_redis_then_the_last_reading_carries_on(
    mock_clock: trio.testing.MockClock,
) -> None:
    # a node whose wall clock is an hour off, at a term's start while Redis does not answer, must
    # not sign with its own clock: the endpoint would refuse the signature (chaos saw one, 401)
    redis = Redis(at=time.time() - 3600, up=False)  # Redis's clock an hour from ours
    clock = ServerClock(redis.read, Log())
    got: list[float] = []

    async def sign() -> None:
        got.append(await clock.now())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sign)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(5 * CLOCK_RETRY)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and redis.reads >= 2  # still asking, nothing signed
        redis.up = True
        mock_clock.jump(CLOCK_RETRY)
    assert got == [pytest.approx(redis.at, abs=1e-6)]  # answered: Redis's clock
    redis.up = False
    mock_clock.jump(CLOCK_REFRESH + 2)  # due, but the read fails: the last reading carries on
    assert await clock.now() == pytest.approx(redis.at + CLOCK_REFRESH + 2, abs=1e-6)
    clock.reset()  # a new term: due again; Redis still silent, the last reading still stands
    assert await clock.now() == pytest.approx(redis.at + CLOCK_REFRESH + 2, abs=1e-6)


async def test_a_skewed_node_clock_is_said_once_a_term(mock_clock: trio.testing.MockClock) -> None:
    log = Log()
    redis = Redis(at=time.time() + 10 * SKEW_WARN)  # the node's clock is far behind Redis's
    clock = ServerClock(redis.read, log)
    await clock.now()
    mock_clock.jump(CLOCK_REFRESH)
    await clock.now()  # read again, still skewed: not said again
    assert [event for event, _ in log.warnings] == ["wall-clock-skew"]
    assert log.warnings[0][1]["signing_with"] == "redis"
    assert float(str(log.warnings[0][1]["skew_s"])) < -SKEW_WARN
    clock.reset()  # a new term reads again before its first signature, and says the skew again
    await clock.now()
    assert redis.reads == 3 and len(log.warnings) == 2
    redis.at = time.time()  # a clock that agrees is never said
    quiet = ServerClock(redis.read, Log())
    await quiet.now()
    assert not quiet.log.warnings
