"""Starting a throwaway local ``redis-server`` on a free loopback port (for the demo and the tests).

A free port can only be picked by binding it and letting it go, so another process may take it
before the child binds it. :meth:`LocalRedis.start` therefore does not trust any answer on the
port: it asks ``INFO server`` and accepts the server only when ``process_id`` is its own child's
pid. A child that could not bind (it exits with "Address already in use", or someone else answers)
is a :class:`PortInUse`; a port ``LocalRedis`` picked itself is then picked again, a bounded number
of times, while an explicit port (or a restart on the port already handed out) fails loudly.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

START_ATTEMPTS = 5  # ports picked before giving up: a clash is rare, five in a row is not chance


class RedisServerMissing(RuntimeError):
    """``redis-server`` is not installed."""


class PortInUse(RuntimeError):
    """Another process holds a port the ``redis-server`` child was to listen on."""


def free_port() -> int:
    """A loopback port that was free a moment ago (bound and released: someone may take it
    before its next user binds it, so that user must check what answers there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnPort:
    """A local server child on a loopback ``port``: 0 picks a free one here, and :meth:`_start_on_port`
    picks another while the picked one turns out taken before the child binds it. Once started,
    the port is the server's: a restart comes back on it or raises :class:`PortInUse`."""

    port: int
    _port_is_ours_to_pick: bool

    def _pick_port_if_unset(self) -> None:
        if self.port == 0:
            self.port = free_port()
            self._port_is_ours_to_pick = True

    def _start_on_port(self, start_once: Callable[[], None], attempts: int) -> None:
        attempt = 1
        while True:
            try:
                start_once()
            except PortInUse:
                if not self._port_is_ours_to_pick or attempt >= attempts:
                    raise
                attempt += 1
                self.port = free_port()
            else:
                self._port_is_ours_to_pick = False  # handed out: a restart must come back here
                return


@attrs.define
class LocalRedis(OwnPort):
    """A ``redis-server`` child process listening on 127.0.0.1:``port``.

    ``port`` 0 (the default) picks a free port now; if another process takes it before the child
    binds it, :meth:`start` picks another. Once started, the port is the server's: a later
    :meth:`start` (a restart) comes back on it or raises :class:`PortInUse`.
    ``persistence`` turns on an append-only file in ``directory`` so a restart keeps the data.
    ``username``/``password``: what :meth:`start` logs in with to check the server is its child
    (needed when ``extra_args`` or the config file turn on a password).
    """

    port: int = 0
    persistence: bool = False
    directory: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="ingestion-redis-")))
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] | None = None  # extra environment (e.g. a clock shim for clock tests)
    config_file: Path | None = None  # a config file read first (a sentinel needs its own)
    process: subprocess.Popen[bytes] | None = None
    username: str | None = None
    password: str | None = None
    _port_is_ours_to_pick: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._pick_port_if_unset()

    @property
    def log_file(self) -> Path:
        return self.directory / "redis-server.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0, attempts: int = START_ATTEMPTS) -> LocalRedis:
        """Start the child and wait until it, and not another process, answers on ``port``.

        Args:
            timeout: seconds each attempt may take until the child answers.
            attempts: ports tried when the port was picked here and someone else took it.

        Returns:
            ``self``, running; ``port`` and ``url`` are final.

        Raises:
            RedisServerMissing: no ``redis-server`` on the PATH.
            PortInUse: the port is someone else's (an explicit port, a restart, or ``attempts``
                picked ports in a row).
            RuntimeError: the child exited for another reason, or did not answer in time.
        """
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisServerMissing(
                "redis-server is not installed: install it (Debian: apt-get install -y redis-server)"
            )
        self._start_on_port(functools.partial(self._start_once, exe, timeout), attempts)
        return self

    def _start_once(self, exe: str, timeout: float) -> None:
        args = [
            exe,
            *([str(self.config_file)] if self.config_file else []),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.persistence else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.log_file),
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, **self.env} if self.env else None
        log_from = self.log_file.stat().st_size if self.log_file.exists() else 0  # this attempt's lines
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.process = process
        client = redis.Redis(
            host="127.0.0.1", port=self.port, username=self.username, password=self.password,
            socket_timeout=0.5, retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
        end = time.monotonic() + timeout
        try:
            while True:
                try:
                    pid = int(client.info("server")["process_id"])
                except redis.RedisError as exc:
                    # Not up yet, not a Redis, or a password we were not given: only the child's
                    # exit or the deadline decides.
                    if process.poll() is not None:
                        err = process.stderr.read().decode() if process.stderr else ""
                        if self.log_file.exists():
                            with self.log_file.open("rb") as log:
                                log.seek(log_from)
                                err += log.read()[-2000:].decode(errors="replace")
                        self.process = None
                        if "in use" in err:
                            raise PortInUse(f"127.0.0.1:{self.port} is taken: {err.strip()}") from exc
                        raise RuntimeError(f"redis-server exited: {err.strip()}") from exc
                    if time.monotonic() > end:
                        self.stop()
                        hint = (
                            " (it wants a password: give LocalRedis username/password)"
                            if isinstance(exc, redis.AuthenticationError) else ""
                        )  # fmt: skip
                        raise RuntimeError(f"redis-server did not answer INFO in time{hint}: {exc}") from exc
                    time.sleep(0.02)
                    continue
                if pid != process.pid:
                    self.stop()
                    raise PortInUse(
                        f"127.0.0.1:{self.port} is taken by another redis-server (pid {pid}, "
                        f"ours was {process.pid})"
                    )
                return
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None


def start_retrying(build: Callable[[], LocalRedis], attempts: int = START_ATTEMPTS) -> LocalRedis:
    """Start ``build()``, building afresh while a port it picked turns out to be taken.

    For servers with more ports than ``port`` (a TLS port, a cluster bus port) that ``build``
    picks itself: :meth:`LocalRedis.start` can only pick ``port`` again.

    Raises:
        PortInUse: ``attempts`` builds in a row clashed.
    """
    for attempt in range(1, attempts + 1):
        try:
            return build().start()
        except PortInUse:
            if attempt == attempts:
                raise
    raise ValueError(f"attempts must be at least 1, got {attempts}")
