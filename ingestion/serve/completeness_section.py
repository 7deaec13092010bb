"""A job's completeness watermark on its console page (issue 49; docs/RELIABILITY.md, "The
completeness watermark"): the ledger through which every record of its source is committed, and
why a known gap holds it there for good. Read with the job's cursor (the same hash, the same
round trip: the job's state, ``actors/lease_store/state.py``). Pure: the job's fields in, HTML
out, every value escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def completeness_section(job: Mapping[str, Any]) -> str:
    """One line: complete through which ledger, and why it is held; empty for a job whose
    source says nothing of it (a webhook job, or nothing committed yet)."""
    through = job.get("complete_through")
    if through is None:
        return ""
    held = job.get("complete_held") or ""
    why = f" Held there for good: {html.escape(held, quote=True)}." if held else ""
    return (
        f'<p id="complete">Complete through ledger <span id="complete-through">{int(through)}</span>: '
        f"every record of the source up to it is committed.{why}</p>"
    )
