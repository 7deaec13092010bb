"""The events API's reads of the store (:mod:`ingestion.api.store`), read-only, from trio.

Each read runs on a connection of the reader's own (at most ``connections`` at once: what bounds
a flood), driven on trio's event loop (:class:`~ingestion.api.session.Session`: no worker thread;
connecting alone takes one), bounded twice: by the server (the connection's ``statement_timeout``:
a query that runs longer is cancelled there and the request answers -32001) and by the caller
(``trio.fail_after``). Connections are reused while they work; a failed one is dropped and the next
read connects afresh, so the API answers again as soon as PostgreSQL does. Sessions are read-only
(``default_transaction_read_only``): the API cannot write.

A ``getEvents`` request is one read (:meth:`StoreReader.page`: one connection): the window, the
plan made for it, the page, which PostgreSQL renders (:func:`~ingestion.api.query.rendered_sql`:
the events' JSON joined in one value, for ``xdrFormat: base64``). The window is read at most once
per ``window_ttl`` (:data:`WINDOW_TTL`, 10 ms): a read that began less than that before a request
serves it too, so an event projected is visible to every request that begins ``window_ttl`` after
its commit (well within the freshness target of 100 ms), and a busy API runs the window's
statement a few dozen times a second rather than once per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import psycopg
import trio

from ingestion.api.core import too_slow, unavailable
from ingestion.api.query import EMPTY, Page, Plan, Window, page_of, rendered_sql
from ingestion.api.session import Session
from ingestion.api.store import close_time_of, view_latest, view_oldest, within_watermark
from ingestion.postgres.connection import describe
from ingestion.postgres.sql import quoted
from ingestion.rpc.protocol import Cursor, RpcError

T = TypeVar("T")
WINDOW_TTL = 0.01  # seconds a window read also serves the requests after it


class StoreReader:
    """Reads one view of the store at ``url`` (a primary or a streaming replica).

    Args:
        statement_timeout: seconds a statement may run on the server.
        connections: reads at once at most (each on its own connection).
        window_ttl: seconds a window read serves later ``getEvents`` requests too (0: each reads it).
    """

    def __init__(
        self,
        url: str,
        schema: str,
        view: str,
        *,
        statement_timeout: float = 5.0,
        connect_timeout: float = 2.0,
        connections: int = 8,
        window_ttl: float = WINDOW_TTL,
    ) -> None:
        self.url = url
        self.schema = schema
        self.view = view
        self.statement_timeout = statement_timeout
        self.connect_timeout = connect_timeout
        self.window_ttl = window_ttl
        self._cached: tuple[float, Window] | None = None  # (when its read began, the window)
        self._limiter = trio.CapacityLimiter(connections)
        self._idle: list[Session] = []
        self._close_times: dict[str, int] = {}  # id bound -> close time (the newest event below it)
        q = quoted(schema)
        # One statement, so one snapshot: the progress rows, each with the oldest event and the
        # live job's completeness watermark (NULL when it has none; ``to_jsonb``: a store from
        # before the column reads as none).
        self._window_sql = (
            f"SELECT p.source, p.seq, p.through, (SELECT record FROM {q}.api_events WHERE view = %s "
            f"ORDER BY id LIMIT 1), (SELECT to_jsonb(c)->>'complete_through' FROM {q}.cursors c "
            f"WHERE c.job = %s) FROM {q}.api_progress p WHERE p.view = %s"
        )
        self._newest_sql = (
            f"SELECT record FROM {q}.api_events WHERE view = %s AND id < %s ORDER BY id DESC LIMIT 1"
        )

    async def window(self) -> Window | None:
        """What the view holds now (None: nothing projected yet)."""
        return await self._run(self._window)

    async def rows(self, plan: Plan) -> list[tuple[str, str]]:
        """The plan's ``(id, record)`` rows (none when its range is empty)."""
        if plan.sql is None:
            return []
        sql = plan.sql

        async def read(session: Session) -> list[tuple[str, str]]:
            return [(_text(i), _text(r)) for i, r in await session.query(sql, plan.params)]

        return await self._run(read)

    async def page(self, make_plan: Callable[[Window | None], Plan]) -> tuple[Window, Plan, Page]:
        """The window (read at most once per ``window_ttl``), the plan ``make_plan`` makes of it,
        and the plan's page: one connection, no thread.

        Raises:
            RpcError: what ``make_plan`` raised (the connection is kept), or the store's errors.
        """
        began = trio.current_time()
        cached = self._cached
        known = cached[1] if cached is not None and began - cached[0] < self.window_ttl else None

        async def read(session: Session) -> tuple[Window | None, Plan | RpcError, Page]:
            window = known if known is not None else await self._window(session)
            try:
                p = make_plan(window)
            except RpcError as refused:
                return window, refused, EMPTY  # a refused request is no fault of the connection's
            if p.sql is None:
                return window, p, EMPTY
            if p.xdr_format == "json":  # (rendered here: SEP-51 JSON of the ScVals)
                rows = await session.query(p.sql, p.params)
                return window, p, page_of([(_text(i), _text(r)) for i, r in rows], p.xdr_format)
            ((count, last, events),) = await session.query(rendered_sql(p.sql), p.params)
            return window, p, Page(int(_text(count)), None if last is None else last.decode(), events or b"")

        window, p, page = await self._run(read)
        if known is None and window is not None and (self._cached is None or self._cached[0] < began):
            self._cached = (began, window)
        if isinstance(p, RpcError):
            raise p
        assert window is not None  # (make_plan refuses a missing window)
        return window, p, page

    async def _window(self, session: Session) -> Window | None:
        try:  # one statement: the progress rows, each with the oldest event
            rows = await session.query(self._window_sql, (self.view, self.view, self.view))
        except psycopg.errors.UndefinedTable:
            return None  # no projector has run yet
        progress = [(_text(s), int(_text(q)), None if t is None else t.decode()) for s, q, t, _, _ in rows]
        watermark = _text(rows[0][4]) if rows and rows[0][4] is not None else None
        latest = within_watermark(view_latest(self.view, progress), watermark)
        if latest is None or rows[0][3] is None:
            return None
        oldest_record = _text(rows[0][3])
        oldest = view_oldest(self.view, progress, int(orjson.loads(oldest_record)["ledger"]))
        if latest < oldest:
            return None
        bound = str(Cursor(latest + 1))
        latest_close = self._close_times.get(bound)
        if latest_close is None:
            newest = await session.query(self._newest_sql, (self.view, bound))
            latest_close = close_time_of(_text(newest[0][0])) if newest else 0
            if len(self._close_times) > 1000:
                self._close_times.clear()
            self._close_times[bound] = latest_close
        return Window(oldest, latest, close_time_of(oldest_record), latest_close)

    async def _run(self, fn: Callable[[Session], Awaitable[T]]) -> T:
        try:
            with trio.fail_after(self.statement_timeout + self.connect_timeout + 1):
                async with self._limiter:
                    return await self._call(fn)
        except trio.TooSlowError:
            raise too_slow() from None
        except psycopg.errors.QueryCanceled:
            raise too_slow() from None
        except (psycopg.Error, OSError) as exc:
            raise unavailable(describe(exc, self.url).removeprefix("sink.url ")) from None

    async def _call(self, fn: Callable[[Session], Awaitable[T]]) -> T:
        session, reused = await self._take()
        try:
            out = await fn(session)
        except psycopg.OperationalError:
            if session.usable:  # the server's error for the statement (QueryCanceled)
                self._idle.append(session)
                raise
            session.close()
            if not reused:
                raise
            # A kept connection that broke (PostgreSQL restarted, a failover): the others are as
            # stale; a read is safe to run again, once, on a fresh connection.
            self.close()
            session = await self._connect()
            try:
                out = await fn(session)
            except BaseException:
                self._keep_or_close(session)
                raise
        except BaseException:  # (cancelled mid-read: the session is busy, so closed)
            self._keep_or_close(session)
            raise
        self._idle.append(session)
        return out

    def _keep_or_close(self, session: Session) -> None:
        if session.usable:
            self._idle.append(session)
        else:
            session.close()

    async def _take(self) -> tuple[Session, bool]:
        """A kept session (True) or a new one (False)."""
        while self._idle:
            session = self._idle.pop()
            if session.usable:
                return session, True
            session.close()
        return await self._connect(), False

    async def _connect(self) -> Session:
        conn = await trio.to_thread.run_sync(self._connect_sync, abandon_on_cancel=True)
        return Session(conn)

    def _connect_sync(self) -> psycopg.Connection[Any]:
        ms = max(100, round(self.statement_timeout * 1000))
        return psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=max(1, round(self.connect_timeout)),
            application_name="ingestion-api",
            client_encoding="utf8",
            options=f"-c statement_timeout={ms} -c default_transaction_read_only=on",
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=3,
            tcp_user_timeout=ms + 2000,
        )

    def close(self) -> None:
        """Close the idle connections (those in use close as their reads end)."""
        idle, self._idle = self._idle, []
        for session in idle:
            session.close()


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode()
