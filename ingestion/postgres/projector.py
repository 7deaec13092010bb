"""An example of fenced job code: a projector that keeps per-account payment totals from a
Horizon job's records in PostgreSQL (``/payments``), run as a scheduled job under the election.

Each run is one fenced transaction (``term.fenced(fence)``): it reads the rows of the source job
after the projector's progress, adds each ``payment`` to its receiving account's total and moves
the progress to the last row's ``seq`` and paging token, all or nothing. So a run is idempotent
by paging token (a run repeated after a failover starts from the committed progress), and a
stale leader's run changes nothing (:class:`~ingestion.postgres.fence.FenceRejected`).

Configured by the environment of the node: ``INGESTION_SINK_URL`` (the sink),
``INGESTION_PROJECTOR_SOURCE`` (the Horizon job, default ``horizon``) and the projector's own
job name ``INGESTION_PROJECTOR_JOB`` (default ``payment-totals``): ``[jobs.payment-totals] kind =
"scheduled"``, ``action = "ingestion.postgres.projector:payment_totals"``.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

from actors.scheduled import Action
from actors.source import TermContext
from ingestion.postgres import sql
from ingestion.postgres.fence import PostgresFence

BATCH = 1000  # rows per run at most


def projector(url: str, source_job: str, job: str, schema: str = "ingestion") -> Action:
    """The action: ``await action(run, term)`` projects up to :data:`BATCH` new rows."""
    fence = PostgresFence(url, job, schema=schema, call_timeout=5.0)
    q = sql.quoted(schema)

    async def action(run: int, term: TermContext) -> dict[str, Any]:
        async with term.fenced(fence) as tx:
            await tx.execute(
                f"CREATE TABLE IF NOT EXISTS {q}.payment_totals (account text PRIMARY KEY, "
                "total numeric NOT NULL, payments bigint NOT NULL)"
            )
            await tx.execute(
                f"CREATE TABLE IF NOT EXISTS {q}.projector_progress (projector text PRIMARY KEY, "
                "seq bigint NOT NULL, paging_token text NOT NULL)"
            )
            done = await tx.execute(
                f"SELECT seq FROM {q}.projector_progress WHERE projector = %s", (job,)
            )
            after = int(done[0][0]) if done else 0
            rows = await tx.execute(
                f"SELECT seq, paging_token, record->>'type', record->>'to', record->>'amount' "
                f"FROM {q}.events WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
                (source_job, after, BATCH),
            )
            totals: dict[str, tuple[Decimal, int]] = {}
            for _seq, _pt, kind, to, amount in rows:
                if kind == "payment" and to and amount:
                    total, count = totals.get(to, (Decimal(0), 0))
                    totals[to] = (total + Decimal(amount), count + 1)
            for account, (total, count) in totals.items():
                await tx.execute(
                    f"INSERT INTO {q}.payment_totals VALUES (%s, %s, %s) ON CONFLICT (account) DO "
                    "UPDATE SET total = payment_totals.total + excluded.total, "
                    "payments = payment_totals.payments + excluded.payments",
                    (account, total, count),
                )
            if rows:
                await tx.execute(
                    f"INSERT INTO {q}.projector_progress VALUES (%s, %s, %s) ON CONFLICT (projector) "
                    "DO UPDATE SET seq = excluded.seq, paging_token = excluded.paging_token",
                    (job, rows[-1][0], rows[-1][1]),
                )
        return {"rows": len(rows), "accounts": len(totals), "through": rows[-1][1] if rows else None}

    return action


async def payment_totals(run: int, term: TermContext) -> dict[str, Any]:
    """The configured projector (see the module docstring)."""
    global _configured
    if _configured is None:
        _configured = projector(
            os.environ["INGESTION_SINK_URL"],
            os.environ.get("INGESTION_PROJECTOR_SOURCE", "horizon"),
            os.environ.get("INGESTION_PROJECTOR_JOB", "payment-totals"),
            os.environ.get("INGESTION_SINK_SCHEMA", "ingestion"),
        )
    return await _configured(run, term)


_configured: Action | None = None
