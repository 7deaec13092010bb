"""An operator's hand-over (``ingestion handover``, the console's button): the request names the
term; the leader's next renewal takes it (in the renew script, so only the term's own holder can),
writes it to the audit with who asked, and the leader ends the term gracefully and stands aside
one TTL, so a standby leads and resumes at the committed cursor. A request for a term that has
ended changes nothing.

In-process nodes, the real actors, a real redis-server.
"""

from __future__ import annotations

import pytest
import redis
import trio

from actors.lease_store import LeaseStore, Renewal, job_keys, read_states
from actors.source import SyntheticSource
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.nodes import FAST_TIMING, OpenStore, Recorder, start_node

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)


def audit(client: redis.Redis, job: str) -> list[dict[str, str]]:
    return [fields for _id, fields in client.xrange(job_keys(job)["audit"])]  # type: ignore[union-attr]


async def test_a_handover_request_moves_the_job_to_a_standby_and_is_audited(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    rec = Recorder()
    asker = open_store(redis_server.url, job)
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", LIVE)
        granted = await rec.wait_for("became-leader", "a")
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE)
        await rec.wait_for("standby", "b")
        await rec.wait_for("committed", "a", count=3)
        asked_at = trio.current_time()
        await asker.request_handover(granted.fields["token"], "console 127.0.0.1 (alice)")
        lost = await rec.wait_for("lost-leadership", "a", reason="handed-over", within=2)
        taken = await rec.wait_for("became-leader", "b", within=FAST_TIMING.ttl + 1)
        # within a renew interval and the graceful release's wake-up, not a lease expiry
        assert lost.at - asked_at <= FAST_TIMING.renew_interval + 0.5
        assert taken.at - lost.at < FAST_TIMING.ttl / 2
        assert taken.fields["previous_node"] == "a"
        await rec.wait_for("committed", "b", count=2)
        await wait_until(lambda: not redis_client.hexists(job_keys(job)["leader"], "handover_token"), 2,
                         what="the request dropped by b's first renewal")  # fmt: skip
        # a stood aside: it did not take the job back at once
        assert len(rec.of("became-leader", "a")) == 1
        await a.shutdown()
        await b.shutdown()
    entries = audit(redis_client, job)
    asked = [e for e in entries if e["event"] == "handover-requested"]
    assert asked == [{"event": "handover-requested", "node": "a", "token": str(granted.fields["token"]),
                      "by": "console 127.0.0.1 (alice)"}]  # fmt: skip
    events = [e["event"] for e in entries]
    at = events.index("handover-requested")
    assert events[at + 1 : at + 3] == ["released", "became-leader"]
    assert entries[at + 1]["reason"] == "handed-over"


async def test_a_request_naming_another_term_is_dropped_by_the_renewal(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    store: LeaseStore = open_store(redis_server.url, job)
    first = await store.acquire("a", 5000)
    await store.request_handover(first.token + 7, "someone")  # type: ignore[union-attr]
    assert await store.renew("a", first.token, 5000) is Renewal.RENEWED  # type: ignore[union-attr]
    assert not redis_client.hexists(job_keys(job)["leader"], "handover_token")  # dropped, not kept
    await store.request_handover(first.token, "someone")  # type: ignore[union-attr]
    # not the holder: nothing taken, nothing audited
    assert await store.renew("b", first.token, 5000) is Renewal.LOST  # type: ignore[union-attr]
    assert redis_client.hget(job_keys(job)["leader"], "handover_by") == "someone"
    assert await store.renew("a", first.token, 5000) is Renewal.HAND_OVER  # type: ignore[union-attr]
    assert store.last_handover_by == "someone"
    # it stays while the term lasts (a renewal whose answer was lost must not lose it) ...
    assert await store.renew("a", first.token, 5000) is Renewal.HAND_OVER  # type: ignore[union-attr]
    assert await store.release("a", first.token, "handed-over")  # type: ignore[union-attr]
    released = [f for _id, f in redis_client.xrange(job_keys(job)["audit"]) if f["event"] == "released"]
    assert released[-1]["reason"] == "handed-over"
    # ... and the next term's first renewal drops it
    second = await store.acquire("b", 5000)
    assert await store.renew("b", second.token, 5000) is Renewal.RENEWED  # type: ignore[union-attr]
    assert not redis_client.hexists(job_keys(job)["leader"], "handover_token")


@pytest.mark.slow
async def test_the_handover_command_moves_a_job_run_by_node_processes(job: str) -> None:
    """``ingestion handover JOB --wait 10`` against two real node processes: the other node leads
    (exit 0), the audit names who asked (the command's user and host); a job with no leader,
    exit 1; an unknown job, exit 2."""
    from ingestion.testing.cluster import open_cluster
    from tests.support.cli import run

    async with open_cluster(job, ttl_ms=1500) as c:
        await c.start_node("a")
        await c.log.wait_for("became-leader", "a")
        await c.start_node("b")
        done = await trio.to_thread.run_sync(
            lambda: run("handover", job, "--redis", c.redis_url, "--wait", "10")
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "asked a to hand" in done.stdout and f"b leads {job}" in done.stdout
        await c.log.wait_for("lost-leadership", "a", reason="handed-over")
        audit = [f for _id, f in c.client.xrange(job_keys(job)["audit"])]
        asked = [f for f in audit if f["event"] == "handover-requested"]
        assert len(asked) == 1 and asked[0]["by"].startswith("cli ") and asked[0]["node"] == "a"
        await c.stop_all()
        c.client.delete(job_keys(job)["lease"])
        gone = await trio.to_thread.run_sync(lambda: run("handover", job, "--redis", c.redis_url))
        assert gone.returncode == 1 and "no leader" in gone.stderr
        unknown = await trio.to_thread.run_sync(
            lambda: run("handover", "no-such-job", "--redis", c.redis_url)
        )
        assert unknown.returncode == 2 and "no job 'no-such-job'" in unknown.stderr


@pytest.mark.slow
async def test_a_handover_in_a_balanced_cluster_goes_to_a_node_at_its_share_at_once(job: str) -> None:
    """Two nodes, two jobs, one each: both at their share. A hand-over of one must not leave it
    leaderless for a TTL and then give it back to the node that stood aside: the release says it
    was handed over, and the other node adopts it at once (the balancer evens the shares later)."""
    from ingestion.testing.cluster import open_cluster
    from tests.support.cli import run

    ttl = 1.5
    other_job = f"{job}-2"
    async with open_cluster(job, ttl_ms=int(ttl * 1000)) as c:
        extra = ["--job", f"{other_job}=/payments"]
        await c.start_node("a", extra=extra)
        await c.start_node("b", extra=extra)

        def holder(name: str) -> str | None:
            return read_states(c.client, [name])[0].leader

        await wait_until(lambda: {holder(job), holder(other_job)} == {"a", "b"}, 20, what="one job each")
        await trio.sleep(2 * ttl)  # settled
        before = holder(job)
        asked_at = trio.current_time()
        done = await trio.to_thread.run_sync(
            lambda: run("handover", job, "--redis", c.redis_url, "--wait", "10")
        )
        took = trio.current_time() - asked_at
        assert done.returncode == 0, done.stdout + done.stderr
        assert holder(job) not in (None, before), holder(job)
        # a renewal interval, the release and the adoption (and the command's start), not a TTL and more
        assert took < ttl + 0.5, took
