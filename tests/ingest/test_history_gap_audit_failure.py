"""The history-gap handler with ``on_history_gap = "skip"`` skips a gap only once its fenced audit
entry is written: when Redis cannot be reached, or the term's token is no longer current, it says
why, logs no skip, and the source retries later (real Redis, the node's own audit writer)."""

from __future__ import annotations

import redis
import trio
from structlog.testing import capture_logs

from actors.lease_store import Acquired, LeaseStore, connect
from actors.source import TermContext, current_term
from ingestion.common.gaps import record_history_gap
from ingestion.node.build import audit_writer
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy

GAP = {"cursor": str(5 << 32), "cursor_ledger": 5, "elder_ledger": 40, "horizon": "http://h"}
RESUME = {"resume_from_ledger": 40}


async def skip(store: LeaseStore) -> str | None:
    return await record_history_gap(
        GAP, on_history_gap="skip", audit=audit_writer(store), stop_message="stop", resume=RESUME
    )


def gap_entries(client: redis.Redis, store: LeaseStore) -> list[dict[str, str]]:
    return [f for _id, f in client.xrange(store.keys["audit"]) if f["event"] == "history-gap"]


async def test_a_gap_is_skipped_once_its_audit_entry_is_written(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    current_term.set(TermContext("a", 1))
    with capture_logs() as logs:
        assert await skip(store) is None
    assert [(x["event"], x["action"], x["resume_from_ledger"]) for x in logs] == [("history-gap", "skip", 40)]
    assert gap_entries(redis_client, store) == [
        {"event": "history-gap", "node": "a", "token": "1", **{k: str(v) for k, v in GAP.items()}}
    ]


async def test_a_gap_entry_never_holds_the_source_urls_credentials(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """The entry names the source's URL, which may carry a provider's key: the console and
    ``inspect`` show the audit to anyone who can read Redis, the logs redacted it, the entry not."""
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    current_term.set(TermContext("a", 1))
    gap = {**GAP, "horizon": "https://KEY123@h.example/?apikey=KEY123"}
    assert await record_history_gap(gap, on_history_gap="skip", audit=audit_writer(store),
                                    stop_message="stop", resume=RESUME) is None  # fmt: skip
    (entry,) = gap_entries(redis_client, store)
    assert entry["horizon"] == "https://***@h.example/?apikey=***"


async def test_an_audit_entry_redis_cannot_take_leaves_the_gap_unskipped_and_says_why(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        store = LeaseStore(connect(f"redis://127.0.0.1:{proxy.port}/0", timeout=0.25), job)
        assert isinstance(await store.acquire("a", 60_000), Acquired)
        current_term.set(TermContext("a", 1))
        proxy.set_mode("refuse")
        with capture_logs() as logs:
            problem = await skip(store)
        nursery.cancel_scope.cancel()
    assert problem is not None and problem.startswith("history-gap audit entry: RedisUnavailable: ")
    assert logs == []  # no skip was logged
    assert gap_entries(redis_client, store) == []


async def test_an_audit_entry_refused_by_fencing_leaves_the_gap_unskipped_and_says_why(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job)
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    redis_client.delete(store.keys["lease"])
    assert isinstance(await store.acquire("b", 60_000), Acquired)
    current_term.set(TermContext("a", 1))  # a's term, which b's token 2 has ended
    with capture_logs() as logs:
        problem = await skip(store)
    assert problem == "history-gap audit entry: the term's fencing token is no longer current"
    assert logs == []
    assert gap_entries(redis_client, store) == []
