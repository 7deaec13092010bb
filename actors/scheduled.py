"""Singleton jobs beyond ingestion: a periodic job (retention, reconciliation, a scheduler) run
under the same election, lease scope and fencing as Horizon ingestion.

A :class:`ScheduledJob` is a :class:`~actors.source.Source` whose records are *runs*: run ``k``
(1-based) has paging token ``str(k)`` and its body is the JSON result of ``action(k, term)``. The
Ingestor commits each run with the term's fencing token, so the events stream records every run
exactly once, in order, each under the token of the leader that ran it, and after a failover the
new leader goes on with the next run. The action runs inside the lease's cancel scope: it is
cancelled before the lease can expire.

The action's own side effects must be fenced (``LeaseStore.fenced_hset`` with ``term.token``) and
idempotent per run number: a leader that dies after the side effect but before the commit leaves
run ``k`` to its successor, which runs it again; a stale leader's fenced writes are rejected.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import attrs
import trio

from actors.source import Batch, Record, TermContext, current_term

Action = Callable[[int, TermContext], Awaitable[dict[str, Any]]]


@attrs.frozen
class ScheduledJob:
    """Run ``action`` every ``period`` seconds (after the previous run committed), ``runs`` times
    in all (None: forever)."""

    action: Action
    period: float
    runs: int | None = None

    async def resolve_start(self, cursor: str) -> str:
        return "0" if cursor == "now" else cursor

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        term = current_term.get()
        done = int(cursor)
        while self.runs is None or done < self.runs:
            run = done + 1
            result = await self.action(run, term)
            body = json.dumps({"run": run, "token": term.token, "node": term.node, "result": result})
            yield Batch((Record(str(run), body),))
            done = run
            await trio.sleep(self.period)
