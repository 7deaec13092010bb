"""Starting a throwaway local ``redis-server`` on a free loopback port (for the demo and the tests)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import attrs
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


class RedisServerMissing(RuntimeError):
    """``redis-server`` is not installed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class LocalRedis:
    """A ``redis-server`` child process listening on 127.0.0.1:``port``.

    ``persistence`` turns on an append-only file in ``directory`` so a restart keeps the data.
    """

    port: int = attrs.field(factory=free_port)
    persistence: bool = False
    directory: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="ingestion-redis-")))
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] | None = None  # extra environment (e.g. a clock shim for clock tests)
    config_file: Path | None = None  # a config file read first (a sentinel needs its own)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisServerMissing(
                "redis-server is not installed: install it (Debian: apt-get install -y redis-server)"
            )
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
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, **self.env} if self.env else None
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
        end = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.AuthenticationError:
                break  # up, and protected by a password: the caller knows it
            except redis.RedisError as exc:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise RuntimeError(f"redis-server exited: {err.strip()}") from exc
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError("redis-server did not answer PING in time") from exc
                time.sleep(0.02)
        client.close()
        return self

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
