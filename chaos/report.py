"""The campaign's verdict: what it did and what the judge found (:class:`Report`), as text for a
person and as JSON for a file (:func:`write_json`, with every node's log line beside it)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from chaos import check
from ingestion.testing.cluster import EventLog


@attrs.define
class Report:
    """What the campaign did and what the judge found."""

    seed: int
    seconds: float
    bound: float
    faults: list[check.FaultWindow] = attrs.Factory(list)
    skipped_kinds: dict[str, str] = attrs.Factory(dict)
    skipped_faults: list[str] = attrs.Factory(list)  # drawn but not injected, and why
    jobs: dict[str, dict[str, Any]] = attrs.Factory(dict)
    violations: list[str] = attrs.Factory(list)
    counts: dict[str, int] = attrs.Factory(dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "seconds": self.seconds, "bound_s": round(self.bound, 3),
            "ok": self.ok, "faults": len(self.faults),
            "by_kind": _by_kind(self.faults), "skipped_kinds": self.skipped_kinds,
            "skipped_faults": self.skipped_faults,
            "jobs": self.jobs, "counts": self.counts, "violations": self.violations,
            "fault_list": [
                {"kind": f.kind, "target": f.target, "start": round(f.start, 3), "end": round(f.end, 3),
                 "jobs": sorted(f.jobs), "detail": f.detail}
                for f in self.faults
            ],
        }  # fmt: skip

    def text(self) -> str:
        lines = [
            f"chaos: seed {self.seed}, {self.seconds:.0f} s, {len(self.faults)} faults, "
            f"B = {self.bound:.1f} s"
        ]
        lines += [
            f"  {f.start:8.2f}..{f.end:8.2f}  {f.kind:<19} {f.target:<14} {f.detail}" for f in self.faults
        ]
        lines.append("by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(_by_kind(self.faults).items())))
        for kind, why in sorted(self.skipped_kinds.items()):
            lines.append(f"skipped: {kind}: {why}")
        if self.skipped_faults:
            first = self.skipped_faults[0]
            lines.append(f"drawn but not injected: {len(self.skipped_faults)} (the first: {first})")
        for job, j in self.jobs.items():
            lines.append(
                f"{job}: {j.get('records', 0)} records, {j.get('terms', 0)} terms; longest without a "
                f"commit {j.get('longest_no_commit_s', 0):.1f} s "
                f"(fault-free {j.get('longest_fault_free_no_commit_s', 0):.1f} s), "
                f"longest leaderless {j.get('longest_leaderless_s', 0):.1f} s, against B {self.bound:.1f} s; "
                + str(j.get("summary", ""))
            )
        lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))
        if self.ok:
            lines.append(
                f"chaos: PASSED (seed {self.seed}): 0 lost, 0 duplicated, 0 stale writes, liveness within B"
            )
        else:
            lines.append(f"chaos: FAILED (seed {self.seed}), {len(self.violations)} violations; the first:")
            lines += [f"  {v}" for v in self.violations[:20]]
        return "\n".join(lines)


def _by_kind(faults: Sequence[check.FaultWindow]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in faults:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out


def write_json(
    report: Report, path: str | os.PathLike[str], log: EventLog | None = None, t0: float = 0.0
) -> None:
    """The summary at ``path``; with ``log``, every node's log line beside it (``PATH.log``,
    JSON lines, ``t`` on the campaign's clock)."""
    Path(path).write_text(json.dumps(report.as_json(), indent=1) + "\n")
    if log is not None:
        with open(f"{path}.log", "w") as f:
            for e in log.lines:
                f.write(
                    json.dumps({"t": round(e.at - t0, 3), "process": e.node, "event": e.event, **e.fields})
                    + "\n"
                )
            for process, text in log.raw:  # what was not a log line (a traceback, say), at the end
                f.write(json.dumps({"process": process, "raw": text}) + "\n")
