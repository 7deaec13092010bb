"""A cursor reset's seam as the audit reads it (ingestion/audit/seams.py, pure): the job's rows
before the move set aside, the records before the cursor it was moved to not expected."""

from __future__ import annotations

from ingestion.audit.compare import StoredRow, compare
from ingestion.audit.seams import Seam, latest_seam, split


def event_id(ledger: int, n: int = 1) -> str:
    return f"{ledger << 32:019d}-{n:010d}"


def test_the_rows_before_the_last_cursor_reset_are_set_aside_and_named() -> None:
    entries = [
        ("1700000000000-0", {"event": "history-gap", "cursor": "1"}),
        ("1700000001000-0", {"event": "cursor-reset", "seam": "entry 5-0", "from": "a", "to": "", "by": "x"}),
        (
            "1700000002000-0",
            {
                "event": "cursor-reset",
                "seam": "entry 9-1",
                "from": "b",
                "to": "",
                "by": "cli o@h",
                "token": "7",
            },
        ),
    ]
    seam = latest_seam(entries)
    assert seam is not None and seam.at == "entry 9-1" and seam.token == "7"
    old = [
        StoredRow("j", "entry 3-0", event_id(2), '{"old":1}'),
        StoredRow("j", "entry 9-1", event_id(3), "{}"),
    ]
    new = [
        StoredRow("j", "entry 9-2", event_id(2), '{"new":1}'),
        StoredRow("j", "entry 10-0", event_id(3), "{}"),
    ]
    ranged = [StoredRow("j~1-2", "entry 1-0", event_id(1), "{}")]  # a backfill range's: not the job's own
    expected = {event_id(1): "{}", event_id(2): '{"new":1}', event_id(3): "{}"}
    wanted, kept, aside = split(seam, "j", "0", expected, old + new + ranged)
    assert aside == 2 and kept == new + ranged and wanted == expected
    assert compare(wanted, kept).findings == ()
    assert compare(expected, old + new + ranged).findings != ()  # without the seam: duplicated, differing
    line = seam.describe("0", aside)
    assert line.startswith(
        "seam: cursor reset at 2023-11-14T22:13:22Z by cli o@h (token 7) from b to its start_cursor"
    )
    assert "2 rows committed before it (entry 9-1)" in line


def test_nothing_before_the_cursor_the_job_was_moved_to_is_expected() -> None:
    moved = Seam("seq 4", "x", event_id(5, 2), "o", "3", "1-0")
    expected = {event_id(5, 1): "{}", event_id(5, 2): "{}", event_id(6): "{}"}
    wanted, _kept, _aside = split(moved, "j", "0", expected, [])
    assert list(wanted) == [event_id(6)]
    at_start = Seam("seq 4", "x", "", "o", "3", "1-0")  # moved to the job's start_cursor: a ledger
    assert list(split(at_start, "j", "6", expected, [])[0]) == [event_id(6)]
    assert split(at_start, "j", "0", expected, [])[0] == expected
    pg = [StoredRow("j", "seq 4", event_id(5, 1), "{}"), StoredRow("j", "seq 5", event_id(6), "{}")]
    assert split(moved, "j", "0", {}, pg)[1:] == ([pg[1]], 1)
