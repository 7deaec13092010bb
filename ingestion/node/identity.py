"""What each job follows (its source identity) and where it commits (its sink identity),
recorded in its cursor hash by its first term, and the refusal to run a job that Redis says
another source wrote, or that commits elsewhere: records split between two sinks, or two
sources' records in one stream, are never repaired afterwards.

Both are checked at start-up (:func:`check_identities`: the node exits 2 with one line) and at
the start of every term (:class:`IdentifiedSource`: the job stops on that node, the others go
on), before the term writes anything.

A job older than the record is judged by what Redis holds: its cursor's shape (an RPC event id,
which a lake job's cursors share, or a Horizon paging token), and a cursor in Redis at all, which
only the events stream sink writes (a PostgreSQL job's cursor is in PostgreSQL). What Redis
cannot tell, a PostgreSQL job whose node now has no ``--sink`` (Redis holds no cursor for it), is
taken as the first term finds it: that term records the sink it is configured for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from actors.lease_store import (
    LeaseStore,
    RedisUnavailable,
    job_keys,
)
from actors.source import Batch, Source, SourceFatalError, TermFenced, current_term
from ingestion.config import JobSettings, Settings, redact_url
from ingestion.node.preflight import StartupError

# The kinds whose source identity is recorded and checked.
FOLLOWING = ("horizon", "rpc", "lake")


def source_identity(job: JobSettings) -> str:
    """What a job follows, as recorded in its cursor hash (field ``source``) by its first term:
    ``horizon /operations``, ``rpc [<getEvents filters>]``, ``lake s3://BUCKET/PREFIX (every
    event)`` (the lake, however its URL is written, and the filters), ``scheduled
    module:function``. An RPC job that backfills from a lake (``rpc.on_history_gap = "lake"``)
    follows RPC: its lake is where it reads what RPC no longer keeps, the same events."""
    if job.kind == "horizon":
        return f"horizon {job.resource}"
    if job.kind in ("rpc", "lake"):
        filters = [f.to_json() for f in job.rpc_filters()]
        which = "(every event)" if not filters else json.dumps(filters, separators=(",", ":"), sort_keys=True)
        if job.kind == "lake":
            # lazy: node start-up (lake.store, ~8 ms): lake jobs only
            from ingestion.lake.store import lake_identity

            return f"lake {lake_identity(job.lake_url)} {which}"
        return f"rpc {which}"
    if job.kind == "webhook" and job.webhook is not None:
        return f"webhook {job.webhook.source_job} -> {redact_url(job.webhook.url)}"
    return f"scheduled {job.action}"


def _cursor_kind(cursor: str | None) -> str | None:
    """The kind of source a committed cursor belongs to (a job older than the recorded identity):
    an RPC event id or a Horizon paging token."""
    if cursor is None or cursor in ("0", "now"):
        return None
    from ingestion.rpc.protocol import is_event_id  # lazy: node start-up (rpc.protocol, ~5 ms)

    # An RPC event id is always <19 digits>-<10 digits>; a Horizon effect's token is not padded.
    return "rpc" if len(cursor) == 30 and is_event_id(cursor) else "horizon"


def identity_conflict(job: JobSettings, recorded: str | None, cursor: str | None) -> str | None:
    """One line when the job's Redis state was written by a source configured otherwise."""
    if job.kind not in FOLLOWING:
        return None
    mine = source_identity(job)
    if recorded is not None:
        if recorded == mine:
            return None
        theirs = recorded
    else:
        kind = _cursor_kind(cursor)
        if kind in (None, job.kind) or (kind == "rpc" and job.kind == "lake"):
            return None  # (a lake job's cursors are RPC event ids)
        what = "an RPC event id" if kind == "rpc" else "a Horizon paging token"
        theirs = f"{kind} (its cursor {cursor} is {what})"
    return (
        f"node.job: job {job.name!r} in Redis follows {theirs}, this node is configured for "
        f"{mine}: give this job another name (--job NAME) or configure it as the other nodes"
    )


def sink_identity(job: JobSettings, schema: str) -> str:
    """Where a job commits, as recorded in its cursor hash (field ``sink``) by its first term:
    ``redis`` (the events stream) or ``postgres database DB schema SCHEMA`` (``sink.schema``).
    Not the server's address, which nodes configured alike may spell differently (each through
    a proxy or pooler of its own), nor a user or password
    (:func:`ingestion.postgres.connection.database_name`)."""
    if not job.sink:
        return "redis"
    # lazy: node start-up (~3 ms): PostgreSQL sinks only
    from ingestion.postgres.connection import database_name

    return f"postgres database {database_name(job.sink)} schema {schema}"


def sink_conflict(job: JobSettings, schema: str, recorded: str | None, cursor: str | None) -> str | None:
    """One line when the job's Redis state says it commits to another sink than this node's."""
    mine = sink_identity(job, schema)
    if recorded is not None:
        if recorded == mine:
            return None
        theirs = recorded
    elif cursor is not None and mine != "redis":
        theirs = f"redis (its cursor {cursor} is in Redis: the events stream holds its records)"
    else:
        return None
    return (
        f"node.job: job {job.name!r} in Redis commits to {theirs}, this node is configured for "
        f"{mine}: give this job another name (--job NAME) or configure its sink (sink.url, "
        f"sink.schema) as the other nodes"
    )


class IdentifiedSource:
    """A job's source that, at the start of each term, records what it follows and where it
    commits in the job's cursor hash (a fenced write, so only the leader's lands) or refuses to
    run when Redis says another source wrote this job or it commits elsewhere
    (:class:`SourceFatalError`: the job stops on this node). It does so before the term's first
    write: before a ``now`` start is pinned, else before the stream opens. Everything else is the
    wrapped source's. Redis not answering ends the term (``RedisUnavailable``: commit-unknown, in
    the Ingestor), and so does a refused write (:class:`TermFenced`: fenced), never the node."""

    def __init__(self, inner: Source, store: LeaseStore, job: JobSettings, schema: str = "ingestion") -> None:
        self.inner = inner
        self.store = store
        self.job = job
        self.schema = schema
        self._checked: int | None = None  # the token of the term that checked last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def resolve_start(self, cursor: str) -> str:
        await self._record()
        return await self.inner.resolve_start(cursor)

    @asynccontextmanager
    async def stream(self, cursor: str) -> AsyncIterator[trio.abc.ReceiveChannel[Batch]]:
        await self._record()
        async with self.inner.stream(cursor) as batches:
            yield batches

    async def _record(self) -> None:
        term = current_term.get()
        if self._checked == term.token:
            return
        key = job_keys(self.job.name)["cursor"]
        fields: Any = await self.store.run(self.store.client.hmget, key, ["source", "cursor", "sink"])
        recorded, stored_cursor, sink = fields
        conflict = identity_conflict(self.job, recorded, stored_cursor) or sink_conflict(
            self.job, self.schema, sink, stored_cursor
        )
        if conflict:
            raise SourceFatalError(conflict)
        missing = {}
        if recorded is None and self.job.kind in FOLLOWING:
            missing["source"] = source_identity(self.job)
        if sink is None:
            missing["sink"] = sink_identity(self.job, self.schema)
        if missing:
            refused = await self.store.fenced_hset(term.node, term.token, key, missing)
            if refused is not None:
                raise TermFenced(refused.reason)  # a newer term holds the job: this one is over
        self._checked = term.token


async def check_identities(settings: Settings, stores: dict[str, LeaseStore]) -> None:
    """Refuse to start (``StartupError``) when a hosted job's Redis state belongs to a source
    configured otherwise, or to another sink; Redis not answering is left to the terms (they
    check again)."""
    problems = []
    for job in settings.jobs:
        if job.kind == "webhook":
            continue  # (it delivers another job's records: its cursor is its deliveries')
        store = stores[job.name]
        try:
            fields: Any = await store.run(
                store.client.hmget, job_keys(job.name)["cursor"], ["source", "cursor", "sink"]
            )
            recorded, cursor, sink = fields
        except RedisUnavailable:
            continue
        conflict = identity_conflict(job, recorded, cursor) or sink_conflict(
            job, settings.sink.schema, sink, cursor
        )
        if conflict:
            problems.append(StartupError(conflict))
    if problems:
        raise ExceptionGroup("jobs configured otherwise", problems)


def _identified(source: Source, store: LeaseStore, job: JobSettings, schema: str = "ingestion") -> Source:
    """``source`` behind :class:`IdentifiedSource`: every job but a webhook's (which delivers
    another job's records, and whose source the node's metrics look for by its type)."""
    return source if job.kind == "webhook" else IdentifiedSource(source, store, job, schema)
