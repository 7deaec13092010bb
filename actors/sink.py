"""Where a job's records and cursor live: the sink the CursorWriter commits through.

The election always stays in Redis; the *data* may live elsewhere. A :class:`Sink` does two
things, each atomic and fenced where the data lives:

- ``open_term(node, token)``: the first step of every term. A sink that keeps its own cursor
  (PostgreSQL) raises its fence for the job to ``token`` there (it never goes down) and answers
  the cursor committed there; the Redis stream sink keeps its cursor in the lease store, which the
  grant already read, so it does nothing (``TermOpened(cursor=None, own_cursor=False)``). A sink
  that keeps a fence of its own also records there which election domain (Redis deployment) owns
  the job, and refuses for good a term from another (:class:`TermRefused`): two deployments
  electing leaders for one job would otherwise fence each other out term after term.
- ``commit(node, token, previous_cursor, records, anchor, watermark)``: append the records and move the
  cursor, only if ``token`` still holds the fence and the records continue exactly from
  ``previous_cursor``. Answers :class:`~actors.lease_store.Committed` or
  :class:`~actors.lease_store.CommitRejected` (the same reasons as the Redis commit script), or
  raises :class:`SinkUnavailable` (or ``RedisUnavailable``): the outcome is unknown and the term
  must end, never retry.

A sink that can be out of reach while Redis is not (PostgreSQL) is also a :class:`ProbedSink`: the
Elector asks ``probe()`` before each campaign and holds off while it fails (a term that cannot
commit would only end commit-unknown, having used up a token). The probe answers the sink's fence,
and the Elector campaigns above it: Redis never issues a token the sink has already seen.

:func:`continuation` is the continuity rule both sinks share, pure: the Redis sink runs it again
in Lua, a SQL sink runs it in the client and checks the stored cursor in its transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from actors.cursor_order import InvalidPagingToken, is_after, token_key
from actors.lease_store import CommitRejected, Committed, LeaseStore
from actors.source import Record, Watermark


class SinkUnavailable(Exception):
    """A sink call failed or timed out: its effect is unknown (it may have been applied)."""


@attrs.frozen
class TermOpened:
    """The sink accepted the term. ``own_cursor``: the sink keeps the job's cursor, and
    ``cursor`` is the one committed there (None: nothing yet); else the lease store's counts."""

    cursor: str | None
    own_cursor: bool


@attrs.frozen
class TermRefused:
    """The sink refuses this node's terms for the job whatever their token: another election
    domain (the nodes of another Redis deployment) owns the job there. Retrying cannot help:
    the job stops on this node; ``problem`` names both domains and what to do."""

    problem: str


class Sink(Protocol):
    """One job's records and cursor (see the module docstring)."""

    @property
    def name(self) -> str:
        """``redis`` or ``postgres``: logged with fencing rejections (``sink``)."""
        ...

    @property
    def call_timeout(self) -> float:
        """Seconds: the longest one call may take (an in-flight commit's drain)."""
        ...

    async def open_term(self, node: str, token: int) -> TermOpened | CommitRejected | TermRefused: ...

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
        watermark: Watermark | None = None,
    ) -> Committed | CommitRejected: ...


@runtime_checkable
class ProbedSink(Protocol):
    probe_error: str | None  # why the last probe got no answer (None: it answered)

    async def probe(self) -> int | None:
        """One bounded round trip to where the data lives: None when it did not answer, else the
        highest token its fence for the job holds (0: none). Never raises."""
        ...


def continuation(previous_cursor: str | None, records: Sequence[Record], anchor: str | None) -> str | None:
    """The cursor after a batch, or why the batch cannot follow ``previous_cursor``.

    Returns the new cursor (the anchor when given, else the last record's paging token) or None
    when the batch is empty with no anchor. Every paging token must be well formed and strictly
    after the one before it, the first strictly after ``previous_cursor`` (None: the start).

    Raises:
        ValueError: ``bad-paging-token`` or ``not-after-cursor`` (the Redis script's reasons).
    """
    last = previous_cursor
    for token in [r.paging_token for r in records] + ([anchor] if anchor is not None else []):
        try:
            token_key(token)
            after = is_after(token, last)
        except InvalidPagingToken as exc:
            raise ValueError("bad-paging-token") from exc
        if not after:
            raise ValueError("not-after-cursor")
        last = token
    return last if (records or anchor is not None) else None


class RedisStreamSink:
    """Today's sink: the job's events stream and cursor in Redis, committed by the lease store's
    commit script (fenced by the lease itself)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    @property
    def name(self) -> str:
        return "redis"

    @property
    def call_timeout(self) -> float:
        return self.store.call_timeout

    async def open_term(self, node: str, token: int) -> TermOpened | CommitRejected | TermRefused:
        return TermOpened(cursor=None, own_cursor=False)  # the grant carried Redis's cursor

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
        watermark: Watermark | None = None,
    ) -> Committed | CommitRejected:
        return await self.store.commit(
            node, token, previous_cursor, records, anchor=anchor, watermark=watermark
        )
