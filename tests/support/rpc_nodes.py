"""The RPC source in a node run in process, for tests: a source with short retries, the job's
committed cursor, a node around it, and waiting for the cursor to reach the simulator's tip."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
import trio

from actors.lease_store import job_keys
from ingestion.rpc.protocol import Cursor
from ingestion.rpc.source import RpcSource
from ingestion.simulator import Simulator
from ingestion.testing.wait import wait_until
from tests.support.nodes import Recorder, start_node


def source(*urls: str, **kw: Any) -> RpcSource:
    return RpcSource(urls, retry_base=0.02, retry_cap=0.2, request_timeout=5, **kw)


def cursor(client: redis.Redis, job: str) -> str | None:
    value = client.hget(job_keys(job)["cursor"], "cursor")
    return None if value is None else str(value)


@asynccontextmanager
async def node(url: str, job: str, src: RpcSource, start: str = "0") -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        handle = await start_node(nursery, Recorder(), url, job, "n1", src, start_cursor=start)
        try:
            yield
        finally:
            await handle.shutdown()


def at_tip(client: redis.Redis, job: str, sim: Simulator) -> bool:
    return cursor(client, job) == str(Cursor.through(sim.chain.latest))


async def until_at_tip(client: redis.Redis, job: str, sim: Simulator, within: float = 15.0) -> None:
    """Until the job's committed cursor reads through ``sim``'s latest ledger."""
    await wait_until(lambda: at_tip(client, job, sim), within, what="the cursor through the latest ledger")
