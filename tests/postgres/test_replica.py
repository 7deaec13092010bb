"""The streaming replica fixture (``ingestion/testing/pg_replica.py``): a real hot standby of a
local PostgreSQL, made by ``pg_basebackup``, whose replay a test can hold back."""

from __future__ import annotations

import psycopg
import pytest

from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.pg_replica import StreamingReplica


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM replicated").fetchone()
    return int(row[0]) if row else -1


def test_a_replica_streams_and_a_paused_one_shows_only_what_it_replayed(
    pg: LocalPostgres, replica: StreamingReplica
) -> None:
    assert replica.is_in_recovery() and replica.url != pg.url
    pg.psql("CREATE TABLE replicated (n int); INSERT INTO replicated VALUES (1)")
    replica.wait_replayed()
    assert _count(replica.url) == 1
    replica.pause_replay()
    pg.psql("INSERT INTO replicated VALUES (2), (3)")
    replica.wait_received()  # the WAL is there, not applied
    assert _count(pg.url) == 3 and _count(replica.url) == 1
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        with psycopg.connect(replica.url) as conn:
            conn.execute("INSERT INTO replicated VALUES (4)")
    replica.resume_replay()
    replica.wait_replayed()
    assert _count(replica.url) == 3
