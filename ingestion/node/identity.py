"""What each job follows (its source identity), recorded in its cursor hash by its first term, and
the refusal to run a job that Redis says another source wrote."""

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


def source_identity(job: JobSettings) -> str:
    """What a job follows, as recorded in its cursor hash (field ``source``) by its first term:
    ``horizon /operations``, ``rpc [<getEvents filters>]``, ``scheduled module:function``."""
    if job.kind == "horizon":
        return f"horizon {job.resource}"
    if job.kind == "rpc":
        filters = [f.to_json() for f in job.rpc_filters()]
        if not filters:
            return "rpc (every event)"
        return "rpc " + json.dumps(filters, separators=(",", ":"), sort_keys=True)
    if job.kind == "webhook" and job.webhook is not None:
        return f"webhook {job.webhook.source_job} -> {redact_url(job.webhook.url)}"
    return f"scheduled {job.action}"


def _cursor_kind(cursor: str | None) -> str | None:
    """The kind of source a committed cursor belongs to (a job older than the recorded identity):
    an RPC event id or a Horizon paging token."""
    if cursor is None or cursor in ("0", "now"):
        return None
    from ingestion.rpc.protocol import is_event_id

    # An RPC event id is always <19 digits>-<10 digits>; a Horizon effect's token is not padded.
    return "rpc" if len(cursor) == 30 and is_event_id(cursor) else "horizon"


def identity_conflict(job: JobSettings, recorded: str | None, cursor: str | None) -> str | None:
    """One line when the job's Redis state was written by a source configured otherwise."""
    if job.kind not in ("horizon", "rpc"):
        return None
    mine = source_identity(job)
    if recorded is not None:
        if recorded == mine:
            return None
        theirs = recorded
    else:
        kind = _cursor_kind(cursor)
        if kind in (None, job.kind):
            return None
        what = "an RPC event id" if kind == "rpc" else "a Horizon paging token"
        theirs = f"{kind} (its cursor {cursor} is {what})"
    return (
        f"node.job: job {job.name!r} in Redis follows {theirs}, this node is configured for "
        f"{mine}: give this job another name (--job NAME) or configure it as the other nodes"
    )


class IdentifiedSource:
    """A job's source that, at the start of each term, records what it follows in the job's
    cursor hash (a fenced write, so only the leader's lands) or refuses to run when Redis says
    another source wrote this job. Everything else is the wrapped source's. Redis not answering
    ends the term (``RedisUnavailable``: commit-unknown, in the Ingestor), and so does a refused
    write (:class:`TermFenced`: fenced), never the node."""

    def __init__(self, inner: Source, store: LeaseStore, job: JobSettings) -> None:
        self.inner = inner
        self.store = store
        self.job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def resolve_start(self, cursor: str) -> str:
        return await self.inner.resolve_start(cursor)

    @asynccontextmanager
    async def stream(self, cursor: str) -> AsyncIterator[trio.abc.ReceiveChannel[Batch]]:
        await self._record()
        async with self.inner.stream(cursor) as batches:
            yield batches

    async def _record(self) -> None:
        key = job_keys(self.job.name)["cursor"]
        fields: Any = await self.store.run(self.store.client.hmget, key, ["source", "cursor"])
        recorded, stored_cursor = fields
        conflict = identity_conflict(self.job, recorded, stored_cursor)
        if conflict:
            raise SourceFatalError(conflict)
        if recorded is None:
            term = current_term.get()
            refused = await self.store.fenced_hset(
                term.node, term.token, key, {"source": source_identity(self.job)}
            )
            if refused is not None:
                raise TermFenced(refused.reason)  # a newer term holds the job: this one is over


async def check_identities(settings: Settings, stores: dict[str, LeaseStore]) -> None:
    """Refuse to start (``StartupError``) when a hosted job's Redis state belongs to a source
    configured otherwise; Redis not answering is left to the terms (they check again)."""
    problems = []
    for job in settings.jobs:
        store = stores[job.name]
        try:
            fields: Any = await store.run(
                store.client.hmget, job_keys(job.name)["cursor"], ["source", "cursor"]
            )
            recorded, cursor = fields
        except RedisUnavailable:
            continue
        conflict = identity_conflict(job, recorded, cursor)
        if conflict:
            problems.append(StartupError(conflict))
    if problems:
        raise ExceptionGroup("jobs configured otherwise", problems)


def _identified(source: Source, store: LeaseStore, job: JobSettings) -> Source:
    return IdentifiedSource(source, store, job) if job.kind in ("horizon", "rpc") else source
