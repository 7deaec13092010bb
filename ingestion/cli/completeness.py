"""How complete a job's data is, as ``inspect`` shows it (issue 49): its completeness watermark
(``complete_through``: every record its source holds for ledgers up to that one is committed;
``complete_held``: why a known gap holds it there for good), and the records committed with a
``decodeError`` member (records that could not be decoded, committed as sent: never lost, never
a halt), looked for among the job's newest records only, so that ``inspect`` stays one bounded
read however long the job's history is.
"""

from __future__ import annotations

import json
from typing import Any

from actors.lease_store import JobState, LeaseStore, job_keys

DECODE_ERROR = '"decodeError":'
LOOKED_AT = 10_000  # the newest records looked through for decode errors
SHOWN = 10  # decode errors listed, newest first
PAGE = 1_000  # records read from the events stream per call


def watermark_text(state: JobState) -> str:
    """``ledger L``, ``ledger L, held: why``, or why there is none."""
    if state.complete_through is None:
        return "(none committed: the source does not say, or nothing committed yet)"
    held = f" (held for good: {state.complete_held})" if state.complete_held else ""
    return f"ledger {state.complete_through}{held}"


def _decode_error(record: str) -> str:
    try:
        doc = json.loads(record)
    except ValueError:
        return "?"
    return str(doc.get("decodeError", "?")) if isinstance(doc, dict) else "?"


async def redis_decode_errors(
    store: LeaseStore, looked_at: int = LOOKED_AT, shown: int = SHOWN
) -> list[dict[str, Any]]:
    """The newest records of the job's events stream that carry a ``decodeError`` (``id``,
    ``paging_token``, ``decode_error``), among its newest ``looked_at``, at most ``shown``; one
    bounded call per page.

    Raises:
        RedisUnavailable: a page could not be read.
    """
    key = job_keys(store.job)["events"]
    found: list[dict[str, Any]] = []
    top, looked = "+", 0
    while looked < looked_at and len(found) < shown:
        count = min(PAGE, looked_at - looked)
        entries: list[tuple[str, dict[str, str]]] = await store.run(
            store.client.xrevrange,  # type: ignore[arg-type]
            key, top, "-", count,
        )  # fmt: skip
        for entry_id, fields in entries:
            record = fields.get("record", "")
            if DECODE_ERROR in record and len(found) < shown:
                found.append({"id": entry_id, "paging_token": fields.get("paging_token"),
                              "decode_error": _decode_error(record)})  # fmt: skip
        looked += len(entries)
        if len(entries) < count:
            break
        top = "(" + entries[-1][0]
    return found


def postgres_decode_errors(
    url: str, schema: str, job: str, timeout: float, looked_at: int = LOOKED_AT, shown: int = SHOWN
) -> list[dict[str, Any]]:
    """As :func:`redis_decode_errors`, from the job's rows in a PostgreSQL sink (``seq`` instead
    of ``id``): one statement, bounded by ``timeout`` there (blocking: run it in a thread).

    Raises:
        psycopg.Error: the sink did not answer or refused.
    """
    from ingestion.postgres import sql  # lazy: CLI start-up (~2 ms)
    from ingestion.postgres.connection import connect  # lazy: CLI start-up (psycopg, ~140 ms)

    q = sql.quoted(schema)
    with connect(url, timeout, "ingestion-read") as conn:
        rows = conn.execute(
            f"SELECT e.seq, e.paging_token, e.record::text FROM {q}.events e WHERE e.job = %s "  # type: ignore[arg-type]
            f"AND e.seq > (SELECT coalesce(max(m.seq), 0) FROM {q}.events m WHERE m.job = %s) - %s "
            "AND strpos(e.record::text, %s) > 0 ORDER BY e.seq DESC LIMIT %s",
            (job, job, looked_at, DECODE_ERROR, shown),
        ).fetchall()
    return [{"seq": int(s), "paging_token": p, "decode_error": _decode_error(r)} for s, p, r in rows]


def decode_errors_text(found: list[dict[str, Any]]) -> list[str]:
    """The table's lines for the records with a decode error (none: no line at all)."""
    if not found:
        return []
    lines = ["", f"records committed with a decodeError (newest first, among the newest {LOOKED_AT}):"]
    for f in found:
        where = f"seq {f['seq']}" if "seq" in f else f["id"]
        lines.append(f"  {where}  {f['paging_token']}  {f['decode_error']}")
    return lines
