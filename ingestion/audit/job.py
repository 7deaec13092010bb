"""The elected audit job (``kind = "audit"``): another job's store checked against the lake,
continuously, window by window behind that job's completeness watermark.

An audit job is a scheduled job (:class:`actors.scheduled.ScheduledJob`) whose action is an
:class:`AuditStep`. Each step, inside the leader's term:

1. reads its progress (``audited_through`` of ``ingestion:{NAME}:audited``: the last ledger it
   audited) and the audited job's bound: its watermark ``complete_through`` (Redis
   ``ingestion:{J}:cursor``, or the PostgreSQL sink's ``cursors``), or before a watermark exists
   the ledger before its cursor's (never past either: a ledger not yet complete is not judged);
2. audits the next ``window`` ledgers after its progress (the first time: from the ledger of the
   audited job's first stored row), at most through the bound, with
   :func:`ingestion.audit.runner.audit_lake` (the job's filters, decoding and watch list applied);
3. records each finding (up to :data:`FINDINGS_PER_STEP`) in its stream ``ingestion:{NAME}:findings``
   (kept to :data:`FINDINGS_MAXLEN`), then its progress, each write fenced by its token
   (``LeaseStore.fenced_audit`` and ``fenced_hset``: a stale leader's writes are refused, and it
   stops there); the run's record (the window and the counts) is committed as every scheduled
   run's is.

A leader that dies between its findings and its progress leaves the window to its successor, which
audits it again: a finding may be recorded twice, never lost. The lake or the store unreadable:
the step says so (``audit-failed``) and records nothing; the next step tries the same window.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import attrs
import psycopg
import redis
import structlog
import trio

from actors.lease_store import LeaseStore, RedisUnavailable, job_keys
from actors.scheduled import ScheduledJob
from actors.source import Batch, TermContext
from ingestion.audit.compare import KINDS, Report
from ingestion.common.keyspace import audit_keys
from ingestion.decode.stage import rule_for
from ingestion.rpc.protocol import Cursor, InvalidCursor
from ingestion.watchlist.lists import WatchUnavailable

FINDINGS_MAXLEN = 10_000  # entries kept in an audit job's findings stream (approximately)
FINDINGS_PER_STEP = 100  # findings recorded one by one per step (all are counted)
log = structlog.get_logger("ingestion.audit")


@attrs.define
class AuditStats:
    """What this node's leader of an audit job has seen (the metrics read it)."""

    ledger: int | None = None  # the last ledger audited
    findings: dict[str, int] = attrs.Factory(lambda: dict.fromkeys(KINDS, 0))


def bound_of(complete_through: int | None, cursor: str | None) -> int | None:
    """The last ledger an audit may judge: the watermark, else the ledger before the cursor's."""
    if complete_through is not None:
        return complete_through
    try:
        return Cursor.parse(cursor or "").ledger - 1
    except InvalidCursor:
        return None


def next_window(
    progress: int | None, first_row: int | None, bound: int | None, size: int
) -> tuple[int, int] | None:
    """The ledgers the next step audits, or None (nothing to audit yet)."""
    start = progress + 1 if progress is not None else first_row
    if start is None or bound is None or bound < start:
        return None
    return start, min(start + size - 1, bound)


@attrs.define
class AuditStep:
    """One step of the audit job ``name`` over ``audited`` (see the module docstring)."""

    name: str
    settings: Any  # ingestion.config.Settings
    audited: Any  # its JobSettings
    store: LeaseStore  # the audit job's (the same Redis as the audited job's)
    lake: Any  # LocalLake | S3Lake
    window: int
    stats: AuditStats = attrs.Factory(AuditStats)
    decoders: Any = None  # the term's decode workers (AuditJob), else each step opens its own
    watch: Any = None  # the audited job's watch list (a WatchSource, built by the node), or None

    async def __call__(self, run: int, term: TermContext) -> dict[str, Any]:
        keys = audit_keys(self.name)
        try:
            done = await self.store.run(self.store.client.hget, keys["audited"], "audited_through")
            progress = int(done) if done else None
            if progress is not None:
                self.stats.ledger = progress
            bound, first_row = await trio.to_thread.run_sync(self._bound_and_first)
        except (RedisUnavailable, OSError, psycopg.Error) as exc:
            return self._failed(str(exc))
        span = next_window(progress, first_row, bound, self.window)
        if span is None:
            return {"audits": self.audited.name, "audited_through": progress, "bound": bound}
        first, last = span
        report = await self._audit(first, last)
        if isinstance(report, str):
            return self._failed(report, first, last)
        for f in report.findings[:FINDINGS_PER_STEP]:
            fields = {"audits": self.audited.name, "first": str(first), "last": str(last),
                      "kind": f.kind, "id": f.id, "detail": f.detail}  # fmt: skip
            if await self._fenced(term, "fenced_audit", "audit-finding", fields, stream=keys["findings"],
                                  maxlen=FINDINGS_MAXLEN):  # fmt: skip
                return {"audits": self.audited.name, "stale": term.token}
        counts = report.counts()
        if await self._fenced(term, "fenced_hset", keys["audited"], {
            "audited_through": str(last), "audits": self.audited.name, "token": str(term.token),
        }):  # fmt: skip
            return {"audits": self.audited.name, "stale": term.token}
        self.stats.ledger = last
        for kind, n in counts.items():
            self.stats.findings[kind] += n
        out = {"audits": self.audited.name, "first": first, "last": last, "expected": report.expected,
               "stored": report.stored, "counts": counts}  # fmt: skip
        if report.equal:
            log.debug("audit-window-clean", job=self.name, **out)
        else:
            ids = " ".join(f"{f.kind}:{f.id}" for f in report.findings[:10])
            log.error("audit-findings", job=self.name, findings=len(report.findings), first_ids=ids, **out)
        return out

    async def _fenced(self, term: TermContext, how: str, *args: Any, **kwargs: Any) -> bool:
        """A fenced write under ``term``; True when refused (a stale term: nothing more is written)."""
        rejected = await getattr(self.store, how)(term.node, term.token, *args, **kwargs)
        if rejected is None:
            return False
        log.warning("audit-stale-term", job=self.name, token=term.token, reason=rejected.reason,
                    current_token=rejected.current_token)  # fmt: skip
        return True

    def _failed(self, why: str, first: int | None = None, last: int | None = None) -> dict[str, Any]:
        log.warning(
            "audit-failed", job=self.name, audits=self.audited.name, first=first, last=last, error=why
        )
        return {"audits": self.audited.name, "failed": why, "first": first, "last": last}

    async def _audit(self, first: int, last: int) -> Report | str:
        """The report of ledgers ``first..last``, or why it could not be made."""
        from ingestion.audit.expect import Rules  # lazy: node start-up (~10 ms)
        from ingestion.audit.runner import AuditError, audit_lake  # lazy: node start-up (~40 ms)
        from ingestion.audit.store import PostgresRows, RedisRows  # lazy: node start-up (~3 ms)
        job = self.audited
        watch = self.watch
        _rule, changes = rule_for(job.kind, job.resource, names=watch is not None)
        rules = Rules(job.rpc_filters(), decode=job.decode and changes, names=watch is not None)
        rows: PostgresRows | RedisRows
        if job.sink:
            rows = PostgresRows(job.sink, self.settings.sink.schema, job.name, last)
        else:
            rows = RedisRows(self.store.client, job.name, first, last)
        try:
            watched = None if watch is None else await watch.current()
            return await audit_lake(
                self.lake, rules, rows, job.name, first, last, watched=watched,
                processes=self.settings.lake.decode_processes, window=self.window,
                store_errors=(psycopg.Error, redis.RedisError, OSError), decoders=self.decoders,
            )  # fmt: skip
        except (AuditError, WatchUnavailable) as exc:
            return str(exc)
        finally:
            if isinstance(rows, PostgresRows):
                rows.close()

    def _bound_and_first(self) -> tuple[int | None, int | None]:
        """The audited job's bound and the ledger of its first stored row (blocking)."""
        from ingestion.audit.store import ledger_of  # lazy: node start-up (~3 ms)

        job = self.audited
        if job.sink:
            from ingestion.postgres import sql  # lazy: node start-up (~5 ms, with the two below)
            from ingestion.postgres.connection import connect  # lazy: node start-up (see above)
            from ingestion.postgres.readers import job_state  # lazy: node start-up (see above)

            state = job_state(job.sink, self.settings.sink.schema, job.name)
            with connect(job.sink, 5.0, "ingestion-audit") as conn:
                q = sql.quoted(self.settings.sink.schema)
                query = f"SELECT min(paging_token) FROM {q}.events WHERE job = %s"
                row = conn.execute(query, (job.name,)).fetchone()  # type: ignore[arg-type]
            first = ledger_of(str(row[0])) if row and row[0] else None
            return bound_of(state["complete_through"], state["cursor"]), first
        client = self.store.client
        through, cursor = client.hmget(job_keys(job.name)["cursor"], ["complete_through", "cursor"])  # type: ignore[misc]
        head: Any = client.xrange(job_keys(job.name)["events"], count=1)
        fields = head[0][1] if head else {}
        first = (
            ledger_of(_text(fields.get(b"paging_token", fields.get("paging_token", "")))) if head else None
        )
        return bound_of(int(through) if through else None, _text(cursor) if cursor else None), first


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@attrs.frozen
class AuditJob(ScheduledJob):
    """The audit job's source: a scheduled job of :class:`AuditStep` runs whose lake decode
    workers (``processes``; 0: a thread) live as long as the term, not one step (a worker pays for
    stellar-sdk's import when it starts)."""

    processes: int = 0

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        from ingestion.lake.decoding import open_decoders  # lazy: node start-up (trio_parallel, ~25 ms)

        step = self.action
        assert isinstance(step, AuditStep)
        async with open_decoders(self.processes) as decoders:
            step.decoders = decoders
            try:
                async with ScheduledJob.stream(self, cursor) as batches:
                    async for batch in batches:
                        yield batch
            finally:
                step.decoders = None
                step.stats.ledger = None  # the gauge is the leader's: the next leader says


def build_audit_step(settings: Any, job: Any, store: LeaseStore, watch: Any = None) -> AuditStep:
    """The step of the audit job ``job`` (its audited job, its lake, ``watch`` its watch list) on
    ``store``.

    Raises:
        ValueError: the audited job is not one of the configuration, or the lake URL is not one.
    """
    from ingestion.lake.store import open_lake  # lazy: node start-up (lake.store, ~8 ms)

    audited = next((j for j in settings.jobs if j.name == job.audits), None)
    if audited is None:
        raise ValueError(f"the audited job {job.audits!r} is not in this configuration")
    url = job.lake_url or (audited.lake_url if audited.kind == "lake" else settings.rpc.lake)
    lake = open_lake(url, settings.lake.endpoint_url)
    return AuditStep(job.name, settings, audited, store, lake, job.audit_window, watch=watch)
