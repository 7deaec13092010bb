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
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
import trio

from actors.lease_store import CommitRejected, Committed, RedisUnavailable
from actors.sink import SinkUnavailable, TermOpened, TermRefused, continuation
from actors.source import Record, Watermark
from ingestion.postgres import sql
from ingestion.postgres.connection import THREADS, connect, describe, ensure_schema, redact

T = TypeVar("T")


class BatchRefused(ValueError):
    """The server refused a commit's data (SQLSTATE class 22 or 23): definite, nothing written."""


class PostgresSink:
    """One job's records and cursor in ``schema`` at ``url`` (see the module docstring).

    ``domain``: the election domain this node's terms come from (its Redis deployment),
    recorded with the job by the first term that opens and compared by every later one: a term
    from another domain is refused for good (:class:`TermRefused`). None: neither recorded nor
    checked. ``identify``: the deployment's own id (``LeaseStore.deployment_id``), read at each
    term's opening; when given, it is the domain, and ``domain`` (how the node's Redis URL names
    the deployment, ``LeaseStore.deployment``: what nodes recorded before the id) is the name a
    fence recorded earlier may still carry: the first term of this node's deployment moves that
    fence to the id (a fence recorded under another name is refused as before)."""

    def __init__(
        self, url: str, job: str, *, schema: str = "ingestion", call_timeout: float = 1.0,
        events_max_len: int = 0, application: str = "ingestion", domain: str | None = None,
        identify: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self.url = url
        self.job = job
        self.probe_error: str | None = None
        self.schema = schema
        self.domain = domain
        self.identify = identify
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
        except SinkUnavailable as exc:
            self.probe_error = str(exc)
            return None
        self.probe_error = None
        return int(row[0]) if row else 0

    async def open_term(self, node: str, token: int) -> TermOpened | CommitRejected | TermRefused:
        """Raise the job's fence to ``(token, node)`` and read its cursor (``open_term`` of
        ``ingestion/postgres/sql.py``): refused as ``stale-token`` when the fence is higher (or
        equal and another node's), and for good (:class:`TermRefused`) when another election
        domain owns the job.

        Raises:
            SinkUnavailable: it failed or timed out (its effect is unknown), or the deployment's
                id could not be read.
        """
        mine, named = self.domain, self.domain
        if self.identify is not None:
            try:
                mine = await self.identify()
            except RedisUnavailable as exc:
                raise SinkUnavailable(f"the Redis deployment's id: {exc}") from exc

        def open_(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                f"SELECT * FROM {self._q}.{sql.OPEN_TERM}(%s, %s, %s, %s)",  # type: ignore[arg-type]
                (self.job, token, node, mine),
            ).fetchone()

        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            row = open_(conn)
            if row is not None and named is not None and mine != named and sql.owned_by(row) == named:
                # Recorded by this deployment's name, before it had an id: moved to the id, only
                # from that name (two nodes of two deployments of that name: the first moves it,
                # the other is refused), then the term opens as it would have.
                conn.execute(sql.adopt_domain(self.schema), (mine, self.job, named))  # type: ignore[arg-type]
                row = open_(conn)
            return row

        row = await self.call(run)
        assert row is not None
        answer = sql.OpenAnswer.from_row(row)
        if answer.reason == "other-domain" and answer.owner is not None and mine is not None:
            shown = mine if named in (None, mine) else f"{mine} ({named})"
            problem = sql.other_domain(self.schema, self.job, answer.owner, shown)
            return TermRefused(f"sink.url {redact(self.url)}: {problem}")
        if not answer.ok:
            return CommitRejected(token=token, reason="stale-token", current_token=answer.fence,
                                  stored_cursor=None)  # fmt: skip
        return TermOpened(cursor=answer.cursor, own_cursor=True)

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
        watermark: Watermark | None = None,
    ) -> Committed | CommitRejected:
        """Append ``records`` and move the cursor (and the completeness watermark, when given)
        in one fenced transaction.

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
        params = (
            self.job, token, node, previous_cursor, cursor, self.events_max_len, tokens, bodies,
            None if watermark is None else watermark.ledger, "" if watermark is None else watermark.held,
        )  # fmt: skip

        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                f"SELECT * FROM {self._q}.{sql.COMMIT_BATCH}"  # type: ignore[arg-type]
                "(%s, %s, %s, %s, %s, %s, %s::text[], %s::text[], %s::bigint, %s)",
                params,
            ).fetchone()

        row = await self.call(run, refusals=True)
        assert row is not None
        answer = sql.CommitAnswer.from_row(row)
        if answer.ok:
            return Committed(token=token, cursor=answer.stored or "", count=len(records),
                             trimmed=answer.trimmed, complete_through=answer.complete_through,
                             held=answer.complete_held, newly_held=answer.newly_held)  # fmt: skip
        return CommitRejected(token=token, reason=answer.reason, current_token=answer.fence,
                              stored_cursor=answer.stored)  # fmt: skip
