"""The guarantees that live inside Redis, reached directly.

``LeaseStore.commit`` refuses an out-of-order or malformed batch in Python before Redis sees it, so
the commit script's own in-batch ordering check and its ``bad-paging-token`` branch never run in a
node. The module docstring of ``actors.lease_store`` says the script is the guarantee and the
Python check an optimisation: here the script is called as ``LeaseStore.commit`` calls it, with
the batches Python would have stopped, and must refuse them changing nothing. Also: a primary that
lost its scripts (``SCRIPT FLUSH``, as a promoted replica that never loaded them) still takes each
acquire and commit exactly once, and ``fenced_hset`` / ``fenced_audit`` refuse a writer whose
lease is gone even though its token is still the current one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis

from actors.lease_store import Acquired, CommitRejected, Committed, LeaseStore, connect, job_key
from actors.source import Record
from ingestion.testing.local_redis import LocalRedis


def body(token: str) -> str:
    return f'{{"paging_token":"{token}"}}'


@pytest.fixture
def store(redis_server: LocalRedis, job: str) -> LeaseStore:
    return LeaseStore(connect(redis_server.url, timeout=1.0), job)


async def leader_with_cursor_10(store: LeaseStore) -> None:
    """``a`` holds the lease under token 1 and has committed one record, paging token ``10``."""
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    assert await store.commit("a", 1, None, [Record("10", body("10"))]) == Committed(1, "10", 1)


def snapshot(client: redis.Redis, store: LeaseStore) -> dict[str, Any]:
    k = store.keys
    return {
        "cursor": client.hgetall(k["cursor"]),
        "events": client.xrange(k["events"]),
        "token": client.get(k["token"]),
        "lease": client.get(k["lease"]),
    }


async def commit_script(
    store: LeaseStore,
    node: str,
    token: int,
    previous: str | None,
    tokens: Sequence[str],
    anchor: str | None = None,
) -> list[Any]:
    """The commit script, called with its keys and arguments exactly as ``LeaseStore.commit``
    builds them, but without its Python-side checks."""
    k = store.keys
    keys = [k["token"], k["lease"], k["cursor"], k["events"]]
    args: list[str | int] = [node, token, previous or "", anchor or "", store.events_max_len, ""]
    for t in tokens:
        args += [t, body(t)]
    answer: list[Any] = await store.run(store._commit, keys, args)
    return answer


# (the batch after cursor 10, the anchor): each would put the stream out of order
UNORDERED = {
    "second record before the first": (["30", "20"], None),
    "a record repeated in the batch": (["20", "20"], None),
    "numeric, not text order": (["100", "99"], None),
    "equal by value (leading zeros)": (["020", "20"], None),
    "dashed tokens, seq going back": (["11-5", "11-4"], None),
    "anchor before the last record": (["30"], "25"),
    "anchor equal to the last record": (["30"], "30"),
}


@pytest.mark.parametrize(("tokens", "anchor"), UNORDERED.values(), ids=UNORDERED.keys())
async def test_the_commit_script_refuses_a_batch_out_of_order_and_changes_nothing(
    store: LeaseStore, redis_client: redis.Redis, tokens: list[str], anchor: str | None
) -> None:
    await leader_with_cursor_10(store)
    with pytest.raises(ValueError, match="out of order"):  # why the script's check is never reached
        await store.commit("a", 1, "10", [Record(t, body(t)) for t in tokens], anchor=anchor)
    before = snapshot(redis_client, store)
    answer = await commit_script(store, "a", 1, "10", tokens, anchor)
    assert answer == [0, "not-after-cursor", 1, "10"]
    assert snapshot(redis_client, store) == before


MALFORMED = {
    "letters": (["1x"], None),
    "empty": ([""], None),
    "a dash and nothing after": (["12-"], None),
    "nothing before the dash": (["-5"], None),
    "malformed after a good record": (["20", "2a"], None),
    "malformed anchor after a good record": (["20"], "abc"),
    "malformed anchor alone": ([], "1.5"),
}


@pytest.mark.parametrize(("tokens", "anchor"), MALFORMED.values(), ids=MALFORMED.keys())
async def test_the_commit_script_refuses_a_malformed_paging_token_and_changes_nothing(
    store: LeaseStore, redis_client: redis.Redis, tokens: list[str], anchor: str | None
) -> None:
    await leader_with_cursor_10(store)
    before = snapshot(redis_client, store)
    answer = await commit_script(store, "a", 1, "10", tokens, anchor)
    assert answer == [0, "bad-paging-token", 1, "10"]
    assert snapshot(redis_client, store) == before


async def test_the_commit_script_checks_order_inside_a_batch_on_an_empty_cursor_too(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    """With no cursor yet there is nothing to compare the first record with; the second must
    still come after the first."""
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    answer = await commit_script(store, "a", 1, None, ["30", "20"])
    assert answer == [0, "not-after-cursor", 1, ""]
    assert redis_client.exists(store.keys["cursor"], store.keys["events"]) == 0


async def test_the_fencing_check_comes_before_the_batch_checks(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    """A stale writer learns that it is stale, not what is wrong with its batch."""
    await leader_with_cursor_10(store)
    redis_client.delete(store.keys["lease"])
    assert isinstance(await store.acquire("b", 60_000), Acquired)
    before = snapshot(redis_client, store)
    assert await commit_script(store, "a", 1, "10", ["1x"]) == [0, "stale-token", 2, "10"]
    assert await commit_script(store, "a", 1, "10", ["30", "20"]) == [0, "stale-token", 2, "10"]
    assert snapshot(redis_client, store) == before


async def test_a_commit_after_the_scripts_were_flushed_reloads_the_script_and_lands_once(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await leader_with_cursor_10(store)
    redis_client.script_flush()
    assert redis_client.script_exists(store._commit.sha) == [False]
    done = await store.commit("a", 1, "10", [Record("11", body("11")), Record("12", body("12"))])
    assert done == Committed(1, "12", 2)
    assert [f["paging_token"] for _id, f in redis_client.xrange(store.keys["events"])] == ["10", "11", "12"]
    assert redis_client.hget(store.keys["cursor"], "cursor") == "12"
    assert redis_client.script_exists(store._commit.sha) == [True]


async def test_an_acquire_after_the_scripts_were_flushed_reloads_the_script_and_issues_one_token(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    redis_client.script_flush()
    assert await store.acquire("a", 60_000) == Acquired(1, None, None, None, None)
    assert redis_client.get(store.keys["token"]) == "1"
    assert redis_client.xlen(store.keys["audit"]) == 1
    assert redis_client.script_exists(store._acquire.sha) == [True]


async def test_fenced_hset_refuses_the_current_token_once_its_lease_is_gone(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    """The token is still the counter (nobody took over yet), but the lease expired: the holder
    may not write, or a successor's first write could interleave with its last."""
    target = job_key(store.job, "state")
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    assert await store.fenced_hset("a", 1, target, {"v": "1"}) is None
    redis_client.delete(store.keys["lease"])  # expired
    assert await store.fenced_hset("a", 1, target, {"v": "late"}) == CommitRejected(1, "lease-lost", 1, None)
    assert redis_client.hgetall(target) == {"v": "1"}


async def test_fenced_hset_refuses_another_node_under_the_holders_token(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    target = job_key(store.job, "state")
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    assert await store.fenced_hset("b", 1, target, {"v": "b"}) == CommitRejected(1, "lease-lost", 1, None)
    assert redis_client.exists(target) == 0


async def test_fenced_audit_refuses_the_current_token_once_its_lease_is_gone(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    assert isinstance(await store.acquire("a", 60_000), Acquired)
    redis_client.delete(store.keys["lease"])
    refused = await store.fenced_audit("a", 1, "history-gap", {"cursor": "10"})
    assert refused == CommitRejected(1, "lease-lost", 1, None)
    assert [f["event"] for _id, f in redis_client.xrange(store.keys["audit"])] == ["became-leader"]
