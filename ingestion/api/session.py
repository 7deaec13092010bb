"""A PostgreSQL session driven on trio's own event loop: a statement is sent and its result
awaited on the connection's socket, with no worker thread (psycopg's async connection runs on
asyncio only; a thread hop per read cost the API a fifth of its CPU per answer).

The connection is made by psycopg (in a thread: connecting is rare), then used through its libpq
wrapper (``psycopg.pq``, non-blocking): text parameters (``str``, ``int``, None), text results
(``bytes`` or None). An error the server answers is raised as psycopg's class for its SQLSTATE
(``QueryCanceled``, ``UndefinedTable``...) and leaves the session usable; a failure of the
connection itself is psycopg's ``OperationalError`` and leaves it unusable (:attr:`usable`), as
does a read cancelled before its result came.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg
import trio
from psycopg import pq

Row = tuple[bytes | None, ...]
_PLACEHOLDER = re.compile(r"%[s%]")
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
PREPARE_AFTER = 2  # a statement's sends before it is prepared
PREPARED_MAX = 100  # prepared statements per session at most


def numbered(sql: str) -> bytes:
    """``sql`` with psycopg's placeholders as libpq's: ``%s`` the next ``$n``, ``%%`` a ``%``."""
    count = 0

    def one(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(one, sql).encode()


def text_param(value: Any) -> bytes | None:
    """A parameter as libpq's text format has it.

    Raises:
        TypeError: not ``str``, ``int`` or None.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    raise TypeError(f"a parameter of type {type(value).__name__}")


class Session:
    """One connection's statements, awaited on trio (one at a time: the caller holds it)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._pg = conn.pgconn
        self._pg.nonblocking = 1
        self._commands: dict[str, bytes] = {}
        self._seen: dict[str, int] = {}  # statement -> times sent unprepared
        self._prepared: dict[str, bytes] = {}  # statement -> its prepared statement's name
        self._busy = False  # a statement sent whose results were not all read

    @property
    def usable(self) -> bool:
        """Whether the next statement may be sent (the connection is up and idle)."""
        return (
            not (self._busy or self.conn.closed or self.conn.broken) and self._pg.status == pq.ConnStatus.OK
        )

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """The rows of one statement (``%s`` placeholders). A statement sent a second time is
        prepared on the server (:data:`PREPARE_AFTER`; at most :data:`PREPARED_MAX` per session,
        as psycopg does): it is parsed once, not per request.

        Raises:
            psycopg.Error: the server's error for the statement (the session stays usable), or
                ``OperationalError``: the connection failed (it does not).
        """
        pg = self._pg
        values = [text_param(p) for p in params]
        name = self._prepared.get(sql)
        if name is None:
            command = self._commands.get(sql)
            if command is None:
                if len(self._commands) > PREPARED_MAX:
                    self._commands.clear()
                    self._seen.clear()
                command = self._commands[sql] = numbered(sql)
            seen = self._seen[sql] = self._seen.get(sql, 0) + 1
            if seen < PREPARE_AFTER or len(self._prepared) >= PREPARED_MAX:
                self._busy = True
                pg.send_query_params(command, values)
                return _rows(await self._results())
            name = b"ingestion_api_%d" % len(self._prepared)
            self._busy = True
            pg.send_prepare(name, command)
            _rows(await self._results())
            self._prepared[sql] = name
        self._busy = True
        pg.send_query_prepared(name, values)
        return _rows(await self._results())

    async def _results(self) -> list[pq.abc.PGresult]:
        """The results of the statement sent (all read: the session is idle again)."""
        pg = self._pg
        fd = pg.socket
        while pg.flush():
            await trio.lowlevel.wait_writable(fd)
        results: list[pq.abc.PGresult] = []
        while True:
            pg.consume_input()
            while pg.is_busy():
                await trio.lowlevel.wait_readable(fd)
                pg.consume_input()
            result = pg.get_result()
            if result is None:
                break
            results.append(result)
        self._busy = False
        return results

    def close(self) -> None:
        if not self.conn.closed:
            try:  # (a task waiting on the socket, if any, wakes: ClosedResourceError)
                trio.lowlevel.notify_closing(self._pg.socket)
            except (psycopg.OperationalError, RuntimeError):
                pass  # no socket any more, or not in trio
        self.conn.close()


def _rows(results: list[pq.abc.PGresult]) -> list[Row]:
    """The last result's rows; the server's error, if one answered, raised."""
    for result in results:
        if result.status not in _OK:
            raise psycopg.errors.error_from_result(result)
    if not results:
        return []
    last = results[-1]
    width = last.nfields
    return [tuple(last.get_value(r, c) for c in range(width)) for r in range(last.ntuples)]
