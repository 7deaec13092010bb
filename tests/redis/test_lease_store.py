"""The Lua scripts against a real redis-server: acquire, renew, release, and the fenced commit."""

from __future__ import annotations

import pytest
import redis
import trio

from actors.lease_store import (
    Acquired,
    CommitRejected,
    Committed,
    Held,
    LeaseStore,
    RedisUnavailable,
    connect,
    job_keys,
)
from actors.source import Record
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.tcp_proxy import TcpProxy
from tests.support.nodes import OpenStore


def recs(*tokens: str) -> list[Record]:
    return [Record(t, f'{{"paging_token":"{t}"}}') for t in tokens]


@pytest.fixture
def store(redis_server: LocalRedis, job: str) -> LeaseStore:
    return LeaseStore(connect(redis_server.url, timeout=1.0), job)


async def test_first_acquire_gets_token_one_and_others_see_the_holder(store: LeaseStore) -> None:
    first = await store.acquire("a", 5000)
    assert first == Acquired(1, None, None, None, None)
    second = await store.acquire("b", 5000)
    assert isinstance(second, Held)
    assert (second.holder, second.token) == ("a", 1)
    assert 4000 < second.ttl_left_ms <= 5000


async def test_takeover_after_expiry_increments_token_and_audits_the_takeover(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 100)
    await trio.sleep(0.25)
    taken = await store.acquire("b", 5000)
    assert isinstance(taken, Acquired)
    assert (taken.token, taken.previous_node, taken.previous_token) == (2, "a", 1)
    assert taken.takeover_ms is not None and 100 <= taken.takeover_ms < 2000
    audit = [f for _id, f in redis_client.xrange(store.keys["audit"])]
    assert audit[-1] == {
        "event": "became-leader", "node": "b", "token": "2", "previous_node": "a",
        "previous_token": "1", "takeover_ms": str(taken.takeover_ms),
    }


async def test_renew_only_extends_the_exact_holder_and_token(store: LeaseStore) -> None:
    await store.acquire("a", 300)
    assert await store.renew("a", 1, 5000)
    assert not await store.renew("a", 2, 5000)
    assert not await store.renew("b", 1, 5000)
    held = await store.acquire("b", 5000)
    assert isinstance(held, Held) and held.ttl_left_ms > 4000


async def test_release_only_by_the_holder_and_it_is_audited(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    assert not await store.release("b", 1)
    assert not await store.release("a", 2)
    assert await store.release("a", 1)
    assert redis_client.get(store.keys["lease"]) is None
    taken = await store.acquire("b", 5000)
    assert isinstance(taken, Acquired) and taken.token == 2
    assert taken.takeover_ms is not None and taken.takeover_ms < 1000
    events = [f["event"] for _id, f in redis_client.xrange(store.keys["audit"])]
    assert events == ["became-leader", "released", "became-leader"]


async def test_commit_appends_in_order_and_advances_the_cursor(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    assert await store.commit("a", 1, None, recs("9", "10", "11")) == Committed(1, "11", 3)
    assert await store.commit("a", 1, "11", recs("100")) == Committed(1, "100", 1)
    entries = redis_client.xrange(store.keys["events"])
    assert [f["paging_token"] for _id, f in entries] == ["9", "10", "11", "100"]
    assert entries[0][1] == {"paging_token": "9", "token": "1", "node": "a",
                             "record": '{"paging_token":"9"}'}
    assert redis_client.hgetall(store.keys["cursor"]) == {"cursor": "100", "token": "1", "node": "a"}


async def test_a_replayed_batch_is_rejected_and_changes_nothing(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    await store.commit("a", 1, None, recs("5-1", "5-2"))
    replay = await store.commit("a", 1, "5-2", recs("5-2", "5-3"))
    assert isinstance(replay, CommitRejected) and replay.reason == "not-after-cursor"
    stale_view = await store.commit("a", 1, None, recs("5-1", "5-2"))
    assert isinstance(stale_view, CommitRejected) and stale_view.reason == "cursor-moved"
    backwards = await store.commit("a", 1, "5-2", recs("4-9"))
    assert isinstance(backwards, CommitRejected) and backwards.reason == "not-after-cursor"
    assert redis_client.xlen(store.keys["events"]) == 2
    assert redis_client.hget(store.keys["cursor"], "cursor") == "5-2"


async def test_effect_tokens_are_ordered_numerically_inside_redis(store: LeaseStore) -> None:
    await store.acquire("a", 5000)
    assert isinstance(await store.commit("a", 1, None, recs("99-9")), Committed)
    assert isinstance(await store.commit("a", 1, "99-9", recs("99-10")), Committed)
    assert isinstance(await store.commit("a", 1, "99-10", recs("100-1")), Committed)
    wrong = await store.commit("a", 1, "100-1", recs("99-11"))
    assert isinstance(wrong, CommitRejected) and wrong.reason == "not-after-cursor"


async def test_a_stale_token_cannot_write_even_while_its_holder_thinks_it_leads(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    await store.commit("a", 1, None, recs("1"))
    redis_client.delete(store.keys["lease"])  # a's lease ends without a noticing
    assert isinstance(await store.acquire("b", 5000), Acquired)
    stale = await store.commit("a", 1, "1", recs("2"))
    assert stale == CommitRejected(1, "stale-token", 2, "1")
    assert redis_client.xlen(store.keys["events"]) == 1


async def test_a_writer_whose_lease_expired_cannot_write_even_with_the_current_token(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 100)
    await trio.sleep(0.2)
    lost = await store.commit("a", 1, None, recs("1"))
    assert isinstance(lost, CommitRejected) and lost.reason == "lease-lost"
    assert redis_client.xlen(store.keys["events"]) == 0


async def test_the_token_counter_never_goes_below_a_committed_token(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    redis_client.set(store.keys["token"], 41)
    redis_client.set(store.keys["lease"], "41|a")
    await store.commit("a", 41, None, recs("1"))
    redis_client.delete(store.keys["token"], store.keys["lease"])  # the counter is lost
    taken = await store.acquire("b", 5000)
    assert isinstance(taken, Acquired) and taken.token == 42


async def test_malformed_batches_are_refused_before_reaching_redis(store: LeaseStore) -> None:
    await store.acquire("a", 5000)
    with pytest.raises(ValueError):
        await store.commit("a", 1, None, recs("2", "1"))
    with pytest.raises(ValueError):
        await store.commit("a", 1, None, recs("0x1"))


async def test_an_unreachable_redis_is_reported_as_unavailable_within_the_timeout(job: str) -> None:
    store = LeaseStore(connect("redis://127.0.0.1:1/0", timeout=0.2), job)
    with trio.fail_after(1):
        with pytest.raises(RedisUnavailable):
            await store.acquire("a", 5000)


async def test_a_silent_redis_is_unavailable_within_the_bound_of_the_whole_call(
    redis_server: LocalRedis, job: str
) -> None:
    """Every packet dropped: each call, whole (connect, handshake, script load, command), ends
    within the store's call timeout, never a multiple of it."""
    async with trio.open_nursery() as nursery:
        proxy: TcpProxy = await nursery.start(TcpProxy(redis_server.port).serve)
        proxy.set_mode("blackhole")
        timeout = 0.5
        store = LeaseStore(connect(f"redis://127.0.0.1:{proxy.port}/0", timeout=timeout), job)
        for call in (store.acquire("a", 5000), store.commit("a", 1, None, recs("1"))):
            started = trio.current_time()
            with pytest.raises(RedisUnavailable, match="timed out"):
                await call
            took = trio.current_time() - started
            print(f"\na silent Redis: the call gave up after {took:.3f} s (timeout {timeout} s)")
            # One timeout, not one per step (connect, handshake, script load, command): the next
            # multiple is 2x; the rest of that is slack for a loaded machine.
            assert took < 2 * timeout
        nursery.cancel_scope.cancel()


def test_one_jobs_keys_share_a_cluster_hash_tag() -> None:
    keys = job_keys("payments")
    assert all("{payments}" in k for k in keys.values())
    assert keys["lease"] == "ingestion:{payments}:lease"


async def test_an_anchor_pins_the_cursor_without_events_and_only_once(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    assert await store.commit("a", 1, None, [], anchor="77") == Committed(1, "77", 0)
    assert redis_client.xlen(store.keys["events"]) == 0
    again = await store.commit("a", 1, None, [], anchor="78")
    assert isinstance(again, CommitRejected) and again.reason == "cursor-moved"
    assert await store.commit("a", 1, "77", recs("78")) == Committed(1, "78", 1)
    with pytest.raises(ValueError):
        await store.commit("a", 1, "78", [])  # neither records nor an anchor


async def test_records_then_a_read_through_anchor_commit_together(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    await store.acquire("a", 5000)
    assert await store.commit("a", 1, None, recs("5", "6"), anchor="9") == Committed(1, "9", 2)
    assert [f["paging_token"] for _, f in redis_client.xrange(store.keys["events"])] == ["5", "6"]
    # The next commit continues from the anchor: a record at or before it is refused.
    stale = await store.commit("a", 1, "9", recs("8"))
    assert isinstance(stale, CommitRejected) and stale.reason == "not-after-cursor"
    assert await store.commit("a", 1, "9", [], anchor="12") == Committed(1, "12", 0)
    with pytest.raises(ValueError):  # an anchor must come after the batch's last record
        await store.commit("a", 1, "12", recs("13", "14"), anchor="14")


async def test_zero_padded_event_ids_compare_by_value(
    store: LeaseStore, redis_client: redis.Redis
) -> None:
    """Stellar RPC ids ("%019d-%010d") and Horizon tokens share one ordering, in Python and Lua."""
    await store.acquire("a", 5000)
    first = "0000214748364800001-0000000009"
    second = "0000214748364800001-0000000010"  # "10" > "9" by value, padded or not
    assert await store.commit("a", 1, None, recs(first, second)) == Committed(1, second, 2)
    # 214748364800001 as Horizon writes it is the same position: not after the stored cursor.
    same = await store.commit("a", 1, second, recs("214748364800001-10"))
    assert isinstance(same, CommitRejected) and same.reason == "not-after-cursor"
    through = "0000214752659767295-4294967295"  # ledger 50000's scanned-through cursor
    assert await store.commit("a", 1, second, [], anchor=through) == Committed(1, through, 0)
    earlier = await store.commit("a", 1, through, recs("0000214752659767295-0000000001"))
    assert isinstance(earlier, CommitRejected) and earlier.reason == "not-after-cursor"


async def test_a_release_notice_wait_on_a_failing_redis_waits_out_its_time_in_trio() -> None:
    """Redis refusing the subscription: the wait answers None after its time, never raises, and
    sleeps in trio, not in its worker thread (a thread's sleep failed with EINVAL under libfaketime
    and crashed a node in the chaos campaign)."""
    import attrs
    import redis as redis_py

    from actors.lease_store.notices import ReleaseNotices
    from tests.support.ports import closed_port

    @attrs.define
    class Unreachable:
        client: redis_py.Redis = attrs.field(
            factory=lambda: redis_py.Redis(port=closed_port(), socket_connect_timeout=0.2)
        )
        keys: dict[str, str] = attrs.Factory(lambda: {"released": "nowhere:released"})

    notices = ReleaseNotices(Unreachable())
    for _ in range(2):
        before = trio.current_time()
        assert await notices.wait(0.3) is None
        assert trio.current_time() - before >= 0.3


async def test_release_waits_of_many_jobs_leave_the_store_calls_their_threads(
    redis_server: LocalRedis, job: str, open_store: OpenStore
) -> None:
    """A node hosting 60 jobs has 60 standbys waiting for release notices at once, each wait
    holding a thread for its whole length. They must not take the threads of the short calls
    (trio's default limiter has 40): every call would then time out as Redis unavailable, and no
    job could be led (the console benchmark's 50 jobs on 3 nodes found it)."""
    # Each store's calls get 2 s, not 150 ms: a first call on a loaded machine (a fresh connection
    # while 60 threads start) may take longer than 150 ms without anything being wrong. Starved,
    # a call would wait for a thread as long as the waits last (30 s) and time out all the same.
    stores = [open_store(redis_server.url, f"{job}-{i}", timeout=2.0) for i in range(60)]
    notices = [s.release_notices() for s in stores]
    async with trio.open_nursery() as nursery:
        for n in notices:
            nursery.start_soon(n.wait, 30.0)
        await trio.sleep(0.5)  # every wait is in its thread now
        with trio.fail_after(15):
            for store in stores[:5]:
                assert (await store.leader()).node is None  # within its own call bound
        nursery.cancel_scope.cancel()
    for n in notices:
        n.close()
