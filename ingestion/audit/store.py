"""The audit's view of a job's store: every row it holds for some ledgers, the job's own and its
backfill ranges' (``JOB~FIRST-LAST``, :mod:`ingestion.backfill.plan`), read-only and blocking (the
caller runs each read in a thread).

- :class:`PostgresRows`: ``events`` rows of the job and its ranges whose paging token lies in the
  audited ledgers (an RPC event id sorts as its ledger does: ``"%019d-%010d"``), read once through
  one server-side cursor in id order and handed out window by window, on a connection of its own
  (never a node's).
- :class:`RedisRows`: the job's and its ranges' events streams. A stream is ordered by commit,
  not by ledger, and no index finds a ledger in it: the streams are read once, whole, and the rows
  of the audited ledgers kept, by ledger, for the windows to take.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import redis

from actors.lease_store import job_keys, job_of_key
from ingestion.audit.compare import StoredRow
from ingestion.backfill.plan import RANGE_MARK
from ingestion.postgres import sql
from ingestion.postgres.connection import connect
from ingestion.rpc.protocol import Cursor, InvalidCursor

PAGE = 5000  # rows a Redis stream read (XRANGE COUNT) or a PostgreSQL fetch takes
STREAM_TIMEOUT = 150.0  # seconds: the PostgreSQL rows' query may sort a long span (bound: 4x this)


def range_jobs(job: str, names: list[str]) -> list[str]:
    """Of ``names``, the job's own name and its backfill ranges' (``JOB~FIRST-LAST``), sorted:
    the job first, then the ranges by their first ledger."""
    pattern = re.compile(re.escape(job + RANGE_MARK) + r"(\d+)-(\d+)")
    ranges = sorted((int(m[1]), n) for n in set(names) if (m := pattern.fullmatch(n)))
    return ([job] if job in names else []) + [n for _, n in ranges]


def ledger_of(paging_token: str) -> int | None:
    """The ledger of an RPC event id, or None (not one: such a row lies in no window and is named
    by no finding; ``verify`` judges the stream's form)."""
    try:
        return Cursor.parse(paging_token).ledger
    except InvalidCursor:
        return None


@attrs.define
class PostgresRows:
    """The rows of ``job`` and its ranges in the PostgreSQL sink at ``url`` (schema ``schema``)."""

    url: str
    schema: str
    job: str
    span_last: int  # the audit's last ledger
    timeout: float = 30.0
    jobs: list[str] = attrs.field(factory=list)
    _conn: Any = None
    _cursor: Any = None
    _pending: list[Any] = attrs.field(factory=list)  # fetched rows not yet taken, last first

    def find_jobs(self) -> list[str]:
        """The job and its backfill ranges that the sink knows (a cursor, a fence or a row)."""
        q = sql.quoted(self.schema)
        prefix = self.job + RANGE_MARK
        with connect(self.url, self.timeout, "ingestion-audit") as conn:
            rows = conn.execute(
                f"SELECT job FROM {q}.cursors WHERE job = %s OR starts_with(job, %s) "  # type: ignore[arg-type]
                f"UNION SELECT job FROM {q}.fences WHERE job = %s OR starts_with(job, %s)",
                (self.job, prefix, self.job, prefix),
            ).fetchall()
        self.jobs = range_jobs(self.job, [str(r[0]) for r in rows])
        return self.jobs

    def rows(self, first: int, last: int) -> list[StoredRow]:
        """Every row of the jobs found whose id lies in ledgers ``first..last``; windows asked
        in ascending order, all within ``span`` (one server-side cursor in id order serves them:
        the job's rows are read once, whatever the number of windows)."""
        if self._cursor is None:
            self._open(first)
        assert self._cursor is not None
        high = str(Cursor.through(last))
        out: list[StoredRow] = []
        while True:
            if not self._pending:
                self._pending = list(reversed(self._cursor.fetchmany(PAGE)))
                if not self._pending:
                    return out
            j, seq, token, record = self._pending[-1]
            if str(token) > high:
                return out
            self._pending.pop()
            out.append(StoredRow(str(j), f"seq {seq}", str(token), str(record)))

    def _open(self, first: int) -> None:
        low, high = str(Cursor(first)), str(Cursor.through(self.span_last))
        self._conn = connect(self.url, STREAM_TIMEOUT, "ingestion-audit")
        self._cursor = self._conn.cursor(name="ingestion_audit", withhold=True)
        self._cursor.execute(
            f"SELECT job, seq, paging_token, record::text FROM {sql.quoted(self.schema)}.events "  # type: ignore[arg-type]
            "WHERE job = ANY(%s) AND paging_token BETWEEN %s AND %s ORDER BY paging_token, job, seq",
            (self.jobs, low, high),
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = self._cursor = None


@attrs.define
class RedisRows:
    """The rows of ``job`` and its ranges in their Redis events streams (see the module
    docstring); ``first..last`` the audited ledgers (rows outside them are not kept)."""

    client: redis.Redis
    job: str
    first: int
    last: int
    jobs: list[str] = attrs.field(factory=list)
    _by_ledger: dict[int, list[StoredRow]] | None = None

    def find_jobs(self) -> list[str]:
        """The job and its backfill ranges whose events stream exists."""
        escaped = re.sub(r"([*?\[\]\\])", r"\\\1", self.job)
        names = [self.job] if self.client.exists(job_keys(self.job)["events"]) else []
        key: Any
        for key in self.client.scan_iter(match=job_keys(f"{escaped}{RANGE_MARK}*")["events"], count=1000):
            names.append(job_of_key(key) or "")
        self.jobs = range_jobs(self.job, names)
        return self.jobs

    def rows(self, first: int, last: int) -> list[StoredRow]:
        """Every row of the jobs found whose id lies in ledgers ``first..last`` (within the
        audited ledgers; the streams are read on the first call)."""
        if self._by_ledger is None:
            self._by_ledger = self._read()
        return [row for ledger in range(first, last + 1) for row in self._by_ledger.pop(ledger, [])]

    def _read(self) -> dict[int, list[StoredRow]]:
        out: dict[int, list[StoredRow]] = {}
        for name in self.jobs:
            key, start = job_keys(name)["events"], "-"
            while True:
                chunk: Any = self.client.xrange(key, min=start, count=PAGE)
                for entry_id, fields in chunk:
                    token = _text(fields.get(b"paging_token", fields.get("paging_token", "")))
                    ledger = ledger_of(token)
                    if ledger is not None and self.first <= ledger <= self.last:
                        record = _text(fields.get(b"record", fields.get("record", "")))
                        out.setdefault(ledger, []).append(
                            StoredRow(name, f"entry {_text(entry_id)}", token, record)
                        )
                if len(chunk) < PAGE:
                    break
                start = "(" + _text(chunk[-1][0])
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
