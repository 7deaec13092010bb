"""The PostgreSQL sink's tests' fixtures: the sink's URL, on the server's default isolation level
and on a database whose sessions default to REPEATABLE READ."""

from __future__ import annotations

import pytest

from ingestion.testing.local_postgres import LocalPostgres


@pytest.fixture(scope="module")
def repeatable_read_url(pg: LocalPostgres) -> str:
    """A database of the module's server whose sessions default to REPEATABLE READ (``ALTER
    DATABASE``, as an operator may have set it): the sink must pin its own isolation level."""
    pg.psql("CREATE DATABASE repeatable_read")
    pg.psql("ALTER DATABASE repeatable_read SET default_transaction_isolation = 'repeatable read'")
    return pg.url_for("postgres", pg.password, "repeatable_read")


@pytest.fixture(params=["server-default", "repeatable-read-default"])
def url(request: pytest.FixtureRequest, pg: LocalPostgres) -> str:
    """The sink's URL: the server's default database (READ COMMITTED), then one whose default
    isolation level is REPEATABLE READ."""
    if request.param == "server-default":
        return pg.url
    return str(request.getfixturevalue("repeatable_read_url"))
