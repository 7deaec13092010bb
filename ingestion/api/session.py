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
        self._busy = False  # a statement sent whose results were not all read

    @property
    def usable(self) -> bool:
        """Whether the next statement may be sent (the connection is up and idle)."""
        return (
            not (self._busy or self.conn.closed or self.conn.broken) and self._pg.status == pq.ConnStatus.OK
        )

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """The rows of one statement (``%s`` placeholders).

        Raises:
            psycopg.Error: the server's error for the statement (the session stays usable), or
                ``OperationalError``: the connection failed (it does not).
        """
        command = self._commands.get(sql)
        if command is None:
            if len(self._commands) > 256:
                self._commands.clear()
            command = self._commands[sql] = numbered(sql)
        pg = self._pg
        fd = pg.socket
        self._busy = True
        pg.send_query_params(command, [text_param(p) for p in params])
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
        for result in results:
            if result.status not in _OK:
                raise psycopg.errors.error_from_result(result)
        if not results:
            return []
        last = results[-1]
        width = last.nfields
        return [tuple(last.get_value(r, c) for c in range(width)) for r in range(last.ntuples)]

    def close(self) -> None:
        if not self.conn.closed:
            try:  # (a task waiting on the socket, if any, wakes: ClosedResourceError)
                trio.lowlevel.notify_closing(self._pg.socket)
            except (psycopg.OperationalError, RuntimeError):
                pass  # no socket any more, or not in trio
        self.conn.close()
