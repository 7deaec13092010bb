"""The Heartbeat's schedule on trio's MockClock, with real renewals in a real Redis: a renewal
that overran its slot is followed by the next slot still ahead (``granted_at + k * interval``),
never by a burst of catch-up renewals for the slots it missed."""

from __future__ import annotations

import structlog
import trio
import trio.testing

from actors.heartbeat import Heartbeat
from actors.lease_store import Acquired, LeaseStore, connect
from actors.messages import ElectorInput, HeartbeatInput, RenewSucceeded, StartRenewing, StopRenewing
from ingestion.testing.local_redis import LocalRedis


class HeldRenewal(LeaseStore):
    """A real store whose ``hold``-th renewal waits for the test before it goes to Redis, so the
    test can move the clock while that renewal is in flight."""

    def __init__(self, url: str, job: str, hold: int) -> None:
        super().__init__(connect(url, timeout=1.0), job)
        self.hold = hold
        self.calls: list[float] = []  # trio time of each renewal
        self.in_flight = trio.Event()
        self.answer = trio.Event()

    async def renew(self, node: str, token: int, ttl_ms: int) -> bool:
        self.calls.append(trio.current_time())
        if len(self.calls) == self.hold:
            self.in_flight.set()
            await self.answer.wait()
        return await super().renew(node, token, ttl_ms)


async def test_a_renewal_that_overran_its_slot_skips_to_the_next_future_slot(
    mock_clock: trio.testing.MockClock, redis_server: LocalRedis, job: str
) -> None:
    """Interval 1 s from t0: renewals at t0+1, t0+2 (which takes until t0+4.5), then t0+5. The
    slots t0+3 and t0+4 are skipped. (The clock stands still unless the test moves it, so the
    store's own call bound never fires while Redis answers in real time.)"""
    store = HeldRenewal(redis_server.url, job, hold=2)
    assert isinstance(await store.acquire("n", 60_000), Acquired)
    control_send, control = trio.open_memory_channel[HeartbeatInput](4)
    elector, to_elector = trio.open_memory_channel[ElectorInput](4)
    heartbeat = Heartbeat(store, "n", 60_000, 1.0, control, elector, structlog.get_logger())
    async with trio.open_nursery() as nursery:
        await nursery.start(heartbeat.run)
        t0 = trio.current_time()
        await control_send.send(StartRenewing(1, t0))

        # Each jump waits until the Heartbeat sleeps for its next slot (no renewal in flight).
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)
        assert await to_elector.receive() == RenewSucceeded(1, t0 + 1)

        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)
        await store.in_flight.wait()  # the renewal of slot t0+2 is in flight...
        mock_clock.jump(2.5)  # ...until t0+4.5
        store.answer.set()
        assert await to_elector.receive() == RenewSucceeded(1, t0 + 2)

        await trio.testing.wait_all_tasks_blocked()
        assert store.calls == [t0 + 1, t0 + 2]  # no catch-up renewal at t0+4.5 for t0+3, t0+4

        mock_clock.jump(0.5)
        assert await to_elector.receive() == RenewSucceeded(1, t0 + 5)
        assert store.calls == [t0 + 1, t0 + 2, t0 + 5]

        await control_send.send(StopRenewing(1))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(10.0)
        await trio.testing.wait_all_tasks_blocked()
        assert store.calls == [t0 + 1, t0 + 2, t0 + 5]  # stopped: no renewal after that
        await control_send.aclose()
    store.client.close()
