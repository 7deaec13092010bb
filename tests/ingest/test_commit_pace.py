"""The commit pace alone (I/O-free), ``Batch.take``, and the Ingestor committing a large batch in
parts at that pace on trio's MockClock: each part continues from the cursor the one before wrote,
the read-through cursor goes with the last part, and the parts grow while commits are quick and
shrink at once when one runs past the budget."""

from __future__ import annotations

import pytest
import structlog
import trio
import trio.testing

from actors.commit_pace import CommitPace
from actors.ingestor import Ingestor
from actors.messages import (
    CommitCursor,
    CommitUnknown,
    CursorCommitted,
    ElectorInput,
    IngestorInput,
    LeaseGranted,
    TermEnded,
)
from actors.source import Batch, SyntheticSource


def test_the_pace_doubles_while_full_commits_take_at_most_half_the_budget() -> None:
    pace = CommitPace(budget=0.1)
    assert pace.limit == 1000
    for expected in (2000, 4000, 8000, 10_000, 10_000):
        pace.observed(pace.limit, 0.05)
        assert pace.limit == expected
    pace = CommitPace(budget=0.1)
    pace.observed(1000, 0.051)  # quick, but not twice as quick as the budget: stays
    assert pace.limit == 1000
    pace.observed(999, 0.001)  # a small commit says nothing about a full one: stays
    assert pace.limit == 1000


def test_a_commit_past_the_budget_cuts_the_limit_to_what_fits_with_room_to_spare() -> None:
    pace = CommitPace(budget=0.1)
    for _ in range(4):
        pace.observed(pace.limit, 0.01)
    assert pace.limit == 10_000
    pace.observed(10_000, 0.2)  # twice the budget: half of it fits, with a fifth to spare
    assert pace.limit == 4000
    pace.observed(4000, 0.5)  # never below the floor: what every commit carried before
    assert pace.limit == 1000
    pace.observed(1000, 0.12)  # a slow commit at the floor stays at the floor
    assert pace.limit == 1000
    pace.observed(0, 9.0)  # an anchor-only commit carries no rate
    assert pace.limit == 1000


def test_the_pace_refuses_settings_that_cannot_hold() -> None:
    with pytest.raises(ValueError, match="floor"):
        CommitPace(budget=0.1, floor=0)
    with pytest.raises(ValueError, match="floor"):
        CommitPace(budget=0.1, floor=10, ceiling=5)
    with pytest.raises(ValueError, match="budget"):
        CommitPace(budget=0.0)


def test_take_splits_off_the_first_records_and_keeps_the_through_cursor_on_the_rest() -> None:
    src = SyntheticSource()
    records = tuple(src.record(i) for i in range(1, 6))
    through = src.token_of(9)
    whole = Batch(records, through=through)
    head, rest = whole.take(2)
    assert head == Batch(records[:2]) and rest == Batch(records[2:], through=through)
    assert whole.take(5) == (whole, None) and whole.take(50) == (whole, None)
    anchor = Batch((), through=through)
    assert anchor.take(1) == (anchor, None)
    with pytest.raises(ValueError, match="at least one record"):
        whole.take(0)


class _BigBatches:
    """A source that hands over ``pages`` batches of ``size`` records, each with a read-through
    cursor just past its last record (as Stellar RPC's pages have), then nothing; from a cursor,
    the rest of its page first."""

    def __init__(self, pages: int, size: int) -> None:
        self.synthetic = SyntheticSource(total=None)
        self.pages, self.size = pages, size

    async def resolve_start(self, cursor: str) -> str:
        return cursor

    @trio.as_safe_channel
    async def stream(self, cursor: str):  # type: ignore[no-untyped-def]
        start = 1 if cursor == "0" else SyntheticSource.index_of(cursor) + 1
        for p in range(self.pages):
            first, end = max(start, p * self.size + 1), (p + 1) * self.size + 1
            if first < end:
                records = tuple(self.synthetic.record(i) for i in range(first, end))
                yield Batch(records, through=str(int(records[-1].paging_token) + 1))


class _Writer:
    """A CursorWriter stand-in that holds commits to the script's rules: each continues from the
    cursor stored (the one the commit before wrote), its records ascend strictly from there, and
    an anchor comes after them. A commit takes ``per_record`` seconds a record; the ``unknown_at``
    commit (1-based) goes unanswered as a timed-out one would (CommitUnknown)."""

    def __init__(self, recv: trio.MemoryReceiveChannel[CommitCursor], unknown_at: int = 0) -> None:
        self.recv, self.unknown_at = recv, unknown_at
        self.stored: str | None = None
        self.commits: list[tuple[int, str | None]] = []  # (records, anchor) of each applied commit
        self.per_record = 10e-6
        self.total = 0
        self.reached = trio.Event()

    async def run(self, until: int) -> None:
        key = SyntheticSource.index_of
        async for msg in self.recv:
            await trio.sleep(len(msg.records) * self.per_record)
            if len(self.commits) + 1 == self.unknown_at:
                self.unknown_at = 0
                msg.reply.send_nowait(CommitUnknown(msg.token, "timed out"))
                continue
            assert msg.previous_cursor == self.stored, "a part that does not continue the cursor"
            tokens = [key(r.paging_token) for r in msg.records]
            after = key(self.stored) if self.stored is not None else 0
            assert tokens == list(range(after + 1, after + 1 + len(tokens))), "lost or repeated"
            if msg.anchor is not None:
                assert key(msg.anchor) >= (tokens[-1] if tokens else after), "anchor before records"
            self.stored = msg.cursor
            self.commits.append((len(msg.records), msg.anchor))
            self.total += len(msg.records)
            msg.reply.send_nowait(CursorCommitted(msg.token, msg.cursor, len(msg.records)))
            if self.total >= 12_000:
                self.per_record = 20e-6  # the sink slows down: 4,000 records now take 80 ms
            if self.total >= until:
                self.reached.set()


def _ingestor(pages: int, size: int) -> tuple[Ingestor, trio.MemorySendChannel[IngestorInput],
                                                trio.MemoryReceiveChannel[CommitCursor],
                                                trio.MemoryReceiveChannel[ElectorInput]]:  # fmt: skip
    control_send, control_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[CommitCursor](0)
    elector_send, elector_recv = trio.open_memory_channel[ElectorInput](4)
    ingestor = Ingestor(
        _BigBatches(pages, size), "n", control_recv, writer_send, elector_send,  # type: ignore[arg-type]
        structlog.get_logger(),
    )  # fmt: skip
    ingestor.pace = CommitPace(budget=0.05)
    return ingestor, control_send, writer_recv, elector_recv


async def test_the_ingestor_commits_a_large_batch_in_paced_parts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A commit takes 10 us a record (20 us once 12,000 are in); budget 50 ms: the parts grow
    while they take at most 25 ms, and shrink at once when commits slow down. Every part
    continues from the cursor the one before it wrote, its records are the next ones, and only a
    page's last part carries the page's read-through cursor."""
    ingestor, control, writer_recv, _ = _ingestor(pages=4, size=6000)
    writer = _Writer(writer_recv)
    async with trio.open_nursery() as nursery:
        await nursery.start(ingestor.run)
        nursery.start_soon(writer.run, 24_000)
        await control.send(LeaseGranted(1, trio.current_time() + 600.0, "0", None))
        with trio.fail_after(60):
            await writer.reached.wait()
        nursery.cancel_scope.cancel()
    # page 1: 1,000 (10 ms) and 2,000 (20 ms) double the limit, the rest is 3,000; page 2: 4,000
    # (40 ms: within the budget, not within half) and the rest; then 4,000 take 80 ms: cut to
    # what fits with a fifth to spare, 2,000, which take 40 ms from then on.
    assert [n for n, _ in writer.commits] == [1000, 2000, 3000, 4000, 2000, 4000, 2000, 2000, 2000, 2000]
    synthetic, done = SyntheticSource(), 0
    for n, anchor in writer.commits:
        done += n
        page_end = done % 6000 == 0
        assert anchor == (str(int(synthetic.token_of(done)) + 1) if page_end else None)


async def test_a_commit_with_an_unknown_outcome_ends_the_term_and_the_next_starts_small(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The pace outlives the term: after a commit that went unanswered, the next term's first
    commit carries the floor again, not the size that may have been too large."""
    ingestor, control, writer_recv, elector = _ingestor(pages=10, size=6000)
    writer = _Writer(writer_recv, unknown_at=4)  # commits 1-3: 1,000, 2,000, 3,000; then 4,000
    async with trio.open_nursery() as nursery:
        await nursery.start(ingestor.run)
        nursery.start_soon(writer.run, 6000 + 1000)
        await control.send(LeaseGranted(1, trio.current_time() + 600.0, "0", None))
        ended = await elector.receive()
        assert ended == TermEnded(1, "commit-unknown", "timed out")
        assert ingestor.pace is not None and ingestor.pace.limit == 1000
        assert writer.stored is not None
        await control.send(LeaseGranted(2, trio.current_time() + 600.0, writer.stored, writer.stored))
        with trio.fail_after(60):
            await writer.reached.wait()
        nursery.cancel_scope.cancel()
    assert [n for n, _ in writer.commits] == [1000, 2000, 3000, 1000]
