"""A Horizon job's completeness watermark, the pure rules (ingestion/horizon/completeness.py)."""

from __future__ import annotations

from actors.source import Watermark
from ingestion.common.paging import toid
from ingestion.horizon.completeness import Completeness, complete_ledger, through_cursor


def test_a_position_completes_the_ledger_before_its_own_or_its_own_at_its_last_position() -> None:
    assert complete_ledger(str(toid(100, 3, 1)), "/operations") == 99
    assert complete_ledger(f"{toid(100, 3, 1)}-2", "/effects") == 99
    assert complete_ledger(through_cursor(100), "/operations") == 100
    assert complete_ledger(str(toid(100)), "/ledgers") == 100  # one record a ledger: its own
    assert complete_ledger("now", "/operations") is None and complete_ledger("0", "/operations") is None


def test_a_look_reads_through_a_later_ledger_once() -> None:
    c = Completeness("/operations", received=str(toid(100, 1)))
    assert c.quiet(str(toid(100, 1)), 99) is None  # nothing new
    assert c.quiet("now", 120) is None  # no position
    through = c.quiet(str(toid(100, 1)), 103)
    assert through == through_cursor(103)
    c.looked_through(103)
    assert c.quiet(str(toid(100, 1)), 103) is None
    assert c.mark(through) == Watermark(103)


def test_a_skipped_gap_holds_every_batch_past_it() -> None:
    c = Completeness("/operations")
    assert c.mark(str(toid(50, 2))) == Watermark(49)
    c.hold(str(toid(50, 9)), through_cursor(79), "history gap: ledgers before 80 are gone")
    assert c.mark(str(toid(50, 9))) == Watermark(49)  # a batch from before the gap, still on its way
    held = Watermark(49, "history gap: ledgers before 80 are gone")
    assert c.mark(str(toid(80, 1))) == held and c.mark(through_cursor(90)) == held
    c.hold(str(toid(95)), through_cursor(99), "another")  # the first gap holds it
    assert c.mark(str(toid(100, 1))) == held
