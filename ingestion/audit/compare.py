"""The audit's judgement, pure: what a job's store must hold for some ledgers against what it holds.

The expectation is a mapping from event id to the record's text as the job commits it (recomputed
from an independent source: the data lake, :mod:`ingestion.audit.expect`); the store's side is
every row it holds for those ledgers, wherever it lies (the job's own rows and its backfill ranges'
rows, ``JOB~FIRST-LAST``). :func:`compare` names every difference, one :class:`Finding` each:

- ``missing``: an expected id that no row holds;
- ``extra``: a row whose id is not expected (no such event, or one the job's filters or watch list
  leave out);
- ``duplicated``: an id held by more than one row (every row named);
- ``differing``: a row whose record is not the expected one (compared as JSON values, so a
  store's own spelling of the same value is no difference; the members that differ are named).

A row is judged once: a duplicated id whose rows also differ is both ``duplicated`` and, for each
copy that differs, ``differing``. The findings come in id order, so two audits of the same store
say the same thing in the same words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

KINDS = ("missing", "extra", "duplicated", "differing")
SHOWN = 80  # characters of a differing member's values shown in a finding


@attrs.frozen
class StoredRow:
    """One record as the store holds it: the job (or backfill range) it lies under, where there
    (a PostgreSQL ``seq``, a Redis stream entry id), its id (paging token) and its text."""

    job: str
    at: str
    paging_token: str
    record: str

    @property
    def where(self) -> str:
        return f"{self.job} {self.at}"


@attrs.frozen
class Finding:
    kind: str  # one of KINDS
    id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.id}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "id": self.id, "detail": self.detail}


@attrs.frozen
class Tally:
    """What one comparison (one window of ledgers) saw."""

    expected: int
    stored: int
    findings: tuple[Finding, ...]
    aside: int = 0  # rows set aside by a seam (ingestion/audit/seams.py), not compared


def compare(expected: Mapping[str, str], stored: Iterable[StoredRow]) -> Tally:
    """Every difference between ``expected`` (id -> the record's text as committed) and the
    ``stored`` rows (see the module docstring)."""
    by_id: dict[str, list[StoredRow]] = {}
    count = 0
    for row in stored:
        by_id.setdefault(row.paging_token, []).append(row)
        count += 1
    findings: list[Finding] = []
    for id_ in sorted(expected.keys() | by_id.keys()):
        rows = by_id.get(id_, [])
        want = expected.get(id_)
        if not rows:
            findings.append(Finding("missing", id_, "in the source, not in the store"))
            continue
        if want is None:
            places = ", ".join(r.where for r in rows)
            findings.append(Finding("extra", id_, f"in the store ({places}), not in the source for this job"))
            continue
        if len(rows) > 1:
            places = ", ".join(r.where for r in rows)
            findings.append(Finding("duplicated", id_, f"{len(rows)} rows: {places}"))
        for row in rows:
            if row.record != want:
                what = differences(want, row.record)
                if what:
                    findings.append(Finding("differing", id_, f"{row.where}: {what}"))
    return Tally(len(expected), count, tuple(findings))


def differences(expected: str, stored: str) -> str:
    """How ``stored`` differs from ``expected`` ("" when they are the same JSON value): the
    members that differ, each with both values (cut to :data:`SHOWN` characters)."""
    try:
        want, got = json.loads(expected), json.loads(stored)
    except ValueError:
        return f"not the same text ({_cut(stored)!s} where {_cut(expected)!s} was expected)"
    if want == got:
        return ""
    if not (isinstance(want, dict) and isinstance(got, dict)):
        return f"{_cut(got)} where {_cut(want)} was expected"
    parts = []
    for key in sorted(want.keys() | got.keys()):
        if key not in got:
            parts.append(f"{key} absent (expected {_cut(want[key])})")
        elif key not in want:
            parts.append(f"{key} not expected ({_cut(got[key])})")
        elif want[key] != got[key]:
            parts.append(f"{key} is {_cut(got[key])}, expected {_cut(want[key])}")
    return "; ".join(parts)


def _cut(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


@attrs.frozen
class Report:
    """An audit's outcome over ledgers ``first..last``: equal when there is no finding."""

    job: str
    first: int
    last: int
    expected: int
    stored: int
    findings: tuple[Finding, ...]
    jobs: tuple[str, ...] = ()  # the store's jobs read: the job's and its backfill ranges'
    source: str = "the lake"  # where the expectation came from
    seams: tuple[str, ...] = ()  # a cursor reset's seam, described (ingestion/audit/seams.py)

    @property
    def equal(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        return {k: sum(1 for f in self.findings if f.kind == k) for k in KINDS}

    def summary(self) -> str:
        head = (
            f"job {self.job}, ledgers {self.first}..{self.last}: {self.expected} records expected "
            f"from {self.source}, {self.stored} rows in the store ({len(self.jobs)} jobs: "
            f"{', '.join(self.jobs) or 'none'})"
        )
        seams = "".join(f"\n  {s}" for s in self.seams)
        if self.equal:
            return f"{head}: equal{seams}"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items() if n)
        return f"{head}: NOT equal: {counts}{seams}\n  " + "\n  ".join(map(str, self.findings))

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job, "first_ledger": self.first, "last_ledger": self.last,
            "source": self.source, "expected": self.expected, "stored": self.stored, "jobs": list(self.jobs),
            "equal": self.equal, "counts": self.counts(), "findings": [f.to_json() for f in self.findings],
            "seams": list(self.seams),
        }  # fmt: skip


def merge(
    job: str, first: int, last: int, tallies: Sequence[Tally], jobs: Sequence[str], source: str = "the lake",
    seam: Any = None, start: str = "",
) -> Report:
    """One report of the windows' tallies (their findings in id order: windows ascend); ``seam``
    (a :class:`~ingestion.audit.seams.Seam`) described with the rows it set aside."""
    seams = () if seam is None else (seam.describe(start, sum(t.aside for t in tallies)),)
    return Report(
        job, first, last, sum(t.expected for t in tallies), sum(t.stored for t in tallies),
        tuple(f for t in tallies for f in t.findings), tuple(jobs), source, seams,
    )  # fmt: skip
