"""The pipe from a node's worker to its parent: which leases the worker holds.

The worker reports every lease it acquires and every lease it releases, one line each, as soon as
Redis answered:

    acquired <job> <token>|<node>\\n
    released <job> <token>|<node>\\n

(job names hold no spaces, ``|`` or newlines: ``ingestion/config/jobs.py``). The parent keeps
:class:`HeldLeases`, the latest ``token|node`` acquired per job and not released since, and when
the worker dies it releases exactly those with the fenced release script.

The view is allowed to be stale in both directions, because the release script checks
``token|node`` atomically and frees nothing else:

- a ``released`` line lost (the worker died between the release and the report) leaves an entry
  whose release answers 0: harmless;
- an ``acquired`` line lost (the worker died between Redis's answer and the report, or the pipe
  was full) leaves a lease the parent does not know: it expires by itself, the TTL path;
- an entry for a lease that was lost since (expired, taken by another node under a newer token)
  cannot match the lease value any more: its release answers 0.

The lines and :class:`HeldLeases` are pure; :func:`lease_reporter` is the worker's writing end.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import attrs

ACQUIRED = "acquired"
RELEASED = "released"


class MalformedReport(ValueError):
    """A line on the lease pipe that is not a report: the worker's side of the protocol broke."""


@attrs.frozen
class LeaseReport:
    """One line on the pipe: the worker acquired or released ``token|node`` of ``job``."""

    kind: str  # ACQUIRED or RELEASED
    job: str
    token: int
    node: str

    def encode(self) -> bytes:
        return f"{self.kind} {self.job} {self.token}|{self.node}\n".encode()

    @classmethod
    def parse(cls, line: bytes) -> LeaseReport:
        """Raises:
        MalformedReport: not ``<acquired|released> <job> <token>|<node>``."""
        try:
            kind, job, value = line.decode().rstrip("\n").split(" ", 2)
            token, bar, node = value.partition("|")
            if kind not in (ACQUIRED, RELEASED) or not bar or not job or not node:
                raise ValueError(line)
            return cls(kind, job, int(token), node)
        except ValueError as exc:
            raise MalformedReport(f"not a lease report: {line!r}") from exc


@attrs.define
class HeldLeases:
    """The parent's view: per job, the ``(token, node)`` the worker acquired and has not released.

    ``feed`` takes the pipe's bytes in any chunking; a partial last line waits for the rest.
    """

    held: dict[str, tuple[int, str]] = attrs.Factory(dict)
    _partial: bytes = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Apply every complete line; returns the lines that were not reports (skipped, for the
        caller to log: the rest of the pipe still means what it says)."""
        *lines, self._partial = (self._partial + data).split(b"\n")
        bad = []
        for line in lines:
            try:
                self.apply(LeaseReport.parse(line))
            except MalformedReport:
                bad.append(line)
        return bad

    def apply(self, report: LeaseReport) -> None:
        if report.kind == ACQUIRED:
            # A newer term replaces an older one: the worker holds at most one lease per job.
            self.held[report.job] = (report.token, report.node)
        elif self.held.get(report.job) == (report.token, report.node):
            del self.held[report.job]

    def leases(self) -> list[tuple[str, int, str]]:
        """``(job, token, node)`` for every lease the worker may still hold, by job."""
        return [(job, token, node) for job, (token, node) in sorted(self.held.items())]


def lease_reporter(write_end: int, log: Any) -> Any:
    """The worker's ``LeaseStore.on_lease``: one line on the pipe per acquire and release."""
    dropped = False

    def report(kind: str, job: str, token: int, node: str) -> None:
        nonlocal dropped
        try:
            os.write(write_end, LeaseReport(kind, job, token, node).encode())
        except BlockingIOError:
            if not dropped:
                dropped = True
                log.warning("lease-report-dropped", job=job, token=token, kind=kind)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise  # EPIPE: the parent is gone, and this process is about to be killed

    return report
