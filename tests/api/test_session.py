"""The API's PostgreSQL session on trio (ingestion/api/session.py): statements with psycopg's
placeholders, the server's errors as psycopg's classes (the session still usable), a statement
sent again prepared on the server, and a read cancelled mid-way leaving the session unusable."""

from __future__ import annotations

import psycopg
import pytest
import trio

from ingestion.api.session import PREPARE_AFTER, Session, numbered
from ingestion.testing.local_postgres import LocalPostgres


def test_placeholders_become_libpqs() -> None:
    assert numbered("SELECT %s, '%%', %s") == b"SELECT $1, '%', $2"


async def test_a_statement_sent_again_is_prepared_and_errors_leave_the_session_usable(
    pg: LocalPostgres,
) -> None:
    session = Session(await trio.to_thread.run_sync(lambda: psycopg.connect(pg.url, autocommit=True)))
    sql = "SELECT %s::int + %s, %s::text"
    for n in range(PREPARE_AFTER + 2):
        assert await session.query(sql, (n, 1, None)) == [(str(n + 1).encode(), None)]
    prepared = await session.query("SELECT statement FROM pg_prepared_statements")
    assert [row[0] for row in prepared] == [b"SELECT $1::int + $2, $3::text"]  # parsed once
    with pytest.raises(psycopg.errors.UndefinedTable):
        await session.query("SELECT * FROM no_such_table")
    assert session.usable and await session.query("SELECT 1") == [(b"1",)]
    with trio.move_on_after(0.2):
        await session.query("SELECT pg_sleep(5)")
    assert not session.usable  # (its result never read: the caller closes it)
    session.close()
