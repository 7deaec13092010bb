"""Prometheus metrics and the health probe, scraped over loopback with a real HTTP client from
in-process nodes running against a real redis-server."""

from __future__ import annotations

import functools

import httpx
import pytest
import redis
import structlog
import trio
from prometheus_client.parser import text_string_to_metric_families

from actors.lease_store import Acquired, LeaseStore, connect
from actors.observe import NodeObserver
from actors.source import SourceFatalError, SyntheticSource
from ingestion import __version__
from ingestion.common.gaps import history_gap_listener, record_history_gap
from ingestion.node.worker import _count_history_gap
from ingestion.serve.metrics import NodeMetrics, serve_metrics
from ingestion.testing.local_redis import LocalRedis
from tests.support.metrics import value
from tests.support.nodes import OpenStore, Recorder, start_node

LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)
LOG = structlog.get_logger()


async def scrape(port: int, path: str = "/metrics") -> httpx.Response:
    async with httpx.AsyncClient(timeout=2.0) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def test_each_node_exposes_its_role_token_elections_and_commits(
    redis_server: LocalRedis, job: str
) -> None:
    JOB = job
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, rec, redis_server.url, job, "a", LIVE)
        await rec.wait_for("became-leader", "a")
        b = await start_node(nursery, rec, redis_server.url, job, "b", LIVE)
        await rec.wait_for("standby", "b")
        port_a = await nursery.start(serve_metrics, "127.0.0.1", 0, a.observer, LOG)
        port_b = await nursery.start(serve_metrics, "127.0.0.1", 0, b.observer, LOG)
        await rec.wait_for("committed", "a", count=3)

        text_a, text_b = (await scrape(port_a)).text, (await scrape(port_b)).text
        assert value(text_a, "ingestion_leader", ingestion_job=JOB) == 1
        assert value(text_b, "ingestion_leader", ingestion_job=JOB) == 0
        assert value(text_a, "ingestion_fencing_token", ingestion_job=JOB) == 1
        assert value(text_b, "ingestion_fencing_token", ingestion_job=JOB) == 1  # the leader it saw
        assert value(text_a, "ingestion_elections_total", ingestion_job=JOB) == 1
        assert value(text_b, "ingestion_elections_total", ingestion_job=JOB) == 0
        assert value(text_a, "ingestion_node_info", node="a", ingestion_job=job) == 1
        assert (value(text_a, "ingestion_events_ingested_total", ingestion_job=JOB) or 0) >= 15
        assert (value(text_a, "ingestion_commit_latency_seconds_count", ingestion_job=JOB) or 0) >= 1
        count = value(text_a, "ingestion_commit_latency_seconds_count", ingestion_job=JOB)
        assert value(
            text_a, "ingestion_commit_latency_seconds_bucket", le="+Inf", ingestion_job=JOB
        ) == count
        assert 0 < (value(text_a, "ingestion_lease_remaining_seconds", ingestion_job=JOB) or 0) < 1.5
        assert value(text_b, "ingestion_lease_remaining_seconds", ingestion_job=JOB) is None
        assert value(text_a, "ingestion_fencing_rejections_total", ingestion_job=JOB) == 0

        await a.shutdown()
        await rec.wait_for("became-leader", "b")
        await rec.wait_for("committed", "b")
        text_a, text_b = (await scrape(port_a)).text, (await scrape(port_b)).text
        assert value(text_a, "ingestion_leader", ingestion_job=JOB) == 0
        assert value(text_a, "ingestion_leadership_losses_total", reason="shutdown", ingestion_job=JOB) == 1
        assert value(text_b, "ingestion_leader", ingestion_job=JOB) == 1
        assert value(text_b, "ingestion_fencing_token", ingestion_job=JOB) == 2
        # b ended a leaderless gap (a released at once, so it is short but measured).
        assert value(text_b, "ingestion_leaderless_seconds_total", ingestion_job=JOB) is not None
        await b.shutdown()
        nursery.cancel_scope.cancel()


async def test_healthz_is_ok_while_running_and_503_once_stopped() -> None:
    observer = NodeObserver("n", "j")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, "127.0.0.1", 0, observer, LOG)
        response = await scrape(port, "/healthz")
        assert response.status_code == 200
        assert response.json() == {
            "status": "ok", "node": "n", "job": "j", "role": "starting", "source_up": None
        }
        observer.election_event("stopped")
        response = await scrape(port, "/healthz")
        assert response.status_code == 503
        assert response.json()["status"] == "stopped"
        assert (await scrape(port, "/nope")).status_code == 404
        nursery.cancel_scope.cancel()


async def test_source_lag_is_the_age_of_the_newest_committed_record_while_leading() -> None:
    JOB = "j"
    observer = NodeObserver("n", "j", wall_clock=lambda: 1_735_689_610.5)
    metrics = NodeMetrics(observer)
    observer.election_event("became-leader", token=3, takeover_ms=1500)
    assert value(metrics.exposition().decode(), "ingestion_source_lag_seconds", ingestion_job=JOB) is None
    body = '{"id":"1","paging_token":"1","created_at":"2025-01-01T00:00:00Z"}'
    observer.committed(1, "1", 0.002, newest_record=body)
    text = metrics.exposition().decode()
    assert value(text, "ingestion_source_lag_seconds", ingestion_job=JOB) == 10.5
    assert value(text, "ingestion_leaderless_seconds_total", ingestion_job=JOB) == 1.5
    assert value(text, "ingestion_commit_latency_seconds_bucket", le="0.0025", ingestion_job=JOB) == 1
    observer.election_event("lost-leadership", token=3, reason="lease-expired", ingestion_job=JOB)
    text = metrics.exposition().decode()
    assert value(text, "ingestion_source_lag_seconds", ingestion_job=JOB) is None  # only the leader lags
    assert value(text, "ingestion_leadership_losses_total", reason="lease-expired", ingestion_job=JOB) == 1


async def test_two_nodes_in_one_process_have_separate_registries() -> None:
    JOB = "j"
    first, second = NodeObserver("a", "j"), NodeObserver("b", "j")
    ma, mb = NodeMetrics(first), NodeMetrics(second)
    first.committed(4, "4", 0.01)
    assert value(ma.exposition().decode(), "ingestion_events_ingested_total", ingestion_job=JOB) == 4
    assert value(mb.exposition().decode(), "ingestion_events_ingested_total", ingestion_job=JOB) == 0
    ma.close()
    first.committed(1, "5", 0.01)
    assert value(ma.exposition().decode(), "ingestion_commit_latency_seconds_count", ingestion_job=JOB) == 1




async def test_events_stream_length_trimmed_and_the_slowest_group_are_read_at_each_scrape(
    redis_server: LocalRedis, job: str, redis_client: redis.Redis
) -> None:
    store = LeaseStore(connect(redis_server.url, timeout=1.0), job, events_max_len=50)
    grant = await store.acquire("a", 60_000)
    assert isinstance(grant, Acquired)
    source = SyntheticSource(total=400)
    JOB = job
    observer = NodeObserver("a", job)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(serve_metrics, stream_info=store.events_info),
            "127.0.0.1", 0, observer, LOG,
        )  # fmt: skip
        text = (await scrape(port)).text
        assert value(text, "ingestion_events_stream_entries", ingestion_job=JOB) == 0
        assert value(text, "ingestion_consumer_group_lag_max_entries", ingestion_job=JOB) is None

        key = store.keys["events"]
        redis_client.xgroup_create(key, "fast", id="0", mkstream=True)
        redis_client.xgroup_create(key, "slow", id="0")
        await store.commit("a", 1, None, [source.record(i) for i in range(1, 101)])
        redis_client.xreadgroup("slow", "c", {key: ">"}, count=30)  # 30 pending, 70 undelivered
        delivered = redis_client.xreadgroup("fast", "c", {key: ">"}, count=100)[0][1]
        redis_client.xack(key, "fast", *[entry_id for entry_id, _ in delivered])
        text = (await scrape(port)).text
        assert value(text, "ingestion_events_stream_entries", ingestion_job=JOB) == 100
        assert value(text, "ingestion_consumer_group_lag_entries", group="fast", ingestion_job=JOB) == 0
        assert value(text, "ingestion_consumer_group_lag_entries", group="slow", ingestion_job=JOB) == 100
        assert value(text, "ingestion_consumer_group_lag_max_entries", ingestion_job=JOB) == 100

        redis_client.xgroup_destroy(key, "slow")
        await store.commit("a", 1, source.token_of(100), [source.record(i) for i in range(101, 401)])
        text = (await scrape(port)).text
        entries = value(text, "ingestion_events_stream_entries", ingestion_job=JOB)
        trimmed = value(text, "ingestion_events_trimmed_total", ingestion_job=JOB)
        assert entries is not None and trimmed is not None
        assert 50 <= entries < 400 and entries + trimmed == 400
        nursery.cancel_scope.cancel()


async def test_no_metric_label_clashes_with_prometheus_target_labels(open_store: OpenStore) -> None:
    observer = NodeObserver("a", "j")
    observer.election_event("lost-leadership", token=1, reason="shutdown")
    store = open_store("redis://127.0.0.1:1", "j", timeout=0.25)
    metrics = NodeMetrics(observer, stream_info={"j": store.events_info})
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    labels = {name for f in families for s in f.samples for name in s.labels}
    assert "ingestion_job" in labels
    assert not labels & {"job", "instance"}
    assert value(metrics.exposition().decode(), "ingestion_redis_up", ingestion_job="j") == 0


def test_build_info_and_the_process_collector_are_exposed() -> None:
    text = NodeMetrics(NodeObserver("a", "j")).exposition().decode()
    assert value(text, "ingestion_build_info", version=__version__) == 1
    assert (value(text, "process_resident_memory_bytes") or 0) > 0
    assert (value(text, "process_start_time_seconds") or 0) > 0


async def test_livez_answers_whatever_the_node_state() -> None:
    observer = NodeObserver("n", "j")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, "127.0.0.1", 0, observer, LOG)
        for role_event in (None, "stopped"):
            if role_event:
                observer.election_event(role_event)
            response = await scrape(port, "/livez")
            assert response.status_code == 200
            assert response.json() == {"status": "alive", "node": "n"}
        nursery.cancel_scope.cancel()


async def test_readyz_waits_for_the_election_then_fails_once_redis_is_silent_for_a_ttl(
    private_redis: LocalRedis, job: str, open_store: OpenStore
) -> None:
    store = open_store(private_redis.url, job, timeout=0.25)
    observer = NodeObserver("n", job)
    ttl = 0.5
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(serve_metrics, stream_info={job: store.events_info}, ttl=ttl),
            "127.0.0.1", 0, observer, LOG,
        )  # fmt: skip
        response = await scrape(port, "/readyz")
        assert response.status_code == 503
        assert response.json()["reasons"] == [f"{job}: not yet joined the election"]

        observer.election_event("standby", leader="other", token=3)
        response = await scrape(port, "/readyz")
        assert response.status_code == 200
        assert response.json() == {
            "status": "ready", "node": "n",
            "jobs": {job: {"ready": True, "role": "standby", "redis_up": True, "source_up": None,
                           "reasons": []}},
        }  # fmt: skip
        assert value((await scrape(port)).text, "ingestion_redis_up", ingestion_job=job) == 1
        assert (await scrape(port, "/healthz")).status_code == 200

        await trio.to_thread.run_sync(private_redis.stop)
        response = await scrape(port, "/readyz")
        assert response.status_code == 200  # Redis answered less than a TTL ago
        await trio.sleep(ttl + 0.1)
        response = await scrape(port, "/readyz")
        assert response.status_code == 503
        doc = response.json()
        assert doc["status"] == "not-ready" and doc["jobs"][job]["redis_up"] is False
        [reason] = doc["reasons"]
        assert reason.startswith(f"{job}: Redis answered not for ") and private_redis.url[8:] in reason
        assert value((await scrape(port)).text, "ingestion_redis_up", ingestion_job=job) == 0
        # Liveness is another question: a node cut off from Redis is safe and alive.
        assert (await scrape(port, "/livez")).status_code == 200
        assert (await scrape(port, "/healthz")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_readyz_is_503_when_redis_never_answered_and_names_the_error(
    job: str, open_store: OpenStore
) -> None:
    observer = NodeObserver("n", job)
    observer.election_event("standby", leader=None, token=None)
    store = open_store("redis://127.0.0.1:1/0", job, timeout=0.25)  # nothing listens on port 1
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            functools.partial(serve_metrics, stream_info={job: store.events_info}),
            "127.0.0.1", 0, observer, LOG,
        )  # fmt: skip
        response = await scrape(port, "/readyz")
        assert response.status_code == 503
        [reason] = response.json()["reasons"]
        assert reason.startswith(f"{job}: Redis answered never (") and "127.0.0.1:1" in reason
        nursery.cancel_scope.cancel()


def test_a_node_is_ready_while_one_job_can_be_served() -> None:
    a, b = NodeObserver("n", "a"), NodeObserver("n", "b")
    metrics = NodeMetrics([a, b])
    a.election_event("standby", leader="m", token=1)
    b.election_event("stopped")
    ready, doc = trio.run(metrics.readiness)
    assert ready and doc["jobs"]["b"] == {
        "ready": False, "role": "stopped", "redis_up": None, "source_up": None,
        "reasons": ["stopped"],
    }  # fmt: skip
    a.source_state(False, None)
    ready, doc = trio.run(metrics.readiness)
    assert not ready
    assert doc["reasons"] == ["a: its source is unreachable", "b: stopped"]


async def test_history_gaps_are_counted_by_action_for_the_job_that_met_them() -> None:
    observers = {"a": NodeObserver("n", "a"), "b": NodeObserver("n", "b")}
    metrics = NodeMetrics(list(observers.values()))
    gap = {"cursor": "12-1", "cursor_ledger": 12, "elder_ledger": 40, "horizon": "http://h"}
    # As in a node process: the listener is set for the whole node, the job bound in its tasks.
    history_gap_listener.set(functools.partial(_count_history_gap, observers))
    structlog.contextvars.bind_contextvars(job="b")
    with pytest.raises(SourceFatalError):
        await record_history_gap(gap, on_history_gap="stop", audit=None, stop_message="x", resume={})
    assert await record_history_gap(gap, on_history_gap="skip", audit=None, stop_message="x",
                                    resume={}) is None  # fmt: skip
    structlog.contextvars.unbind_contextvars("job")
    text = metrics.exposition().decode()
    assert value(text, "ingestion_history_gaps_total", ingestion_job="b", action="stop") == 1
    assert value(text, "ingestion_history_gaps_total", ingestion_job="b", action="skip") == 1
    assert value(text, "ingestion_history_gaps_total", ingestion_job="a", action="stop") == 0


def test_readyz_says_why_a_node_holds_off_and_the_cause() -> None:
    from ingestion.serve.metrics import job_readiness

    observer = NodeObserver("n1", "j")
    assert job_readiness(observer.snapshot(), None, 0.0) == ["not yet joined the election"]
    observer.election_event("campaign-held-off", reason="sink-unreachable", error="sink.url ...: refused")
    assert job_readiness(observer.snapshot(), None, 0.0) == [
        "not yet joined the election: held off, sink-unreachable (sink.url ...: refused)"
    ]
    observer.election_event("standby", leader="n2", token=3)
    assert observer.snapshot().held_off is None
