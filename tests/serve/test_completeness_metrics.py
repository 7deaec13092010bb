"""The completeness metrics (issue 49): ``ingestion_complete_through_ledger`` and
``ingestion_source_latest_ledger`` from what the leader committed, and
``ingestion_decode_errors_total`` from the records a job's stage handed on with a decode error,
counted for the job that met them."""

from __future__ import annotations

import functools

import orjson
import redis
import structlog
import trio

from actors.lease_store import job_keys
from actors.observe import NodeObserver
from actors.source import Batch, SyntheticSource, Watermark
from ingestion.decode.decoded import decode_event_text
from ingestion.decode.stage import EventsStage, decode_error_listener
from ingestion.node.worker import _count_decode_errors
from ingestion.serve.metrics import NodeMetrics
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.metrics import value
from tests.support.nodes import Recorder, start_node


def test_the_watermark_and_the_source_s_latest_ledger_are_the_leader_s_only() -> None:
    observer = NodeObserver("n", "j")
    metrics = NodeMetrics(observer)
    observer.complete_through(41, "", 43)
    text = metrics.exposition().decode()
    assert value(text, "ingestion_complete_through_ledger", ingestion_job="j") is None  # not leading
    observer.election_event("became-leader", token=1)
    observer.complete_through(42, "", 44)
    text = metrics.exposition().decode()
    assert value(text, "ingestion_complete_through_ledger", ingestion_job="j") == 42
    assert value(text, "ingestion_source_latest_ledger", ingestion_job="j") == 44
    assert value(text, "ingestion_decode_errors_total", ingestion_job="j") == 0


async def test_records_that_cannot_be_decoded_are_committed_and_counted_for_their_job(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    observers = {job: NodeObserver("n1", job), "other": NodeObserver("n1", "other")}
    # As in a node process: the listener is set for the whole node, the job bound in its tasks.
    decode_error_listener.set(functools.partial(_count_decode_errors, observers))
    # The synthetic records are no contract events: each is committed with a decodeError member.
    stage = EventsStage(SyntheticSource(total=12, batch_size=4), decode_event_text)
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        structlog.contextvars.bind_contextvars(job=job)
        try:
            node = await start_node(nursery, rec, redis_server.url, job, "n1", stage)
        finally:
            structlog.contextvars.unbind_contextvars("job")
        await wait_until(lambda: redis_client.xlen(job_keys(job)["events"]) == 12, 10, what="12 records")
        await node.shutdown()
    bodies = [orjson.loads(f["record"]) for _, f in redis_client.xrange(job_keys(job)["events"])]
    assert [b["seq"] for b in bodies] == list(range(1, 13))  # nothing lost, the job went on
    assert all("not an event" in b["decodeError"] for b in bodies)
    text = NodeMetrics(list(observers.values())).exposition().decode()
    assert value(text, "ingestion_decode_errors_total", ingestion_job=job) == 12
    assert value(text, "ingestion_decode_errors_total", ingestion_job="other") == 0


def test_a_batch_split_into_parts_carries_its_watermark_on_the_last() -> None:
    records = tuple(SyntheticSource().record(i) for i in range(1, 6))
    batch = Batch(records, through=SyntheticSource.token_of(7), watermark=Watermark(7))
    parts = batch.split(2)
    assert [p.watermark for p in parts] == [None, None, Watermark(7)]
    first, rest = batch.take(3)
    assert first.watermark is None and rest is not None and rest.watermark == Watermark(7)
