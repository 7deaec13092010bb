"""Connections to the PostgreSQL sink's server, shared by the sink, the fence and the read-only
tools: a fresh autocommit connection bounded by the server as well (:func:`connect`), the schema
made ready (:func:`ensure_schema`; :func:`sink_problem` at start), a failure in one line
without the password (:func:`redact`, :func:`describe`, :func:`is_config_error`), and which
database a URL names (:func:`database_name`, part of a job's recorded sink).

Every session runs READ COMMITTED, whatever the server's default: the fence depends on it. A
new term's ``open_term`` (or a fenced transaction) may wait on the fence row while the previous
term's commit holds it; under READ COMMITTED each statement after the wait takes a new snapshot
and sees that commit, so the term resumes from the cursor and ``seq`` it left. Under REPEATABLE
READ (an ``ALTER DATABASE/ROLE ... SET default_transaction_isolation``) the snapshot is the one
taken before the wait: the term reads a cursor already moved (its first commit refused
``cursor-moved``), records a wrong ``terms.after_seq``, and fenced job code misses the older
term's writes. A startup option outranks database and role settings, so :func:`connect` pins it
there.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ingestion.common.redact import redact as redact_text
from ingestion.postgres import sql

THREADS = 4  # worker threads per sink (or fence) at most, abandoned ones included


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgres://", "postgresql://"))


def redact(url: str) -> str:
    """The URL without its password (``user:***@``, ``password=***``) or any token
    (:func:`ingestion.common.redact.redact`)."""
    return redact_text(url)


def database_name(url: str) -> str:
    """The database ``url`` names (the one libpq would pick: the user's name when none is
    given), part of a job's recorded sink. Not the host or port: nodes configured alike may
    reach one server by different addresses (a proxy or a pooler of their own, a name and an
    IP address), and no user, password or option.

    Raises:
        psycopg.ProgrammingError: not a connection string.
    """
    params = psycopg.conninfo.conninfo_to_dict(url)
    return str(params.get("dbname") or params.get("user") or "")


def describe(exc: BaseException, url: str) -> str:
    """One line for a failed call, naming the setting, never the password."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    password = psycopg.conninfo.conninfo_to_dict(url).get("password") if is_postgres_url(url) else None
    if password:
        text = text.replace(str(password), "***")
    return f"sink.url {redact(url)}: {text}"


def is_config_error(exc: BaseException) -> bool:
    """A failure that retrying cannot fix: credentials, privileges, no such database."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege | psycopg.errors.InvalidCatalogName
                  | psycopg.errors.InvalidAuthorizationSpecification | psycopg.errors.InvalidPassword):
        return True  # fmt: skip
    text = str(exc)
    return any(s in text for s in (
        "password authentication failed", "no password supplied", "does not exist",
        "permission denied", "role \"",
    ))  # fmt: skip


def connect(url: str, timeout: float, application: str = "ingestion") -> psycopg.Connection[Any]:
    """A fresh autocommit connection whose statements the server bounds as well, whose
    transactions are READ COMMITTED whatever the server's default (see the module docstring), and
    whose client gives up on a dead peer within a few call bounds (keepalives,
    ``tcp_user_timeout``) rather than the kernel's minutes."""
    ms = max(100, round(timeout * 1000))
    return psycopg.connect(
        url,
        autocommit=True,
        connect_timeout=max(2, round(timeout + 0.5)),
        application_name=application,
        options=(
            f"-c statement_timeout={4 * ms} -c idle_in_transaction_session_timeout={8 * ms} "
            "-c default_transaction_isolation=read\\ committed"  # see the module docstring
        ),
        keepalives=1,
        keepalives_idle=max(1, round(timeout)),
        keepalives_interval=1,
        keepalives_count=3,
        tcp_user_timeout=4 * ms,
    )


def ensure_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create what is missing of the contract in ``schema`` (``ingestion/postgres/sql.py``);
    serialised between nodes by an advisory lock.

    Raises:
        SchemaMismatch: a table exists with other columns.
        psycopg.Error: the server refused (privileges) or failed.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"ingestion-schema:{schema}",))
        exists = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
        if exists is None:
            conn.execute(f"CREATE SCHEMA {sql.quoted(schema)}")  # type: ignore[arg-type]
        for table in sql.COLUMNS:
            found = conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                (schema, table),
            ).fetchall()
            columns = [(str(c), str(t)) for c, t in found]
            problem = sql.column_problem(schema, table, columns)
            if problem:
                raise sql.SchemaMismatch(problem)
            if not found:
                conn.execute(sql.create_table(schema, table))  # type: ignore[arg-type]
            for column, ddl in sql.missing_columns(table, columns) if found else ():
                conn.execute(sql.add_column(schema, table, column, ddl))  # type: ignore[arg-type]
        for name in sql.FUNCTIONS:
            row = conn.execute(
                "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = %s AND p.proname = %s", (schema, name),
            ).fetchone()
            if row is None or row[0] != sql.function_body(schema, name):
                conn.execute(sql.create_function(schema, name))  # type: ignore[arg-type]


def sink_problem(url: str, schema: str, timeout: float) -> str | None:
    """At start: create what is missing of ``schema`` at ``url``; one line when retrying cannot
    help (credentials, privileges, no such database: ``sink.url``; other columns: ``sink.schema``),
    None when it is ready or the server does not answer (an outage: each term tries again)."""
    try:
        with connect(url, timeout, "ingestion-check") as conn:
            ensure_schema(conn, schema)
    except sql.SchemaMismatch as exc:
        return str(exc)
    except psycopg.Error as exc:
        if is_config_error(exc):
            return describe(exc, url)
        return None
    return None
