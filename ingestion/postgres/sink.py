"""The PostgreSQL sink: a job's records and cursor in PostgreSQL, fenced there again.

psycopg 3's released async connection is built for asyncio, so this runs its synchronous
connection the way the lease store runs redis-py: each call in a worker thread
(``trio.to_thread.run_sync(..., abandon_on_cancel=True)``), the whole call bounded by
``trio.fail_after(call_timeout)``. A call that fails or times out raises
:class:`~actors.sink.SinkUnavailable` and its connection is dropped (closed by its own thread once
that returns); the outcome is unknown, and the CursorWriter ends the term: an ambiguous commit is
never retried, the next term reads the cursor again in its first transaction. The exception: an
error the server answered for a commit's statement about its data (SQLSTATE classes 22 and 23,
``DataError``/``IntegrityError``) is definite, that one statement was rolled back, so the commit
is refused (:class:`BatchRefused`, the CursorWriter's ``bad-batch``), not an outage.

The worker threads are the sink's own (a :class:`trio.CapacityLimiter` per sink): a thread
abandoned by its caller may run on until the server or TCP gives up (``statement_timeout``,
keepalives and ``tcp_user_timeout``, each a few call bounds), and must not take the slots of
trio's default limiter that Redis calls need. A connection is published as the sink's only by a
call still current (a generation counter): a thread whose caller gave up while it was connecting
closes what it opened and runs nothing.

Each call is one statement of one of the two functions in ``ingestion/postgres/sql.py`` in
autocommit mode: one round trip, one transaction, no lock held across a client's pause (a
SIGSTOPped leader holds no row lock). The server bounds a statement that outlives its client
(``statement_timeout``).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import trio

from actors.lease_store import CommitRejected, Committed
from actors.sink import SinkUnavailable, TermOpened, continuation
from actors.source import Record
from ingestion.postgres import sql
from ingestion.postgres.connection import THREADS, connect, describe, ensure_schema, redact

T = TypeVar("T")


class BatchRefused(ValueError):
    """The server refused a commit's data (SQLSTATE class 22 or 23): definite, nothing written."""


class PostgresSink:
    """One job's records and cursor in ``schema`` at ``url`` (see the module docstring)."""

    def __init__(
        self, url: str, job: str, *, schema: str = "ingestion", call_timeout: float = 1.0,
        events_max_len: int = 0, application: str = "ingestion",
    ) -> None:
        self.url = url
        self.job = job
        self.schema = schema
        self.events_max_len = events_max_len
        self.application = application
        self._call_timeout = call_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._schema_ready = False
        self._q = sql.quoted(schema)
        # A call's generation: a timed-out call moves it on, and a thread of an older one never
        # publishes its connection (guarded by ``_lock``: worker threads and the trio thread).
        self._generation = 0
        self._lock = threading.Lock()
        self._limiter: trio.CapacityLimiter | None = None

    @property
    def name(self) -> str:
        return "postgres"

    @property
    def call_timeout(self) -> float:
        return self._call_timeout

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _with_connection(self, generation: int, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """In a worker thread: run ``fn`` on the sink's connection (opened when missing), unless
        the call that started it (``generation``) is no longer current."""
        with self._lock:
            if generation != self._generation:  # its caller gave up before this thread ran
                raise SinkUnavailable("abandoned")
            conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = connect(self.url, self._call_timeout, self.application)
            with self._lock:
                current = generation == self._generation
                if current:
                    self._conn = conn
            if not current:  # its caller gave up while this thread was connecting
                conn.close()
                raise SinkUnavailable("abandoned while connecting")
        try:
            if not self._schema_ready:
                ensure_schema(conn, self.schema)
                self._schema_ready = True
            return fn(conn)
        except (psycopg.DataError, psycopg.IntegrityError):
            raise  # answered by the server, rolled back: the connection is fine
        except BaseException:
            with self._lock:
                if self._conn is conn:
                    self._conn = None
            conn.close()
            raise
        finally:
            if self._conn is not conn:  # abandoned by a timed-out caller meanwhile
                conn.close()

    async def call(
        self, fn: Callable[[psycopg.Connection[Any]], T], *, refusals: bool = False
    ) -> T:
        """Run ``fn(connection)`` in a worker thread of the sink's own, bounded by ``call_timeout``.

        Raises:
            SinkUnavailable: it failed or timed out (its effect is unknown).
            BatchRefused: with ``refusals``, the server refused the statement's data (SQLSTATE
                class 22 or 23): definite, it was rolled back.
        """
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(THREADS)
        generation = self._generation
        try:
            with trio.fail_after(self._call_timeout):
                return await trio.to_thread.run_sync(
                    functools.partial(self._with_connection, generation, fn),
                    abandon_on_cancel=True, limiter=self._limiter,
                )  # fmt: skip
        except trio.TooSlowError as exc:
            with self._lock:
                if generation == self._generation:
                    self._generation += 1
                    self._conn = None  # its thread closes it when it returns
            raise SinkUnavailable(
                f"sink.url {redact(self.url)}: timed out: no answer within "
                f"{self._call_timeout * 1000:.0f} ms"
            ) from exc
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            if refusals:
                raise BatchRefused(describe(exc, self.url)) from exc
            raise SinkUnavailable(describe(exc, self.url)) from exc
        except (psycopg.Error, sql.SchemaMismatch, OSError) as exc:
            raise SinkUnavailable(describe(exc, self.url)) from exc

    async def probe(self) -> int | None:
        """The job's fence (its token; 0: none yet), or None when PostgreSQL does not answer
        within the call bound (the schema created first when this sink has not yet). Asked by the
        Elector before each campaign: it campaigns above the fence, so Redis never issues a
        token PostgreSQL has seen (a Redis that went back in time, or lost a grant)."""
        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                f"SELECT coalesce((SELECT token FROM {self._q}.fences WHERE job = %s), 0)",  # type: ignore[arg-type]
                (self.job,),
            ).fetchone()

        try:
            row = await self.call(run)
        except SinkUnavailable:
            return None
        return int(row[0]) if row else 0

    async def open_term(self, node: str, token: int) -> TermOpened | CommitRejected:
        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                f"SELECT * FROM {self._q}.{sql.OPEN_TERM}(%s, %s, %s)", (self.job, token, node)  # type: ignore[arg-type]
            ).fetchone()

        row = await self.call(run)
        assert row is not None
        ok, fence, cursor = row
        if not ok:
            return CommitRejected(token=token, reason="stale-token", current_token=int(fence),
                                  stored_cursor=None)  # fmt: skip
        return TermOpened(cursor=cursor, own_cursor=True)

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
    ) -> Committed | CommitRejected:
        """Append ``records`` and move the cursor in one fenced transaction.

        Raises:
            ValueError: nothing to commit; or :class:`BatchRefused`, the server refused the
                batch's data (definite: nothing was written).
            SinkUnavailable: the outcome is unknown.
        """
        if not records and anchor is None:
            raise ValueError("a commit carries records, an anchor cursor, or both")
        try:
            cursor = continuation(previous_cursor, records, anchor)
        except ValueError as exc:
            return CommitRejected(token=token, reason=str(exc), current_token=token,
                                  stored_cursor=previous_cursor)  # fmt: skip
        tokens = sql.text_array([r.paging_token for r in records])
        bodies = sql.text_array([r.body for r in records])
        params = (self.job, token, node, previous_cursor, cursor, self.events_max_len, tokens, bodies)

        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                f"SELECT * FROM {self._q}.{sql.COMMIT_BATCH}"  # type: ignore[arg-type]
                "(%s, %s, %s, %s, %s, %s, %s::text[], %s::text[])",
                params,
            ).fetchone()

        row = await self.call(run, refusals=True)
        assert row is not None
        answer = sql.CommitAnswer.from_row(row)
        if answer.ok:
            return Committed(token=token, cursor=answer.stored or "", count=len(records),
                             trimmed=answer.trimmed)  # fmt: skip
        return CommitRejected(token=token, reason=answer.reason, current_token=answer.fence,
                              stored_cursor=answer.stored)  # fmt: skip


def read_events(
    url: str, schema: str, job: str, after_seq: int = 0, limit: int = 1000, timeout: float = 5.0
) -> list[tuple[int, str, int, str]]:
    """(seq, paging_token, token, record JSON) after ``after_seq``, in order (read-only tools)."""
    with connect(url, timeout, "ingestion-read") as conn:
        rows = conn.execute(
            f"SELECT seq, paging_token, token, record::text FROM {sql.quoted(schema)}.events "  # type: ignore[arg-type]
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
            (job, after_seq, limit),
        ).fetchall()
    return [(int(s), str(p), int(t), str(r)) for s, p, t, r in rows]


def job_state(url: str, schema: str, job: str, timeout: float = 5.0) -> dict[str, Any]:
    """A job's state in the sink: cursor, fence, rows kept, first and last ``seq``, terms."""
    q = sql.quoted(schema)
    with connect(url, timeout, "ingestion-read") as conn:
        cur = conn.execute(f"SELECT cursor, token FROM {q}.cursors WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
        fence = conn.execute(f"SELECT token, node FROM {q}.fences WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
        count, first, last = conn.execute(
            f"SELECT count(*), min(seq), max(seq) FROM {q}.events WHERE job = %s", (job,)  # type: ignore[arg-type]
        ).fetchone() or (0, None, None)
        terms = conn.execute(
            f"SELECT token, after_seq FROM {q}.terms WHERE job = %s ORDER BY token", (job,)  # type: ignore[arg-type]
        ).fetchall()
    return {
        "sink": "postgres", "schema": schema, "cursor": cur[0] if cur else None,
        "cursor_token": int(cur[1]) if cur else None, "fence": int(fence[0]) if fence else None,
        "fence_node": str(fence[1]) if fence else None,
        "events": int(count), "first_seq": first, "last_seq": last,
        "terms": [{"token": int(t), "after_seq": int(s)} for t, s in terms],
    }  # fmt: skip


def check_job(url: str, schema: str, job: str, timeout: float = 30.0) -> tuple[list[str], int]:
    """Verify a job's rows: exactly once, in order (paging tokens strictly rising along ``seq``),
    ``seq`` without gaps, tokens never decreasing and never below the fence history. Returns
    (problems, rows checked)."""
    from actors.cursor_order import token_key

    q = sql.quoted(schema)
    with connect(url, timeout, "ingestion-verify") as conn:
        rows = conn.execute(
            f"SELECT seq, token, paging_token FROM {q}.events WHERE job = %s ORDER BY seq", (job,)  # type: ignore[arg-type]
        ).fetchall()
        terms = conn.execute(
            f"SELECT token, after_seq FROM {q}.terms WHERE job = %s ORDER BY token", (job,)  # type: ignore[arg-type]
        ).fetchall()
        cur = conn.execute(f"SELECT cursor FROM {q}.cursors WHERE job = %s", (job,)).fetchone()  # type: ignore[arg-type]
    problems = sql.verify_fences([(int(s), int(t)) for s, t, _ in rows], [(int(t), int(a)) for t, a in terms])
    previous: str | None = None
    for seq, _t, pt in rows:
        if previous is not None and token_key(pt) <= token_key(previous):
            problems.append(f"seq {seq}: paging token {pt} not after {previous} (duplicate or out of order)")
        previous = pt
    if rows and cur is not None and token_key(cur[0]) < token_key(previous or "0"):
        problems.append(f"cursor {cur[0]} is behind the last row's paging token {previous}")
    return problems, len(rows)


def payload(notify: str) -> dict[str, Any]:
    """A ``NOTIFY`` payload as sent by ``commit_batch``: ``{"job", "seq", "cursor"}``."""
    value: dict[str, Any] = json.loads(notify)
    return value


# --- read-only tools: verify, inspect, tail --------------------------------------------------------


def configured_sink(settings: Any, job: str) -> str:
    """A job's sink as configured: its ``[jobs.NAME] sink``, else ``sink.url`` (empty: the Redis
    events stream)."""
    for j in settings.jobs:
        if j.name == job:
            return str(j.sink)
    return str(settings.sink.url)


def job_known(state: dict[str, Any]) -> bool:
    """Whether :func:`job_state` found anything of the job (a fence, a cursor or a row)."""
    return state["fence"] is not None or state["cursor"] is not None or state["events"] > 0


def read_all_events(
    url: str, schema: str, job: str, page: int = 5000, timeout: float = 30.0
) -> list[tuple[int, str, int, str]]:
    """Every row of the job, in ``seq`` order, read in pages (verify)."""
    out: list[tuple[int, str, int, str]] = []
    while True:
        rows = read_events(url, schema, job, out[-1][0] if out else 0, page, timeout)
        out += rows
        if len(rows) < page:
            return out


class EventsFollower:
    """A job's rows after a ``seq``, woken by the ``NOTIFY`` each commit sends (``tail``).

    Blocking (a foreground command): one connection that ``LISTEN``s on the schema's channel and
    reads. :meth:`wait` returns after a notification or ``seconds``, whichever comes first: a
    missed notification (a reconnect) costs at most one wait, never a row.
    """

    def __init__(self, url: str, schema: str, job: str, timeout: float = 5.0) -> None:
        self.url = url
        self.schema = schema
        self.job = job
        self.timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = connect(self.url, self.timeout, "ingestion-tail")
            conn.execute(f"LISTEN {sql.channel(self.schema)}")  # type: ignore[arg-type]
            self._conn = conn
        return self._conn

    def read(self, after_seq: int, limit: int) -> list[tuple[int, str, int, str]]:
        """(seq, paging_token, token, record JSON) after ``after_seq``, in order."""
        rows = self._connection().execute(
            f"SELECT seq, paging_token, token, record::text FROM {sql.quoted(self.schema)}.events "  # type: ignore[arg-type]
            "WHERE job = %s AND seq > %s ORDER BY seq LIMIT %s",
            (self.job, after_seq, limit),
        ).fetchall()
        return [(int(s), str(p), int(t), str(r)) for s, p, t, r in rows]

    def last_seq(self) -> int:
        row = self._connection().execute(
            f"SELECT coalesce(max(seq), 0) FROM {sql.quoted(self.schema)}.events WHERE job = %s",  # type: ignore[arg-type]
            (self.job,),
        ).fetchone()
        return int(row[0]) if row else 0

    def wait(self, seconds: float) -> bool:
        """Until a commit of this job is notified, at most ``seconds``: whether one was."""
        for note in self._connection().notifies(timeout=seconds):
            try:
                if payload(note.payload).get("job") == self.job:
                    return True
            except ValueError:
                continue
        return False

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
