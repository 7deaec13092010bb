"""What a node knows of one job's history in one Redis deployment, kept on disk across restarts.

Redis can go back in time (a failover to a replica that missed writes, a restart from an old file).
The acquire script floors the new token above the token the campaigning node says it has seen; a
node that forgot (it restarted) would accept a Redis that went back and could be issued a token it
had already used. And a Redis that has lost the job's cursor lost something only if the job had
committed: the node remembers that it saw a commit (its own, or a committed cursor Redis showed
it), so that an empty Redis stops a job that had committed (``redis-state-lost``) but not one that
never did.

With a state directory the memory survives restarts: one small file per job *and Redis
deployment* (``<job>@<digest of the deployment>.token``, a JSON object naming both), so two
deployments served from one host never read each other's tokens. Only ever raised, written
atomically (write, fsync, rename) under an exclusive lock, so several nodes on one host may share
the directory (each then knows the others' tokens too, which only helps).

A file from before the deployment was part of the name (``<job>.token``, a bare number) is read
once for its token when the new file does not exist yet: a token floor that is too high is
harmless (tokens jump), and it says nothing of a commit.

Blocking file I/O: the actors call :meth:`TokenMemory.raise_to` and :meth:`TokenMemory.saw_commit`
through ``trio.to_thread``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote


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
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.value, self.committed = self._read()

    def _read(self) -> tuple[int, bool]:
        assert self.path is not None
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return self._read_legacy(), False
        try:
            doc = json.loads(text)
            token, committed = doc["token"], doc["committed"]
            named = (doc["job"], doc["deployment"])
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"node.state_dir: {self.path} does not hold a fencing token: {text[:40]!r}"
            ) from None
        if named != (self.job, self.deployment) or not isinstance(token, int) or token < 0:
            raise ValueError(
                f"node.state_dir: {self.path} does not hold a fencing token of job {self.job!r} "
                f"on {self.deployment!r}: {text[:80]!r}"
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

    def _write(self, token: int, committed: bool) -> bool:
        if self.path is None:
            self.value, self.committed = token, committed
            return True
        lock = self.path.with_suffix(".lock")
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
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
        self.value, self.committed = value, committed
        return True
