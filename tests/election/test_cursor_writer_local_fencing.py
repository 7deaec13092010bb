"""The CursorWriter refuses, without asking Redis, a token below one it has already seen: a
Redis that went back in time (a failover to a replica that missed the takeover) would take it."""

from __future__ import annotations

import redis
import structlog
import trio
from structlog.testing import capture_logs

from actors.cursor_writer import CursorWriter
from actors.lease_store import Acquired, Committed, LeaseStore, connect
from actors.messages import (
    CommitCursor,
    CommitOutcome,
    CommitRefused,
    CursorCommitted,
    ElectorInput,
    FencingTokenRejected,
)
from actors.observe import NodeObserver
from actors.source import Record
from ingestion.testing.local_redis import LocalRedis


def recs(*tokens: str) -> tuple[Record, ...]:
    return tuple(Record(t, f'{{"paging_token":"{t}"}}') for t in tokens)


async def test_a_token_below_one_the_writer_has_seen_is_refused_locally_even_when_redis_would_take_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    commits, inbox = trio.open_memory_channel[CommitCursor](0)
    elector_send, elector = trio.open_memory_channel[ElectorInput](4)
    observer = NodeObserver("a", job)
    writer = CursorWriter(store, "a", inbox, elector_send, structlog.get_logger(), observer)

    async def commit(token: int, previous: str | None, *tokens: str) -> CommitOutcome:
        reply_send, reply = trio.open_memory_channel[CommitOutcome](1)
        await commits.send(CommitCursor(token, previous, recs(*tokens), reply_send))
        return await reply.receive()

    assert isinstance(await store.acquire("a", 60_000), Acquired)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            assert await commit(1, None, "10") == CursorCommitted(1, "10", 1)
            # b takes over (token 2); a's next commit is refused by Redis, and a learns of token 2.
            redis_client.delete(store.keys["lease"])
            assert isinstance(await LeaseStore(redis_client, job).acquire("b", 60_000), Acquired)
            assert await commit(1, "10", "11") == CommitRefused(1, "stale-token", 2)
            assert await elector.receive() == FencingTokenRejected(1, 2, "11")
            # Redis goes back to before the takeover: token 1 held by a is current again there.
            redis_client.set(store.keys["token"], 1)
            redis_client.set(store.keys["lease"], "1|a", px=60_000)
            assert await commit(1, "10", "11") == CommitRefused(1, "stale-token", 2)
            assert await elector.receive() == FencingTokenRejected(1, 2, "11")
            await commits.aclose()
    rejected = [x for x in logs if x["event"] == "fencing-token-rejected"]
    assert [(x["checked_by"], x["token"], x["current_token"], x["rejection"]) for x in rejected] == [
        ("redis", 1, 2, "stale-token"),
        ("writer", 1, 2, "stale-token"),
    ]
    assert observer.fencing_rejections == 2
    assert [f["paging_token"] for _id, f in redis_client.xrange(store.keys["events"])] == ["10"]
    assert redis_client.hget(store.keys["cursor"], "cursor") == "10"
    # Only the writer stood in the way: Redis itself takes that commit now.
    assert await store.commit("a", 1, "10", recs("11")) == Committed(1, "11", 1)
    store.client.close()
