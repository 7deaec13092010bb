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
from actors.messages import CommitCursor, CursorCommitted, ElectorInput, IngestorInput, LeaseGranted
from actors.source import Batch, Record, SyntheticSource


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


class _BigBatches:
    """A source that hands over ``pages`` batches of ``size`` records, each with a read-through
    cursor one ledger past its last record (as Stellar RPC's pages do), then nothing."""

    def __init__(self, pages: int, size: int) -> None:
        self.synthetic = SyntheticSource(total=None)
        self.pages, self.size = pages, size

    async def resolve_start(self, cursor: str) -> str:
        return cursor

    @trio.as_safe_channel
    async def stream(self, cursor: str):  # type: ignore[no-untyped-def]
        for p in range(self.pages):
            first = p * self.size + 1
            records: tuple[Record, ...] = tuple(
                self.synthetic.record(i) for i in range(first, first + self.size)
            )
            yield Batch(records, through=str(int(records[-1].paging_token) + 1))


async def test_the_ingestor_commits_a_large_batch_in_paced_parts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A commit takes 10 us a record (20 us once 12,000 are in); budget 50 ms: the parts grow
    while they take at most 25 ms, and shrink at once when commits slow down. Every part
    continues from the cursor the one before it wrote; each batch's read-through cursor is
    committed with its last part."""
    control_send, control_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[CommitCursor](0)
    elector_send, _elector_recv = trio.open_memory_channel[ElectorInput](4)
    ingestor = Ingestor(
        _BigBatches(pages=4, size=6000), "n", control_recv, writer_send, elector_send,  # type: ignore[arg-type]
        structlog.get_logger(),
    )  # fmt: skip
    ingestor.pace = CommitPace(budget=0.05)
    seen: list[tuple[str | None, int, str]] = []
    per_record = [10e-6]
    all_in = trio.Event()

    async def writer() -> None:
        async for msg in writer_recv:
            await trio.sleep(len(msg.records) * per_record[0])
            seen.append((msg.previous_cursor, len(msg.records), msg.cursor))
            msg.reply.send_nowait(CursorCommitted(msg.token, msg.cursor, len(msg.records)))
            if sum(n for _, n, _ in seen) >= 12_000:
                per_record[0] = 20e-6  # the sink slows down: 4,000 records now take 80 ms
            if sum(n for _, n, _ in seen) == 24_000:
                all_in.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(ingestor.run)
        nursery.start_soon(writer)
        await control_send.send(LeaseGranted(1, trio.current_time() + 600.0, "0", None))
        with trio.fail_after(60):
            await all_in.wait()
        nursery.cancel_scope.cancel()
    sizes = [n for _, n, _ in seen]
    # page 1: 1,000 (10 ms) and 2,000 (20 ms) double the limit, the rest is 3,000; page 2: 4,000
    # (40 ms: within the budget, not within half) and the rest; then 4,000 take 80 ms: cut to
    # what fits with a fifth to spare, 2,000, which take 40 ms from then on.
    assert sizes == [1000, 2000, 3000, 4000, 2000, 4000, 2000, 2000, 2000, 2000]
    previous: str | None = None
    for prev, _, cursor in seen:
        assert prev == previous
        previous = cursor
    synthetic = SyntheticSource()
    ends = [cursor for _, _, cursor in seen]
    for p in range(1, 5):  # each page's read-through cursor, one past its last record
        assert str(int(synthetic.token_of(p * 6000)) + 1) in ends
