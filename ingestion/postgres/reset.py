"""An operator's move of a job's cursor in the PostgreSQL sink (``ingestion cursor reset``, after a
network reset), fenced like a term: blocking, one transaction on a connection of its own.

The token comes from Redis first (``cursor_reserve.lua``: refused while a node leads the job, else
the counter moves on), then, in one transaction on the job's fence row (locked, as ``open_term``
and ``commit_batch`` lock it): refused when the fence already holds that token or a higher one (a
term began since: it resumes from the cursor it read), or, with ``expected``, when the cursor is
not that one; else the fence rises to the token (a term from before is refused ``stale-token`` at
its next commit), the raise is recorded in ``terms`` (the fence's history, as a term's), and the
cursor is set with its completeness watermark cleared (or the row removed: the job starts again
at its ``start_cursor``).
"""

from __future__ import annotations

import attrs

from ingestion.postgres import sql
from ingestion.postgres.connection import connect


@attrs.frozen
class SinkReset:
    """What the move did: ``moved``, the cursor ``before`` (None: none), the job's last ``seq``
    before it (the seam), or why it was refused (``refused``: ``stale-token`` or
    ``cursor-moved``, ``detail`` the fence's token or the cursor)."""

    moved: bool
    before: str | None = None
    last_seq: int = 0
    refused: str = ""
    detail: str = ""


def reset_cursor(
    url: str, schema: str, job: str, token: int, by: str, to: str, expected: str, timeout: float = 10.0
) -> SinkReset:
    """Move ``job``'s cursor to ``to`` ("" : remove it) under ``token`` (see the module docstring).

    Raises:
        psycopg.Error: the sink cannot be reached or the statement failed (nothing moved).
    """
    s = sql.quoted(schema)
    with connect(url, timeout, "ingestion-cursor") as conn, conn.transaction():
        conn.execute(
            f"INSERT INTO {s}.fences (job, token) VALUES (%s, 0) ON CONFLICT (job) DO NOTHING", (job,)
        )  # type: ignore[arg-type]
        row = conn.execute(f"SELECT token FROM {s}.fences WHERE job = %s FOR UPDATE", (job,)).fetchone()  # type: ignore[arg-type]
        fence = int(row[0]) if row else 0
        found = conn.execute(f"SELECT cursor FROM {s}.cursors WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
        before = None if found is None else str(found[0])
        if fence >= token:
            return SinkReset(False, before, refused="stale-token", detail=str(fence))
        if expected and before != expected:
            return SinkReset(False, before, refused="cursor-moved", detail=before or "")
        last = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {s}.events WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
        last_seq = int(last[0]) if last else 0
        conn.execute(f"UPDATE {s}.fences SET token = %s, node = %s WHERE job = %s", (token, by, job))  # type: ignore[arg-type]
        conn.execute(
            f"INSERT INTO {s}.terms (job, token, after_seq) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",  # type: ignore[arg-type]
            (job, token, last_seq),
        )
        if to:
            conn.execute(
                f"INSERT INTO {s}.cursors (job, cursor, token) VALUES (%s, %s, %s) "  # type: ignore[arg-type]
                "ON CONFLICT (job) DO UPDATE SET cursor = excluded.cursor, token = excluded.token, "
                "complete_through = NULL, complete_held = NULL",
                (job, to, token),
            )
        else:
            conn.execute(f"DELETE FROM {s}.cursors WHERE job = %s", (job,))  # type: ignore[arg-type]
        return SinkReset(True, before, last_seq)
