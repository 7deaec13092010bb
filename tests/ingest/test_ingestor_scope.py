"""The Ingestor's lease cancel scope, on trio's MockClock: ingestion stops by itself at the ingest
deadline unless a renewal moves it, and a graceful revoke lets the in-flight commit finish."""

from __future__ import annotations

import structlog
import trio
import trio.testing

from actors.ingestor import Ingestor
from actors.messages import (
    CommitCursor,
    CursorCommitted,
    ElectorInput,
    IngestorInput,
    LeaseExtended,
    LeaseGranted,
    LeaseRevoked,
    TermEnded,
)
from actors.source import SyntheticSource


class Harness:
    """The Ingestor wired to a writer that takes ``commit_time`` per commit and always succeeds."""

    def __init__(
        self, nursery: trio.Nursery, commit_time: float = 0.05, total: int | None = None
    ) -> None:
        self.control_send, control_recv = trio.open_memory_channel[IngestorInput](4)
        writer_send, self.writer_recv = trio.open_memory_channel[CommitCursor](0)
        elector_send, self.elector_recv = trio.open_memory_channel[ElectorInput](4)
        self.commits: list[tuple[float, str]] = []
        self.commit_time = commit_time
        self.ingestor = Ingestor(
            SyntheticSource(total=total, batch_size=2, interval=0.1),
            "n",
            control_recv,
            writer_send,
            elector_send,
            structlog.get_logger(),
        )
        self.nursery = nursery

    async def start(self) -> None:
        await self.nursery.start(self.ingestor.run)
        self.nursery.start_soon(self._writer)

    async def _writer(self) -> None:
        async for msg in self.writer_recv:
            await trio.sleep(self.commit_time)
            self.commits.append((trio.current_time(), msg.cursor))
            msg.reply.send_nowait(CursorCommitted(msg.token, msg.cursor, len(msg.records)))


async def test_ingestion_is_cancelled_at_the_deadline_without_any_message(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 4.0, "0", None))
        ended = await h.elector_recv.receive()
        assert ended == TermEnded(1, "deadline", "")
        assert trio.current_time() == start + 4.0
        assert h.commits and all(at <= start + 4.0 for at, _ in h.commits)
        nursery.cancel_scope.cancel()


async def test_each_renewal_moves_the_scope_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 4.0, "0", None))
        for k in range(1, 6):
            await trio.sleep_until(start + 3.0 * k)
            await h.control_send.send(LeaseExtended(1, start + 3.0 * k + 4.0))
        ended = await h.elector_recv.receive()
        assert ended.reason == "deadline"
        assert trio.current_time() == start + 19.0
        nursery.cancel_scope.cancel()


async def test_a_graceful_revoke_lets_the_in_flight_commit_finish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, commit_time=1.0)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 60.0, "0", None))
        await trio.sleep(0.5)  # the first commit is in flight now
        await h.control_send.send(LeaseRevoked(1, "shutdown", graceful=True))
        ended = await h.elector_recv.receive()
        assert ended.reason == "revoked"
        assert len(h.commits) == 1 and h.commits[0][0] == start + 1.0
        nursery.cancel_scope.cancel()


async def test_a_hard_revoke_stops_at_once_but_reports_only_after_the_in_flight_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The term ends the moment it is revoked; its end is reported (so the Elector releases the
    lease) only once the commit already handed to the CursorWriter has its answer."""
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, commit_time=0.8)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 60.0, "0", None))
        await trio.sleep(0.5)  # the first commit is in flight now
        await h.control_send.send(LeaseRevoked(1, "fenced", graceful=False))
        ended = await h.elector_recv.receive()
        assert ended.reason == "revoked"
        assert trio.current_time() == start + 0.8
        assert len(h.commits) == 1
        nursery.cancel_scope.cancel()


async def test_waiting_for_an_unanswered_commit_is_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, commit_time=1000.0)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 4.0, "0", None))
        ended = await h.elector_recv.receive()
        assert ended.reason == "deadline"
        assert trio.current_time() == start + 4.0 + h.ingestor.commit_drain
        nursery.cancel_scope.cancel()


async def test_messages_about_another_term_are_ignored(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(2, start + 4.0, "0", None))
        await h.control_send.send(LeaseExtended(1, start + 100.0))
        await h.control_send.send(LeaseRevoked(1, "fenced", graceful=False))
        ended = await h.elector_recv.receive()
        assert ended == TermEnded(2, "deadline", "")
        assert trio.current_time() == start + 4.0
        nursery.cancel_scope.cancel()


async def test_a_graceful_stop_ends_an_idle_term_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A finite source that has run out leaves the term idle; stopping it must not wait for the
    lease deadline."""
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, total=4)
        await h.start()
        start = trio.current_time()
        await h.control_send.send(LeaseGranted(1, start + 60.0, "0", None))
        await trio.sleep(1.0)
        assert len(h.commits) == 2  # everything there was
        await h.control_send.send(LeaseRevoked(1, "shutdown", graceful=True))
        ended = await h.elector_recv.receive()
        assert ended.reason == "revoked"
        assert trio.current_time() == start + 1.0
        nursery.cancel_scope.cancel()
