"""The highest fencing token a node has seen, kept on disk so a restart does not forget it.

Redis can go back in time (a failover to a replica that missed writes, a restart from an old file).
The acquire script floors the new token above the token the campaigning node says it has seen; a
node that forgot (it restarted) would accept a Redis that went back and could be issued a token it
had already used. With a state directory the memory survives restarts: one small file per job,
only ever raised, written atomically (write, fsync, rename) under an exclusive lock, so several
nodes on one host may share the directory (each then knows the others' tokens too, which only
helps).

Blocking file I/O: the actors call :meth:`TokenMemory.raise_to` through ``trio.to_thread``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from urllib.parse import quote


class TokenMemory:
    """The highest token seen for one job, in memory and (with ``state_dir``) on disk."""

    def __init__(self, job: str, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.job = job
        self.path = Path(state_dir) / f"{quote(job, safe='')}.token" if state_dir else None
        self.value = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.value = self._read()

    def _read(self) -> int:
        assert self.path is not None
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            raise ValueError(f"node.state_dir: {self.path} does not hold a fencing token: {text[:40]!r}")
        return int(text)

    def raise_to(self, token: int) -> bool:
        """Remember ``token`` if it is above what is known; True when the memory went up."""
        if token <= self.value:
            return False
        if self.path is None:
            self.value = token
            return True
        lock = self.path.with_suffix(".lock")
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            value = max(token, self._read())
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(f"{value}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.value = value
        return True
