"""The events API built from the settings (``[api]``): what a node serves on ``api.port`` and what
``ingestion api --config FILE`` runs on its own (a read-only process that never campaigns)."""

from __future__ import annotations

import errno
from typing import Any

import trio

from ingestion.api.core import ApiRules
from ingestion.api.feed import LiveFeed
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.api.stream_reads import StreamReads
from ingestion.api.streaming import Streams
from ingestion.api.subscription import Limits
from ingestion.postgres.readers import configured_sink
from ingestion.rpc.protocol import Caps


class ApiStartError(Exception):
    """The API cannot start as configured: one line naming the setting and the fix."""


def read_url_of(settings: Any) -> str:
    """Where the API reads: ``api.read_url``, else the served job's sink."""
    return str(settings.api.read_url or configured_sink(settings, settings.api.job))


def rules_of(settings: Any) -> ApiRules:
    a = settings.api
    return ApiRules(
        Caps(a.max_filters, a.max_contract_ids, a.max_topics),
        a.max_limit,
        a.default_limit,
        a.network_passphrase,
        a.protocol_version,
    )


def build_app(settings: Any, log: Any, *, serve_metrics: bool = False) -> ApiApp:
    """The API app of ``settings`` (``api.job`` set).

    Raises:
        ApiStartError: no job, or the job's store is not PostgreSQL.
    """
    a = settings.api
    if not a.job:
        raise ApiStartError('api.job: name the job whose events the API serves ([api] job = "NAME")')
    url = read_url_of(settings)
    if not url.startswith(("postgres://", "postgresql://")):
        raise ApiStartError(
            f"api.read_url: the events API reads PostgreSQL; job {a.job!r} has no PostgreSQL sink "
            "(give api.read_url, the job's sink, or sink.url)"
        )
    reader = StoreReader(
        url, settings.sink.schema, a.job, statement_timeout=a.statement_timeout_ms / 1000,
        connections=a.connections,
    )  # fmt: skip
    return ApiApp(
        reader, rules_of(settings), body_limit=a.max_body_bytes, serve_metrics=serve_metrics, log=log,
        streams=streams_of(settings, reader, url),
    )  # fmt: skip


def streams_of(settings: Any, reader: StoreReader, url: str) -> Streams:
    """The subscriptions (``/ws``, ``GET /events``) over ``reader``'s view: its live feed
    listens at ``url`` (the replica's own notices when the API reads one: a replica relays no
    ``NOTIFY``, so there the feed re-reads each second)."""
    a = settings.api
    limits = Limits(outbox=a.stream_outbox, max_lag=a.stream_max_lag_ms / 1000)
    reads = StreamReads(reader)
    return Streams(LiveFeed(reads, url), reads, limits, a.max_subscribers)


def listen_host_of(settings: Any) -> str:
    return str(settings.api.listen_host or settings.observe.listen_host)


async def serve_settings(
    app: ApiApp,
    settings: Any,
    log: Any,
    port: int | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``api.listen_host`` and ``port`` (default ``api.port``) until cancelled.

    Raises:
        ApiStartError: the socket cannot be bound (in use, no such address, privileges).
    """
    host = listen_host_of(settings)
    port = settings.api.port if port is None else port
    try:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_api, app, host, port, log)
            task_status.started(bound)
    except* OSError as group:
        exc = group.exceptions[0]
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        code = getattr(exc, "errno", None)
        if code == errno.EADDRINUSE:
            raise ApiStartError(f"api.port: port {port} on {host} is in use: choose another") from None
        raise ApiStartError(f"api.listen_host: cannot listen on {host}:{port}: {exc}") from None
    finally:
        app.reader.close()
