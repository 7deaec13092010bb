"""A Source's own Redis I/O at the start of a term (``IdentifiedSource`` records what the job
follows, a fenced write) ends the term, never the node: Redis not answering ends it as
``commit-unknown``, a refused fenced write as ``fenced`` (real Redis, a TcpProxy between)."""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio

from actors.ingestor import Ingestor
from actors.lease_store import Acquired, LeaseStore
from actors.messages import (
    CommitCursor,
    CursorCommitted,
    ElectorInput,
    IngestorInput,
    LeaseGranted,
    TermEnded,
)
from actors.sink import SinkUnavailable
from actors.source import SyntheticSource
from ingestion.config.sections import JobSettings
from ingestion.node.identity import IdentifiedSource
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy


def horizon_job(name: str) -> JobSettings:
    return JobSettings(name, "horizon", "/operations", "0", ("http://127.0.0.1:1",))


async def run_one_term(source: object, node: str, token: int) -> TermEnded:
    """Run ``source`` for one term of ``node`` under ``token``; what the Ingestor reported."""
    control_send, control_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[CommitCursor](0)
    elector_send, elector_recv = trio.open_memory_channel[ElectorInput](4)

    async def writer() -> None:
        async for msg in writer_recv:
            msg.reply.send_nowait(CursorCommitted(msg.token, msg.cursor, len(msg.records)))

    ingestor = Ingestor(source, node, control_recv, writer_send, elector_send, structlog.get_logger())  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(ingestor.run)
        nursery.start_soon(writer)
        await control_send.send(LeaseGranted(token, trio.current_time() + 30.0, "0", None))
        with trio.fail_after(10):
            ended = await elector_recv.receive()
        nursery.cancel_scope.cancel()
    assert isinstance(ended, TermEnded)
    return ended


async def test_redis_unreachable_while_the_source_records_its_identity_ends_the_term_not_the_node(
    redis_server: LocalRedis, open_store: Callable[..., LeaseStore], job: str
) -> None:
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        store = open_store(f"redis://127.0.0.1:{proxy.port}/0", job, timeout=0.25)
        granted = await store.acquire("a", 60_000)
        assert isinstance(granted, Acquired)
        proxy.set_mode("refuse")  # a Sentinel failover right after the grant
        source = IdentifiedSource(SyntheticSource(total=10), store, horizon_job(job))
        ended = await run_one_term(source, "a", granted.token)
        nursery.cancel_scope.cancel()
    assert (ended.token, ended.reason) == (granted.token, "commit-unknown")
    assert "RedisUnavailable" in ended.detail or "127.0.0.1" in ended.detail


async def test_a_refused_fenced_identity_write_ends_the_term_as_fenced(
    redis_server: LocalRedis, open_store: Callable[..., LeaseStore], job: str
) -> None:
    store = open_store(redis_server.url, job, timeout=1.0)
    first = await store.acquire("a", 60_000)
    assert isinstance(first, Acquired)
    store.client.delete(store.keys["lease"])
    assert isinstance(await store.acquire("b", 60_000), Acquired)  # a's token is stale now
    source = IdentifiedSource(SyntheticSource(total=10), store, horizon_job(job))
    ended = await run_one_term(source, "a", first.token)
    assert (ended.token, ended.reason, ended.detail) == (first.token, "fenced", "stale-token")
    assert store.client.hget(store.keys["cursor"], "source") is None  # nothing written


class SinkFailsOnOpen(SyntheticSource):
    """A source whose term-start I/O goes to a sink that does not answer."""

    def stream(self, cursor: str):  # type: ignore[no-untyped-def]
        raise SinkUnavailable("postgres: timed out")


async def test_a_sink_not_answering_from_inside_the_source_ends_the_term_as_commit_unknown() -> None:
    ended = await run_one_term(SinkFailsOnOpen(total=10), "a", 1)
    assert (ended.reason, ended.detail) == ("commit-unknown", "postgres: timed out")
