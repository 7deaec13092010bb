"""No job can take down its node: an exception nobody foresaw, escaping one job's term, ends that
term (``term-failed``), backs that job off, and leaves the node's other jobs untouched."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import attrs
import pytest
import redis
import structlog
import trio

from actors.lease_store import LeaseStore, job_keys
from actors.lease_store.notices import STANDS_ASIDE, _holder
from actors.observe import NodeObserver
from actors.sink import RedisStreamSink
from actors.source import Batch, SyntheticSource
from actors.supervisor import JobRun, JobsHandle, NodeSpec, run_jobs
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.nodes import FAST_TIMING, Recorder, assert_exactly_once_in_order, lease_store


def spec(node: str, job: str) -> NodeSpec:
    return NodeSpec(node, job, int(FAST_TIMING.ttl * 1000), FAST_TIMING, 0.01, "0")


def live() -> SyntheticSource:
    return SyntheticSource(total=None, batch_size=5, interval=0.02)


@attrs.define
class FailingTerms:
    """A synthetic source whose first ``failures`` terms raise ``ValueError`` after their first
    batch: plainly, or from a task of the source's own (inside an exception group)."""

    failures: int
    in_group: bool
    inner: SyntheticSource = attrs.field(factory=lambda: live())
    terms: int = 0

    async def resolve_start(self, cursor: str) -> str:
        return await self.inner.resolve_start(cursor)

    @trio.as_safe_channel
    async def stream(self, cursor: str) -> AsyncGenerator[Batch, None]:
        self.terms += 1
        failing = self.terms <= self.failures
        async with self.inner.stream(cursor) as batches:
            async for batch in batches:
                yield batch
                if failing:
                    await self._fail()

    async def _fail(self) -> None:
        if not self.in_group:
            raise ValueError("replay --from TIME needs the source job's Redis stream")

        async def deliver() -> None:
            raise ValueError("replay --from TIME needs the source job's Redis stream")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver)
            await trio.sleep_forever()


@contextlib.contextmanager
def stores(url: str, jobs: list[str]) -> Iterator[dict[str, LeaseStore]]:
    """(Calls bounded at 1 s, not the nodes' 150 ms: what is tested here is what a failure does,
    and on a loaded machine a Redis call past 150 ms ends a term too.)"""
    with contextlib.ExitStack() as stack:
        yield {job: stack.enter_context(lease_store(url, job, timeout=1.0)) for job in jobs}


@pytest.mark.parametrize("in_group", [False, True], ids=["plain", "in-a-group"])
async def test_an_exception_in_one_jobs_term_ends_that_term_and_spares_the_node_and_its_other_jobs(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, in_group: bool
) -> None:
    """Before: the ``ValueError`` escaped ``Ingestor.run`` and took ``run_jobs`` (the node, with
    every job it hosts) down with it."""
    failing, others = f"{job}-bad", [f"{job}-ok1", f"{job}-ok2"]
    source = FailingTerms(failures=2, in_group=in_group)
    rec = Recorder()
    with stores(redis_server.url, [failing, *others]) as by_job, structlog.testing.capture_logs() as logs:
        runs = []
        for name in [failing, *others]:
            observer = NodeObserver("a", name)
            observer.listeners.append(rec.listener(name))
            job_source = source if name == failing else live()
            runs.append(JobRun(by_job[name], job_source, spec("a", name),
                               structlog.get_logger().bind(node="a", job=name), observer))  # fmt: skip
        async with trio.open_nursery() as nursery:
            handle: JobsHandle = await nursery.start(
                functools.partial(run_jobs, runs, structlog.get_logger())
            )
            await rec.wait_for("became-leader", failing, count=3, within=20)  # two failed terms, then a third
            before = {name: redis_client.xlen(job_keys(name)["events"]) for name in others}
            await wait_until(
                lambda: all(redis_client.xlen(job_keys(n)["events"]) > before[n] + 20 for n in others),
                10, what="the other jobs going on",
            )  # fmt: skip
            await wait_until(lambda: redis_client.xlen(job_keys(failing)["events"]) > 30, 10,
                             what="the failed job going on once its terms stop failing")  # fmt: skip
            await handle.shutdown()
    failed = [e for e in logs if e["event"] == "term-failed"]
    assert [e["job"] for e in failed] == [failing, failing]
    error = "ValueError: replay --from TIME needs the source job's Redis stream"
    assert all(e["error"] == error for e in failed)
    assert all(e["log_level"] == "error" and isinstance(e["exc_info"], ValueError) for e in failed)
    lost = [e for e in logs if e["event"] == "lost-leadership" and e["job"] == failing]
    assert [e["reason"] for e in lost[:2]] == ["term-failed", "term-failed"]
    held = [e for e in logs if e["event"] == "campaign-held-off" and e.get("reason") == "term-failed"]
    # backed off a TTL, then twice that (the second failure in a row)
    assert [(e["terms"], e["for_s"]) for e in held] == [(1, FAST_TIMING.ttl), (2, 2 * FAST_TIMING.ttl)]
    terms = [e.at for e in rec.of("became-leader", failing)]
    assert terms[1] - terms[0] >= FAST_TIMING.ttl and terms[2] - terms[1] >= 2 * FAST_TIMING.ttl
    # no other job's term failed, and every job's records are there once, in order
    assert not [e for e in logs if e["event"] in ("term-failed", "job-failed") and e["job"] != failing]
    assert not [e for e in logs if e["event"] == "lost-leadership" and e["job"] != failing and
                e["reason"] not in ("shutdown", "redis-unavailable")]  # fmt: skip
    for name in [failing, *others]:
        assert_exactly_once_in_order(redis_client, name)
    # each failed term's release says so, and its notice has a standby at its share take the job
    # at once (the failing node backs off): before, a plain release left them waiting a TTL
    released = [f for _id, f in redis_client.xrange(job_keys(failing)["audit"]) if f["event"] == "released"]
    assert [f.get("reason") for f in released[:2]] == ["term-failed", "term-failed"]
    assert _holder("7|a|term-failed") == ("a", "term-failed") and "term-failed" in STANDS_ASIDE


class ExplodingSink(RedisStreamSink):
    """The events stream in Redis, but its ``explode_at``-th commit raises (before writing) an
    exception the CursorWriter does not know: a failure outside any term's reach."""

    def __init__(self, store: LeaseStore, explode_at: int) -> None:
        super().__init__(store)
        self.commits = 0
        self.explode_at = explode_at

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.commits += 1
        if self.commits == self.explode_at:
            raise RuntimeError("a sink bug")
        return await super().commit(*args, **kwargs)


async def test_a_job_whose_actors_fail_outside_a_term_is_restarted_alone(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    """A failure that escapes a job's actors (here its CursorWriter) stops that job on the node,
    logged ``job-failed``, and starts it again after a TTL; the node's other jobs go on (before:
    ``run_jobs`` raised, and the node exited with every job)."""
    failing, other = f"{job}-bad", f"{job}-ok"
    rec = Recorder()
    with stores(redis_server.url, [failing, other]) as by_job, structlog.testing.capture_logs() as logs:
        runs = []
        for name in (failing, other):
            observer = NodeObserver("a", name)
            observer.listeners.append(rec.listener(name))
            sink = ExplodingSink(by_job[name], explode_at=3) if name == failing else None
            runs.append(JobRun(by_job[name], live(), spec("a", name), structlog.get_logger().bind(job=name),
                               observer, sink))  # fmt: skip
        async with trio.open_nursery() as nursery:
            handle: JobsHandle = await nursery.start(
                functools.partial(run_jobs, runs, structlog.get_logger())
            )
            await rec.wait_for("became-leader", failing, count=2, within=20)
            await wait_until(lambda: redis_client.xlen(job_keys(failing)["events"]) > 30, 10,
                             what="the restarted job going on")  # fmt: skip
            assert handle.handles[failing].observer.snapshot().role == "leader"
            await handle.shutdown()
    (failed,) = [e for e in logs if e["event"] == "job-failed"]
    assert failed["job"] == failing and failed["error"] == "RuntimeError: a sink bug"
    assert failed["restart_in_s"] == FAST_TIMING.ttl
    firsts = [e.at for e in rec.of("became-leader", failing)]
    assert firsts[1] - firsts[0] >= FAST_TIMING.ttl
    assert rec.of("campaign-held-off", failing)[0].fields == {
        "reason": "job-failed",
        "error": failed["error"],
    }
    assert [e.fields["reason"] for e in rec.of("lost-leadership", other)] == ["shutdown"]
    for name in (failing, other):
        assert_exactly_once_in_order(redis_client, name)
