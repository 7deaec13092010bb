"""A history gap, for any source: the job's position is older than what the source still keeps.

Resuming would silently skip the records in between, so by default the job stops before writing
anything (``history-gap`` logged as an error, :class:`SourceFatalError`). With ``on_history_gap =
"skip"`` the gap is recorded first, as a ``history-gap`` entry in the job's audit stream fenced by
the term's token, and the source goes on from the oldest ledger it keeps. With ``"lake"`` (an RPC
job with a data lake behind it) the entry is the same but says ``action: lake``: nothing is
skipped, the events in between are read from the lake, then the job goes on on RPC.

Either way the gap is told to the listener in :data:`history_gap_listener` (the node process sets
one that counts gaps per job for the metrics), since a stopped job leaves nothing in Redis.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from actors.source import SourceFatalError
from ingestion.common.http import describe
from ingestion.common.redact import redact

log = structlog.get_logger()

Audit = Callable[[str, dict[str, str]], Awaitable[bool]]
GapListener = Callable[[str, Mapping[str, Any]], None]  # (action, the log line's fields)

history_gap_listener: contextvars.ContextVar[GapListener | None] = contextvars.ContextVar(
    "history_gap_listener", default=None
)


def _tell(action: str, fields: Mapping[str, Any]) -> None:
    listener = history_gap_listener.get()
    if listener is not None:
        listener(action, fields)


async def record_history_gap(
    fields: Mapping[str, Any],
    *,
    on_history_gap: str,
    audit: Audit | None,
    stop_message: str,
    resume: Mapping[str, Any],
) -> str | None:
    """Act on a gap described by ``fields`` (``cursor``, ``cursor_ledger``, ``elder_ledger`` and
    the source's URL).

    Returns None once the gap is recorded (the caller resumes from the oldest ledger, or from the
    lake for ``"lake"``; ``resume`` is logged with it), or why the audit entry could not be written
    (the caller retries later).

    Raises:
        SourceFatalError: ``on_history_gap`` is ``"stop"``; ``stop_message`` says what to do.
    """
    if on_history_gap == "stop":
        log.error("history-gap", **fields, action="stop")
        _tell("stop", fields)
        raise SourceFatalError(stop_message)
    action = "lake" if on_history_gap == "lake" else "skip"
    if audit is not None:
        entry = {k: redact(str(v)) for k, v in fields.items()}  # (the source's URL may hold a key)
        if action == "lake":
            entry["action"] = "lake"
        try:
            written = await audit("history-gap", entry)
            error = "" if written else "the term's fencing token is no longer current"
        except Exception as exc:  # the audit writer's own failure (Redis): retry later
            written, error = False, describe(exc)
        if not written:
            return f"history-gap audit entry: {error}"
    log.warning("history-gap", **fields, action=action, **resume)
    _tell(action, fields)
    return None
