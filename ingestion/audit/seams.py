"""The seam an operator's cursor move leaves in a job's store (``ingestion cursor reset``, after a
network reset), as the audit reads it: pure.

After a reset of its network a job's store holds the rows of the chain before (committed up to
the reset) and then those of the new chain, whose ledgers start again at 1: the same ledgers, the
same ids, other records. The source the audit reads again serves only the new chain, so the rows
before the move are not a store's fault but the other chain's. The move's ``cursor-reset`` entry
in the job's audit stream says where they end (``seam``: the last events-stream entry, ``entry
ID``, or the sink's last row, ``seq N``, before the move) and where the job resumed (``to``: a
cursor, or "" for its ``start_cursor``). The audit sets the job's rows at or before the seam
aside (counted, named in the report, not compared) and expects nothing at or before the cursor
the job was moved to (it was moved past those records), and says so instead of reporting the
chain before as missing or differing records.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

import attrs

from ingestion.audit.compare import StoredRow
from ingestion.common.paging import InvalidPagingToken, token_key


def _place(at: str) -> tuple[str, tuple[int, ...]] | None:
    """``entry 1700000000000-3`` or ``seq 42`` as (kind, a sortable key); None: neither."""
    kind, _, where = at.partition(" ")
    try:
        if kind == "entry":
            ms, _, n = where.partition("-")
            return kind, (int(ms), int(n or 0))
        if kind == "seq":
            return kind, (int(where),)
    except ValueError:
        return None
    return None


@attrs.frozen
class Seam:
    """One ``cursor-reset`` entry of the job's audit stream (see the module docstring)."""

    at: str  # where the job's rows before the move end ("" : it had none)
    before: str  # the cursor before the move
    to: str  # the cursor after it ("" : the job's start_cursor)
    by: str
    token: str
    entry: str  # the audit entry's id (its time)

    @classmethod
    def of(cls, entry: str, fields: Mapping[str, str]) -> Seam | None:
        """The seam of an audit entry (None: not a ``cursor-reset``)."""
        if fields.get("event") != "cursor-reset":
            return None
        return cls(fields.get("seam", ""), fields.get("from", ""), fields.get("to", ""),
                   fields.get("by", ""), fields.get("token", ""), entry)  # fmt: skip

    def precedes(self, job: str, row: StoredRow) -> bool:
        """Whether ``row`` is one of ``job``'s own rows committed before the move."""
        seam, place = _place(self.at), _place(row.at)
        return (
            row.job == job
            and seam is not None
            and place is not None
            and place[0] == seam[0]
            and place <= seam
        )

    def resumes_after(self, start: str) -> tuple[int, ...] | None:
        """The position the job was moved to (its ``start_cursor`` ``start`` for none), as a
        paging-token key; None when it starts from the beginning or the position is not known."""
        cursor = self.to or start
        if cursor in ("", "0", "now"):
            return None
        if not self.to and cursor.isdigit() and int(cursor) < 1 << 31:
            return (((int(cursor) << 32) - 1),)  # a start_cursor that names a ledger: from its first event
        try:
            return token_key(cursor)
        except InvalidPagingToken:
            return None

    def describe(self, start: str, aside: int) -> str:
        ms = _place(f"entry {self.entry}")
        when = (
            datetime.datetime.fromtimestamp(ms[1][0] / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if ms is not None else self.entry
        )  # fmt: skip
        to = self.to or f"its start_cursor ({start or '?'})"
        unknown = " (now: records before its first row after the move may show as missing)" if (
            not self.to and start == "now"
        ) else ""  # fmt: skip
        return (
            f"seam: cursor reset at {when} by {self.by or '?'} (token {self.token or '?'}) from "
            f"{self.before or 'none'} to {to}{unknown}: {aside} rows committed before it "
            f"({self.at or 'none'}) are of the chain before the reset, set aside, not compared"
        )


def latest_seam(entries: Iterable[tuple[str, Mapping[str, str]]]) -> Seam | None:
    """The last ``cursor-reset`` of a job's audit stream (its entries in order)."""
    found = None
    for entry, fields in entries:
        seam = Seam.of(entry, fields)
        if seam is not None:
            found = seam
    return found


def split(
    seam: Seam | None, job: str, start: str, expected: Mapping[str, str], stored: list[StoredRow]
) -> tuple[dict[str, str], list[StoredRow], int]:
    """``expected`` and ``stored`` with what the seam sets aside taken out, and how many rows
    it set aside."""
    if seam is None:
        return dict(expected), stored, 0
    kept = [row for row in stored if not seam.precedes(job, row)]
    after = seam.resumes_after(start)
    wanted = dict(expected)
    if after is not None:
        wanted = {i: text for i, text in expected.items() if _after(i, after)}
    return wanted, kept, len(stored) - len(kept)


def _after(paging_token: str, position: tuple[int, ...]) -> bool:
    try:
        return token_key(paging_token) > position
    except InvalidPagingToken:
        return True
