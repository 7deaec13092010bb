"""Fenced writes for job code in PostgreSQL: :class:`PostgresFence`, whose transactions hold the
job's fence (``open_term`` of ``ingestion/postgres/sql.py``) until they commit, so a stale
leader's writes never land (``async with term.fenced(fence) as tx``, ``actors.source``).

Its calls run as the sink's do (``ingestion/postgres/sink.py``): psycopg's synchronous connection
in worker threads of the fence's own, each call bounded by ``trio.fail_after(call_timeout)``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import trio

from actors.sink import SinkUnavailable
from ingestion.postgres import sql
from ingestion.postgres.connection import THREADS, connect, describe, ensure_schema, redact

T = TypeVar("T")


class FencedTransaction:
    """Job code's own SQL inside a transaction that holds the job's fence (see
    :meth:`PostgresFence.fenced`). ``execute`` runs one statement in a worker thread."""

    def __init__(self, fence: PostgresFence, conn: psycopg.Connection[Any]) -> None:
        self._fence = fence
        self._conn = conn

    async def execute(
        self, query: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``query``; its rows (empty for a statement without any).

        Raises:
            SinkUnavailable: it failed or timed out (the transaction will not commit).
        """
        def run() -> list[tuple[Any, ...]]:
            cur = self._conn.execute(query, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []

        return await self._fence._run(run)


class FenceRejected(Exception):
    """The job's fence in PostgreSQL holds a newer token: this term is over; nothing was written."""

    def __init__(self, job: str, token: int, fence: int) -> None:
        super().__init__(f"job {job!r}: token {token} is stale, the fence holds {fence}")
        self.token = token
        self.fence = fence


class PostgresFence:
    """Fenced writes for job code: ``async with term.fenced(fence) as tx: await tx.execute(...)``
    (``actors.source.TermContext.fenced``). Each use opens a transaction on a connection of its
    own, raises the job's fence to the term's token like a new term's first transaction (refused,
    :class:`FenceRejected`, when it is higher) and holds the fence row locked until the
    transaction commits, so no newer term's transaction can interleave. A commit that loses its
    connection is unknown (:class:`~actors.sink.SinkUnavailable`): job code must be idempotent.
    The fence is ``(token, node)``: an equal token opened by another node is refused too."""

    def __init__(self, url: str, job: str, *, schema: str = "ingestion", call_timeout: float = 2.0) -> None:
        self.url = url
        self.job = job
        self.schema = schema
        self.call_timeout = call_timeout
        self._q = sql.quoted(schema)
        self._schema_ready = False
        self._limiter: trio.CapacityLimiter | None = None

    @property
    def limiter(self) -> trio.CapacityLimiter:
        """The fence's own worker threads (not trio's default ones, which Redis calls need)."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(THREADS)
        return self._limiter

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            with trio.fail_after(self.call_timeout):
                return await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=self.limiter)
        except trio.TooSlowError as exc:
            raise SinkUnavailable(f"sink.url {redact(self.url)}: timed out") from exc
        except (psycopg.Error, OSError) as exc:
            raise SinkUnavailable(describe(exc, self.url)) from exc

    @asynccontextmanager
    async def fenced(self, node: str, token: int) -> AsyncIterator[FencedTransaction]:
        def begin() -> psycopg.Connection[Any]:
            conn = connect(self.url, self.call_timeout, f"ingestion-job:{self.job}")
            try:
                if not self._schema_ready:
                    ensure_schema(conn, self.schema)
                    self._schema_ready = True
                # READ COMMITTED whatever the session's default (``connection.py``): the
                # statements after the wait on the fence row must see the commit waited for.
                conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                row = conn.execute(  # (no election domain: job code's fence does not check it)
                    f"SELECT ok, fence FROM {self._q}.{sql.OPEN_TERM}(%s, %s, %s, NULL)",  # type: ignore[arg-type]
                    (self.job, token, node),
                ).fetchone()
                assert row is not None
                if not row[0]:
                    conn.execute("ROLLBACK")
                    raise FenceRejected(self.job, token, int(row[1]))
                conn.execute(
                    f"SELECT 1 FROM {self._q}.fences WHERE job = %s FOR UPDATE", (self.job,)  # type: ignore[arg-type]
                )
            except BaseException:
                conn.close()
                raise
            return conn

        conn = await self._run(begin)
        try:
            yield FencedTransaction(self, conn)
            await self._run(functools.partial(conn.execute, "COMMIT"))
        finally:
            with trio.move_on_after(4 * self.call_timeout, shield=True):
                await trio.to_thread.run_sync(
                    functools.partial(_cancel_and_close, conn, 4 * self.call_timeout),
                    abandon_on_cancel=True, limiter=self.limiter,
                )  # fmt: skip


def _cancel_and_close(conn: psycopg.Connection[Any], timeout: float) -> None:
    """Close a connection a timed-out statement's thread may still be using: cancel that
    statement first, then close once the thread has let go of the connection (its lock), never
    under it."""
    if conn.closed:
        return
    if not conn.lock.acquire(blocking=False):
        try:
            conn.cancel_safe(timeout=timeout)
        except psycopg.Error:
            pass  # the server is out of reach: the statement ends with the connection
        if not conn.lock.acquire(timeout=timeout):
            return  # still in use: its statement_timeout ends it, and the GC closes it
    try:
        conn.close()
    finally:
        conn.lock.release()
