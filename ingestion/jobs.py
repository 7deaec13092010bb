"""Actions for scheduled jobs declared in config (``kind = "scheduled"``, ``action = "module:fn"``).

An action is ``async def action(run: int, term: TermContext) -> dict``: run ``run`` (1-based) of the
job, inside the leader's term (``term.node``, ``term.token`` fence its own side effects). Its result
is committed as the run's record, so every run is recorded exactly once, by the leader that ran it
(see :mod:`actors.scheduled`).
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from actors.source import TermContext


async def heartbeat(run: int, term: TermContext) -> dict[str, Any]:
    """Record that the job ran: where, under which token, and when (wall clock, for people)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
    }
