"""``ingestion api``: serve the events API on its own, a read-only process that never campaigns.

It reads the store of ``[api] job`` (``api.read_url``: a streaming replica, say; else the job's
sink) and answers stellar-rpc's JSON-RPC at ``POST /`` and its own metrics at ``GET /metrics``,
until SIGINT or SIGTERM. It never joins the election and never writes: run as many as reads
need, apart from the ingesting nodes (docs/API.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import structlog
import trio

from ingestion.cli.usage import OneLineParser, UsageError, flags_layer, setting_help
from ingestion.config import load
from ingestion.node.logs import configure_logging


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion api",
        description="Serve the events API (stellar-rpc's getEvents over every event held) on its own: "
        "read-only, never elected.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--job", help=setting_help("the job whose events are served", ("api", "job")))
    p.add_argument("--port", type=int, metavar="P", help=setting_help("the HTTP port", ("api", "port")))
    p.add_argument(
        "--read-url", metavar="URL",
        help=setting_help("the PostgreSQL to read (a replica)", ("api", "read_url")),
    )  # fmt: skip
    return p


def main(argv: Sequence[str]) -> int:
    from ingestion.api.service import ApiStartError, build_app, serve_settings  # lazy: CLI start-up (~300 ms)
    from ingestion.node.heap import settle  # lazy: CLI start-up

    args = parser().parse_args(list(argv))
    given = {("api", "job"): args.job, ("api", "port"): args.port, ("api", "read_url"): args.read_url}
    settings = load(args.config, os.environ, flags_layer(given))
    if not settings.api.port:
        raise UsageError("ingestion api: no port: give --port P or api.port (0 is off)")
    configure_logging(settings.log.level, settings.log.format)
    log = structlog.get_logger().bind(api=settings.api.job, pid=os.getpid())
    try:
        app = build_app(settings, log, serve_metrics=True)
    except ApiStartError as exc:
        raise UsageError(f"ingestion api: {exc}") from None

    async def serve() -> None:
        with trio.open_signal_receiver(2, 15) as signals:  # SIGINT, SIGTERM
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_settings, app, settings, log)
                settle(log)  # serving: the start-up heap is frozen (ingestion/node/heap.py)
                async for _ in signals:
                    log.info("api-stopping")
                    nursery.cancel_scope.cancel("signalled")
                    break

    try:
        trio.run(serve)
    except* ApiStartError as group:
        raise UsageError(f"ingestion api: {group.exceptions[0]}") from None
    return 0
