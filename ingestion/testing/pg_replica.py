"""A real PostgreSQL streaming replica of a :class:`~ingestion.testing.local_postgres.LocalPostgres`
(for the tests and benchmarks of readers that may read a replica, such as the events API's
``api.read_url``).

:meth:`StreamingReplica.start` takes a base backup of the primary with Debian's ``pg_basebackup``
(as the ``postgres`` user when root, over TCP with the superuser's password, ``-R``: it writes
``standby.signal`` and the ``primary_conninfo`` to stream from) into a directory of its own and
starts a second ``postgres`` on it, on a free loopback port, with the same checks as the primary
(the port's server is ours). A hot standby: it answers read-only queries with what it has replayed.

Replay can be paused (``pg_wal_replay_pause()``): the replica then still receives the primary's
WAL but shows none of it, which is how a test holds a replica behind its primary on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import psycopg

from ingestion.testing.local_postgres import LocalPostgres, PostgresServerMissing, server_bin


def _query(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
    return row[0] if row else None


@attrs.define
class StreamingReplica:
    """A hot standby streaming from ``primary``; ``server`` is its own :class:`LocalPostgres`
    (stop it, restart it, read :attr:`url`), over a copy of the primary's data directory."""

    primary: LocalPostgres
    server: LocalPostgres

    @property
    def url(self) -> str:
        return self.server.url

    @classmethod
    def start(cls, primary: LocalPostgres, timeout: float = 60.0) -> StreamingReplica:
        """Base-back-up the running ``primary`` and start its replica (streaming once it answers).

        Raises:
            PostgresServerMissing: Debian's ``postgresql`` package is not installed.
            subprocess.CalledProcessError: ``pg_basebackup`` failed (its stderr attached).
            RuntimeError: the replica did not start or did not stream within ``timeout``.
        """
        bindir = server_bin()
        if bindir is None:
            raise PostgresServerMissing(
                "PostgreSQL is not installed: install it (Debian: apt-get install -y postgresql)"
            )
        directory = Path(tempfile.mkdtemp(prefix="ingestion-pg-replica-"))
        as_postgres: dict[str, Any] = {}
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
            as_postgres = {"user": "postgres", "group": "postgres"}
        try:
            subprocess.run(
                [
                    str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
                    "-U", "postgres", "-D", str(directory / "data"), "-R", "-X", "stream",
                    "--checkpoint=fast", "--no-sync",
                ],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/", timeout=timeout,
                env={**os.environ, "PGPASSWORD": primary.password}, **as_postgres,
            )  # fmt: skip
            server = LocalPostgres(password=primary.password, directory=directory).start(timeout=timeout)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        replica = cls(primary, server)
        replica.wait_streaming(timeout)
        return replica

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Wait until the replica's WAL receiver streams from the primary.

        Raises:
            RuntimeError: not streaming within ``timeout``.
        """
        end = time.monotonic() + timeout
        while _query(self.url, "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'") != 1:
            if time.monotonic() > end:
                raise RuntimeError(f"the replica on port {self.server.port} does not stream from the primary")
            time.sleep(0.02)

    def is_in_recovery(self) -> bool:
        return bool(_query(self.url, "SELECT pg_is_in_recovery()"))

    def pause_replay(self) -> None:
        """Stop applying WAL (it is still received): the replica's data stays as it is now."""
        _query(self.url, "SELECT pg_wal_replay_pause()")
        while _query(self.url, "SELECT pg_get_wal_replay_pause_state()") != "paused":
            time.sleep(0.01)

    def resume_replay(self) -> None:
        _query(self.url, "SELECT pg_wal_replay_resume()")

    def received_lsn(self) -> str:
        """The last WAL position received from the primary (applied or not)."""
        return str(_query(self.url, "SELECT pg_last_wal_receive_lsn()"))

    def replayed_lsn(self) -> str:
        """The last WAL position applied: what the replica's queries see."""
        return str(_query(self.url, "SELECT pg_last_wal_replay_lsn()"))

    def primary_lsn(self) -> str:
        return str(_query(self.primary.url, "SELECT pg_current_wal_lsn()"))

    def wait_received(self, timeout: float = 30.0) -> None:
        """Wait until the replica has received every WAL record the primary has written so far."""
        self._wait("pg_last_wal_receive_lsn()", timeout)

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Wait until the replica has applied every WAL record the primary has written so far."""
        self._wait("pg_last_wal_replay_lsn()", timeout)

    def _wait(self, what: str, timeout: float) -> None:
        end, target = time.monotonic() + timeout, self.primary_lsn()
        while _query(self.url, f"SELECT {what} < '{target}'::pg_lsn"):
            if time.monotonic() > end:
                raise RuntimeError(f"the replica's {what} is still behind the primary after {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.stop()

    def cleanup(self) -> None:
        self.server.cleanup()
