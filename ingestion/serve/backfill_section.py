"""A job's backfill on its console page (docs/BACKFILL.md): the plan's state and progress, then
one row per range with its figures, so that a finished range is shown under its backfill rather
than as a job without a leader. The document is ``inspect --json``'s ``backfill`` (the node reads
it with :func:`ingestion.backfill.status.backfill_doc` and hands it to the console: the console
itself never reads a plan). Pure: text in, HTML out, every value escaped."""

from __future__ import annotations

import html
from typing import Any

RANGE_HEADS = ("range", "ledgers", "ledgers done", "records", "state", "led by")


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def backfill_section(doc: dict[str, Any] | None) -> str:
    """The section's HTML; empty for a job without a backfill."""
    if not doc:
        return ""
    complete = (
        f"complete through ledger {doc['complete_through']}"
        if doc["complete_through"] >= doc["first_ledger"] else "no ledger complete yet"
    )  # fmt: skip
    summary = (
        f"Ledgers {_e(doc['first_ledger'])}..{_e(doc['last_ledger'])} in {_e(doc['ranges'])} ranges: "
        f"<span id=\"backfill-state\">{_e(doc['state'])}</span>; {_e(doc['ledgers_done'])}/"
        f"{_e(doc['ledgers'])} ledgers, {_e(doc['records'])} records, {_e(complete)}; asked "
        f"{_e(doc['created_at'] or '?')} by {_e(doc['created_by'] or '?')}."
    )
    rows = "".join(
        "<tr>" + "".join(f"<td data-col=\"{c}\">{_e(v)}</td>" for c, v in (
            ("range", r["range"]), ("ledgers", f"{r['first_ledger']}..{r['last_ledger']}"),
            ("ledgers_done", f"{r['ledgers_done']}/{r['ledgers']}"), ("records", r["records"]),
            ("state", r["state"]), ("leader", r["leader"] or ""),
        )) + "</tr>"
        for r in doc["range_states"]
    )  # fmt: skip
    heads = "".join(f"<th>{_e(h)}</th>" for h in RANGE_HEADS)
    return (
        f"<h2>Backfill</h2><p>{summary}</p>"
        f"<table id=\"backfill\"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table>"
    )
