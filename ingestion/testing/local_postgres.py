"""A throwaway local PostgreSQL server on a free loopback port (for the demo, the tests and the
benchmark), from Debian's ``postgresql`` package (``/usr/lib/postgresql/*/bin``).

PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres`` run as the ``postgres``
user (``Popen(user=...)``, which execs directly, so the child's pid is the server's) in a
temporary directory it owns. As with ``ingestion/testing/local_redis.py``, no answer on the port is
trusted: :meth:`LocalPostgres.start` accepts the server only when its ``data_directory`` is ours
and that directory's ``postmaster.pid`` names our child's pid; a port someone else took is picked
again, a bounded number of times.

The superuser ``postgres`` logs in over TCP with :attr:`password` (scram-sha-256), so that a
wrong password is refused as it would be in production.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import psycopg

from ingestion.testing.local_redis import OwnPort, PortInUse

START_ATTEMPTS = 5


class PostgresServerMissing(RuntimeError):
    """No PostgreSQL server binaries are installed."""


def server_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``postgres`` (None: not installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _as_postgres() -> dict[str, Any]:
    """Popen arguments that run the child as the ``postgres`` user when we are root."""
    return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}


@attrs.define
class LocalPostgres(OwnPort):
    """A ``postgres`` child process on 127.0.0.1:``port`` with a data directory of its own.

    ``durable`` False (the tests) turns off fsync: the data survives a restart of the server,
    not of the machine.
    """

    port: int = 0
    password: str = "secret"
    durable: bool = False
    directory: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="ingestion-pg-")))
    process: subprocess.Popen[bytes] | None = None
    _port_is_ours_to_pick: bool = attrs.field(init=False, default=False)
    _initialised: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._pick_port_if_unset()

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def url(self) -> str:
        return self.url_for("postgres", self.password)

    def url_for(self, user: str, password: str, database: str = "postgres") -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def _initdb(self, bindir: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        pwfile = self.directory / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        subprocess.run(
            [
                str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--pwfile", str(pwfile),
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
                "--no-sync",
            ],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/", **_as_postgres(),
        )  # fmt: skip
        pwfile.unlink()
        self._initialised = True

    def start(self, timeout: float = 20.0, attempts: int = START_ATTEMPTS) -> LocalPostgres:
        """Start the server (initialising its data directory the first time) and wait until it,
        and not another process, answers on ``port``.

        Raises:
            PostgresServerMissing: Debian's ``postgresql`` package is not installed.
            PortInUse: the port is someone else's (a restart, or ``attempts`` picks in a row).
            RuntimeError: the server exited for another reason, or did not answer in time.
        """
        bindir = server_bin()
        if bindir is None:
            raise PostgresServerMissing(
                "PostgreSQL is not installed: install it (Debian: apt-get install -y postgresql)"
            )
        if not self._initialised and not (self.data / "PG_VERSION").exists():
            self._initdb(bindir)  # (a data directory that holds a cluster is started as it is)
        self._start_on_port(functools.partial(self._start_once, bindir, timeout), attempts)
        return self

    def _start_once(self, bindir: Path, timeout: float) -> None:
        args = [
            str(bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.directory}",
            "-c", f"fsync={'on' if self.durable else 'off'}", "-c", "max_connections=200",
            "-c", "logging_collector=off", "-c", "log_min_messages=fatal",
        ]  # fmt: skip
        log = (self.directory / "server.log").open("ab")
        process = subprocess.Popen(args, stdout=log, stderr=log, cwd="/", **_as_postgres())
        log.close()
        self.process = process
        end = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                text = (self.directory / "server.log").read_text(errors="replace")
                if "could not bind" in text.splitlines()[-5:].__str__() or "Address already in use" in text:
                    raise PortInUse(f"port {self.port}: in use by another process")
                raise RuntimeError(f"postgres exited with {process.returncode}: {text[-2000:]}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
                answered = Path(row[0]) if row else None
                pid_file = self.data / "postmaster.pid"
                pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
                if answered != self.data or pid != process.pid:
                    self.stop()
                    raise PortInUse(f"port {self.port}: another PostgreSQL answers there")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"postgres did not answer on port {self.port} in {timeout} s") from exc
                time.sleep(0.05)

    def psql(self, sql: str) -> None:
        """Run ``sql`` as the superuser (set-up in tests: roles, grants)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (fast shutdown: SIGINT), killing it if it does not stop in time."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(2)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """SIGKILL the server (it recovers from its WAL on the next start)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
