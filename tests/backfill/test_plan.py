"""A backfill's plan and progress (pure), the range cut of its source, and the span checks."""

from __future__ import annotations

import itertools

import attrs
import pytest

from actors.source import Batch, Record, Watermark
from ingestion.backfill.bounded import BoundedSource
from ingestion.backfill.checks import missing_objects, overlap_problem
from ingestion.backfill.plan import (
    Plan,
    ledger_of_cursor,
    range_name,
    range_states,
    split,
)
from ingestion.lake.keys import LakeSchema
from ingestion.rpc.protocol import Cursor


def test_a_span_splits_into_consecutive_ranges_of_near_equal_size() -> None:
    assert split(10, 19, 3) == [(10, 13), (14, 16), (17, 19)]
    assert split(5, 6, 4) == [(5, 5), (6, 6)]  # no empty range
    assert split(7, 7, 1) == [(7, 7)]
    for first, last, k in ((1, 1000, 7), (100, 163, 64), (3, 50, 50)):
        ranges = split(first, last, k)
        assert ranges[0][0] == first and ranges[-1][1] == last
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
        sizes = [b - a + 1 for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="below --from"):
        split(10, 9, 2)
    with pytest.raises(ValueError, match="at least 1"):
        split(1, 9, 0)


def test_range_names_carry_their_job_and_bounds() -> None:
    assert range_name("ops~x", 10, 20) == "ops~x~10-20"
    plan = Plan("j", 1, 9, 2)
    assert plan.names == ["j~1-5", "j~6-9"]
    assert Plan.from_hash("j", plan.to_hash()) == plan
    assert Plan.from_hash("j", {"first": "1"}) is None
    assert Plan.from_hash("j", {**plan.to_hash(), "state": "odd"}) is None
    assert plan.same_work(Plan("j", 1, 9, 2, "cancelled")) and not plan.same_work(Plan("j", 1, 9, 3))


def test_progress_counts_ledgers_and_the_complete_prefix() -> None:
    plan = Plan("j", 100, 111, 3)  # 100-103, 104-107, 108-111
    through = lambda ledger: str(Cursor.through(ledger))  # noqa: E731
    inside = str(Cursor(106, 1, 0, 0))  # an event of ledger 106: 105 is complete, 106 is not
    p = range_states(plan, [through(103), inside, through(109)], [True, False, False], ["", "a", "b"])
    assert [r.ledgers_done for r in p.ranges] == [4, 2, 2]
    assert p.ledgers_done == 8 and p.total == 12 and not p.finished
    assert p.complete_through == 105  # range 1 done, range 2 through 105; range 3 waits behind it
    assert p.running == 2 and p.by_node() == {"a": 1, "b": 1}
    fresh = range_states(plan, [None, "104", None], [False, False, False], ["", "", ""])
    assert fresh.ledgers_done == 0 and fresh.complete_through == 99
    done = range_states(plan, [through(103), through(107), through(111)], [True] * 3, [""] * 3)
    assert done.finished and done.complete_through == 111 and done.ledgers_done == 12
    assert ledger_of_cursor(None) is None and ledger_of_cursor("0") is None
    assert ledger_of_cursor("104") == 103  # a start ledger: nothing of it read yet


def batch(*ledgers: int, through: int | None = None) -> Batch:
    records = tuple(Record(str(Cursor(ledger, 1, 0, i)), "{}") for ledger in ledgers for i in (1, 2))
    return Batch(records, through=None if through is None else str(Cursor.through(through)))


def test_a_range_source_passes_batches_on_until_one_reaches_past_its_last_ledger() -> None:
    source = BoundedSource(inner=None, last=10, store=None, name="j~1-10")  # type: ignore[arg-type]
    before = batch(8, 9, through=9)
    assert source.cut(before) == (before, False)
    unscanned = batch(10)  # records of ledger 10, the ledger not scanned through yet
    assert source.cut(unscanned) == (unscanned, False)
    final, last = source.cut(batch(10, 11, 12, through=12))
    assert last and final.through == str(Cursor.through(10))
    assert [Cursor.parse(r.paging_token).ledger for r in final.records] == [10, 10]
    empty, last = source.cut(batch(11, through=11))
    assert last and empty.records == () and empty.through == str(Cursor.through(10))
    # (issue 49) the range is complete through its last ledger, not the ledgers read past it
    marked = attrs.evolve(batch(10, 11, 12, through=12), watermark=Watermark(12))
    assert source.cut(marked)[0].watermark == Watermark(10)
    assert source.cut(attrs.evolve(before, watermark=Watermark(9)))[0].watermark == Watermark(9)


def test_the_span_checks_name_missing_objects_and_an_overlap() -> None:
    schema = LakeSchema(ledgers_per_file=2, files_per_partition=4)
    held = {schema.partition(10): [schema.file_name(10), schema.file_name(14, "zstd")]}
    missing = missing_objects(schema, 10, 15, lambda part: held.get(part, []))
    assert missing == [schema.object_key(12)]  # 14 is there under another extension
    assert overlap_problem("j", 10, 20, None) is None
    assert overlap_problem("j", 10, 20, (21, 40)) is None
    line = overlap_problem("j", 10, 25, (21, 40))
    assert line is not None and "give --to 20" in line
    assert overlap_problem("j", 50, 60, (21, 40)) is not None  # the live job will get there itself


def test_the_first_progress_line_says_nothing_is_complete_yet_not_the_ledger_before_the_span() -> None:
    from ingestion.cli.backfill import _summary

    plan = Plan("hist", 50_000_000, 50_000_363, 4)
    start = range_states(plan, [None] * 4, [False] * 4, [""] * 4)
    line = _summary(start)
    assert "49999999" not in line and "no ledger complete yet" in line, line
    assert "leading: none" not in line and "no range led yet" in line, line
    going = range_states(plan, ["50000010", None, None, None], [False] * 4, ["n1", "n2", "", ""])
    assert "complete through ledger 50000009; leading: n1=1, n2=1" in _summary(going)
