"""What a node knows of one job's history in one Redis deployment, kept on disk across restarts.

Redis can go back in time (a failover to a replica that missed writes, a restart from an old file).
The acquire script floors the new token above the token the campaigning node says it has seen; a
node that forgot (it restarted) would accept a Redis that went back and could be issued a token it
had already used. And a Redis that has lost the job's cursor lost something only if the job had
committed: the node remembers that it saw a commit (its own, or a committed cursor Redis showed
it), so that an empty Redis stops a job that had committed (``redis-state-lost``) but not one that
never did.

With a state directory the memory survives restarts: one small file per job *and Redis
deployment* (``<job>@<digest of the deployment>.token``, a JSON object naming both). Only ever
raised, written atomically (write, fsync, rename) under an exclusive lock, so several nodes on one
host may share the directory (each then knows the others' tokens too, which only helps).

The token floor is the highest token of *every* deployment file of the job (and of the file from
before the deployment was part of the name, ``<job>.token``, a bare number): a deployment is named
by how the URL spells it, and the same Redis reached by another spelling (an IP for a host name,
Sentinel for a plain URL) must not start from nothing. A floor that is too high is harmless
(tokens jump). Whether a commit was seen stays per deployment: two deployments served from one
host never take each other's commits for their own.

Blocking file I/O: the actors call :meth:`TokenMemory.raise_to` and :meth:`TokenMemory.saw_commit`
through :meth:`TokenMemory.bounded`, a worker thread bounded in time and abandoned on cancel; the
lock is taken without blocking, retried for a bounded while. A write that does not finish in time
raises ``TimeoutError`` and the caller logs it and goes on: the memory is an extra floor beside
the fencing check in Redis, never the guarantee. The values in memory are assigned under the lock
and only ever go up, so a late or abandoned write never lowers them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import trio

WRITE_TIMEOUT = 1.0  # seconds: the longest an actor waits on one write (lock, write, fsync)
LOCK_TIMEOUT = 0.5  # seconds: how long a write tries to take the file lock (non-blocking tries)
_LOCK_RETRY = 0.01  # seconds between tries


def memory_file_name(job: str, deployment: str) -> str:
    digest = hashlib.blake2b(deployment.encode(), digest_size=6).hexdigest()
    return f"{quote(job, safe='')}@{digest}.token"


class TokenMemory:
    """The highest token seen for one job on one Redis deployment, and whether a commit was seen;
    in memory and (with ``state_dir``) on disk."""

    def __init__(
        self, job: str, state_dir: str | os.PathLike[str] | None = None, *, deployment: str = ""
    ) -> None:
        self.job = job
        self.deployment = deployment
        self.path = Path(state_dir) / memory_file_name(job, deployment) if state_dir else None
        self.value = 0
        self.committed = False
        self.write_timeout = WRITE_TIMEOUT  # seconds, each write through :meth:`bounded`
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.value, self.committed = self._read()

    def _read(self) -> tuple[int, bool]:
        """(the token floor over every deployment's file and the legacy one, whether this
        deployment's file says a commit was seen)."""
        assert self.path is not None
        value, committed = self._read_legacy(), False
        for path in sorted(self.path.parent.glob(f"{quote(self.job, safe='')}@*.token")):
            token, saw = self._read_file(path)
            value = max(value, token)
            committed = committed or (path == self.path and saw)
        return value, committed

    def _read_file(self, path: Path) -> tuple[int, bool]:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return 0, False  # (renamed away meanwhile: its successor is read too, or was)
        try:
            doc = json.loads(text)
            token, committed = doc["token"], doc["committed"]
            named = (doc["job"], doc["deployment"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"node.state_dir: {path} does not hold a fencing token: {text[:40]!r}"
            ) from None
        mine = path == self.path
        if (
            named[0] != self.job
            or (mine and named[1] != self.deployment)
            or not isinstance(token, int)
            or token < 0
        ):
            on = f" on {self.deployment!r}" if mine else ""
            raise ValueError(
                f"node.state_dir: {path} does not hold a fencing token of job {self.job!r}{on}: "
                f"{text[:80]!r}"
            )
        return token, bool(committed)

    def _read_legacy(self) -> int:
        assert self.path is not None
        try:
            text = (self.path.parent / f"{quote(self.job, safe='')}.token").read_text().strip()
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else 0

    def raise_to(self, token: int) -> bool:
        """Remember ``token`` if it is above what is known; True when the memory went up."""
        if token <= self.value:
            return False
        return self._write(token, self.committed)

    def saw_commit(self) -> bool:
        """Remember that the job has committed on this deployment; True the first time."""
        if self.committed:
            return False
        return self._write(self.value, True)

    async def bounded(self, write: Callable[[], bool]) -> bool:
        """Run ``write`` (:meth:`raise_to` or :meth:`saw_commit`, bound) in a worker thread for at
        most ``write_timeout`` seconds; a cancelled or timed-out caller does not wait for it.

        Raises:
            TimeoutError: the lock or the disk did not answer in time (the write may still land).
            OSError, ValueError: the state directory cannot be written or read.
        """
        try:
            with trio.fail_after(self.write_timeout):
                return await trio.to_thread.run_sync(write, abandon_on_cancel=True)
        except trio.TooSlowError:
            raise TimeoutError(
                f"node.state_dir: writing {self.path} took over {self.write_timeout * 1000:.0f} ms"
            ) from None

    def _write(self, token: int, committed: bool) -> bool:
        if self.path is None:
            self.value, self.committed = max(self.value, token), self.committed or committed
            return True
        lock = self.path.with_suffix(".lock")
        with open(lock, "a") as held:
            _lock(held.fileno(), lock)
            on_disk, disk_committed = self._read()
            value, committed = max(token, on_disk), committed or disk_committed
            doc = {"job": self.job, "deployment": self.deployment, "token": value,
                   "committed": committed}  # fmt: skip
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(json.dumps(doc) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            # Under the lock, and only upwards: a write that finishes late (abandoned by its
            # caller, or overtaken by another thread's) never lowers what is known.
            self.value, self.committed = max(self.value, value), self.committed or committed
        return True


def _lock(fd: int, path: Path, timeout: float = LOCK_TIMEOUT) -> None:
    """Take the exclusive lock on ``fd`` without ever blocking for long (in a worker thread).

    Raises:
        TimeoutError: another process held it for ``timeout`` seconds.
    """
    give_up = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= give_up:
                raise TimeoutError(
                    f"node.state_dir: {path} is locked by another process for over "
                    f"{timeout * 1000:.0f} ms"
                ) from None
            time.sleep(_LOCK_RETRY)  # a worker thread, never a trio task
