"""A node's console served on loopback for the console's HTTP tests (``tests/console/``)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import redis
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from actors.observe import NodeObserver
from ingestion.serve.console import ClusterReader
from ingestion.serve.metrics import NodeMetrics, metrics_app


@asynccontextmanager
async def console(
    client: redis.Redis, configured: dict[str, str], token: str = "", **options: Any
) -> AsyncIterator[tuple[ClusterReader, httpx.AsyncClient]]:
    """A node's console (its presence subscription running) served on loopback, and a client;
    ``options``: the reader's (``streams``)."""
    reader = ClusterReader(client, "n1", configured, token=token, **options)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    app = metrics_app(NodeMetrics(NodeObserver("n1", "j")), reader)
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.run)
        binds = await nursery.start(functools.partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=str(binds[0]), timeout=5) as http:
            yield reader, http
        nursery.cancel_scope.cancel()
