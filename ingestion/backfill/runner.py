"""Each node's backfill runner: the ranges of every plan of the jobs the node hosts, run as jobs.

Every ``interval / POLLS_PER_INTERVAL`` the runner reads the plan of each hosted ``rpc`` or
``lake`` job (``ingestion:{JOB}:backfill``) and the end of each of its ranges: well inside the
TTL after which a balancer adopts a free lease, so that every node hosting the job has started
its range jobs before any node takes more than its share of a new plan's ranges. A running plan
with ranges not done gets a supervisor of its own (:func:`actors.supervisor.run_jobs`,
balanced: its own :class:`~actors.balance.Balancer` spreads the ranges over the nodes that host
the job, apart from the node's live jobs; its fallback campaigns for ranges placed on other
nodes wait half an ``interval``, twice the poll, so that a host that has not yet seen the plan
gets its share), one elected job per range not done; a range found done is stopped on this node
(its leader releases it gracefully), and a plan cancelled, removed or replaced stops them all.
Once every range is done, the plan is settled ``done`` in Redis (``lua/settle.lua``: whichever
node looks first; ``backfill-done``), which stops the plan's supervisor on every node, frees the
job for a new span, and leaves the plan's final figures in the metrics.
Every node decides alone from what Redis holds, so a node that starts, restarts or crashes
meanwhile changes only who leads which range: each range resumes from its committed cursor.
"""

from __future__ import annotations

import datetime
import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import redis
import trio

from actors.lease_store import LeaseStore, NodeRegistry, RedisUnavailable
from actors.supervisor import JobRun, JobsHandle, run_jobs
from ingestion.backfill.plan import Plan, range_name
from ingestion.backfill.status import Snapshot, read_progress, settle
from ingestion.common.keyspace import backfill_key
from ingestion.config.sections import JobSettings

STOP_WAIT = 3.0  # seconds a node's shutdown waits for its ranges to release their leases
POLLS_PER_INTERVAL = 4


def _store_errors() -> tuple[type[Exception], ...]:
    """What a failed read of a plan's progress raises: Redis's errors, PostgreSQL's once loaded."""
    # psycopg is not imported here: start-up time (~0.1 s) for the nodes that have no PostgreSQL
    # sink; a node that never loaded it (read_progress does for one) cannot see its errors.
    psycopg = sys.modules.get("psycopg")
    return (redis.RedisError, OSError, *((psycopg.Error,) if psycopg is not None else ()))


def range_job(job: JobSettings, first: int, last: int) -> JobSettings:
    """The settings of the range ``first..last`` of ``job``: the same source, filter and sink,
    named after its bounds, started at ledger ``first`` and bounded at ``last``."""
    return attrs.evolve(
        job, name=range_name(job.name, first, last), start_cursor=str(first), parent=job.name,
        last_ledger=last,
    )  # fmt: skip


@attrs.define
class _Running:
    plan: Plan
    handle: JobsHandle
    done: trio.Event
    stopped: set[str] = attrs.Factory(set)  # ranges found done and stopped here


@attrs.define
class BackfillRunner:
    """See the module docstring. ``make_run`` builds a range job's store, source, sink and
    observer; ``stores`` are the hosted jobs' own (each reads its plan). ``parent_able(job)``:
    the other nodes able to lead the hosted job ``job`` (its source watch's view; None: not
    known): they run its ranges too, so they are able to lead them before they have ever
    campaigned for one, and a new plan's ranges are placed over all of them from the start."""

    jobs: Sequence[JobSettings]
    stores: dict[str, LeaseStore]
    registry: NodeRegistry
    make_run: Callable[[JobSettings], JobRun]
    log: Any
    interval: float
    parent_able: Callable[[str], frozenset[str] | None] = lambda job: None
    schema: str = "ingestion"  # the PostgreSQL sink's, where a job's ranges write there
    running: dict[str, _Running] = attrs.Factory(dict)
    # job -> its plan's progress as last read (once an interval while it runs): the metrics'
    progress: dict[str, Snapshot] = attrs.Factory(dict)
    _progress_at: dict[str, float] = attrs.Factory(dict)
    finished: dict[str, Plan] = attrs.Factory(dict)  # plans found done (their figures read once)
    _unavailable: bool = False
    _stopping: bool = False

    @property
    def hosted(self) -> list[JobSettings]:
        return [j for j in self.jobs if j.kind in ("rpc", "lake") and not j.parent]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while not self._stopping:
                for job in self.hosted:
                    try:
                        await self._look(nursery, job)
                    except RedisUnavailable as exc:
                        if not self._unavailable:
                            self.log.warning("backfill-plan-unreadable", parent_job=job.name, error=str(exc))
                        self._unavailable = True
                        break
                else:
                    self._unavailable = False
                await trio.sleep(self.interval / POLLS_PER_INTERVAL)

    async def _look(self, nursery: trio.Nursery, job: JobSettings) -> None:
        store = self.stores[job.name]
        fields = await store.run(store.client.hgetall, backfill_key(job.name))
        plan = Plan.from_hash(job.name, {str(k): str(v) for k, v in fields.items()}) if fields else None
        running = self.running.get(job.name)
        live = plan is not None and plan.state == "running"
        if running is not None and not (live and plan is not None and plan.same_work(running.plan)):
            why = "backfill-removed" if plan is None else {
                "cancelled": "backfill-cancelled", "done": "backfill-done"
            }.get(plan.state, "backfill-replaced")  # fmt: skip
            await self._stop(job.name, why)
            if why != "backfill-done":
                self._forget_progress(job.name)
            return
        if plan is None or plan.state == "cancelled":
            self._forget_progress(job.name)
            return
        if plan.state == "done":  # its final figures, read once (the metrics keep them)
            if not (job.name in self.finished and self.finished[job.name].same_work(plan)):
                await self._read_progress(store, job, plan, force=True)
                self.finished[job.name] = plan
            return
        self.finished.pop(job.name, None)
        done = [await self._is_done(store, name) for name in plan.names]
        # (a plan found done is read once more at once: its final figures)
        await self._read_progress(store, job, plan, force=all(done))
        if all(done):
            await self._settle(store, job, plan)
            return
        if running is None:
            todo = [(a, b) for (a, b), d in zip(plan.bounds, done, strict=True) if not d]
            runs = [self.make_run(range_job(job, a, b)) for a, b in todo]
            self.running[job.name] = await nursery.start(self._run_plan, job.name, plan, runs)
            return
        for name, is_done in zip(plan.names, done, strict=True):
            if is_done and name in running.handle.handles and name not in running.stopped:
                running.stopped.add(name)
                await running.handle.stop_job(name, "backfill-range-done")

    async def _settle(self, store: LeaseStore, job: JobSettings, plan: Plan) -> None:
        """Every range done: the plan is ``done`` in Redis (one node's write wins; the next look
        stops this node's ranges, and a new span is accepted)."""
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        moved, _state = await store.run(settle, store.client, plan, "done", at)
        if moved:
            snapshot = self.progress.get(job.name)
            self.log.info("backfill-done", parent_job=job.name, first_ledger=plan.first,
                          last_ledger=plan.last, ranges=plan.ranges,
                          records=snapshot.records if snapshot is not None else None)  # fmt: skip

    async def _read_progress(
        self, store: LeaseStore, job: JobSettings, plan: Plan, *, force: bool = False
    ) -> None:
        """The plan's progress for the metrics, read again once an interval (bounded by it; a
        failed read keeps the last one: the next look tries again)."""
        now = trio.current_time()
        last = self.progress.get(job.name)
        force = force or last is None or not last.progress.plan.same_work(plan)
        if not force and now - self._progress_at.get(job.name, -math.inf) < self.interval:
            return
        self._progress_at[job.name] = now
        with trio.move_on_after(self.interval):
            try:
                self.progress[job.name] = await trio.to_thread.run_sync(
                    read_progress, store.client, plan, job.sink, self.schema, abandon_on_cancel=True
                )
            except _store_errors() as exc:
                self.log.debug("backfill-progress-unreadable", parent_job=job.name, error=str(exc))

    def _forget_progress(self, job: str) -> None:
        self.progress.pop(job, None)
        self._progress_at.pop(job, None)

    async def _is_done(self, store: LeaseStore, name: str) -> bool:
        return bool(await store.run(store.client.hexists, backfill_key(name), "done"))

    async def _run_plan(
        self, job: str, plan: Plan, runs: list[JobRun], *, task_status: trio.TaskStatus[_Running]
    ) -> None:
        done = trio.Event()
        able = self.parent_able(job)
        self.log.info("backfill-ranges-hosted", parent_job=job, ranges=[r.spec.job for r in runs],
                      first_ledger=plan.first, last_ledger=plan.last,
                      other_hosts=sorted(able) if able is not None else None)  # fmt: skip

        def on_fatal(name: str, error: str) -> None:
            self.log.error("backfill-range-stopped", range=name, error=error)

        try:
            async with trio.open_nursery() as nursery:
                handle = await nursery.start(functools.partial(
                    run_jobs, runs, self.log, registry=self.registry, on_fatal=on_fatal, balanced=True,
                    owns_registration=False, max_rank_delay=self.interval / 2,
                    able_of=lambda _range: self.parent_able(job),
                ))  # fmt: skip
                task_status.started(_Running(plan, handle, done))
        finally:
            for run in runs:
                if run.sink is not None:
                    run.sink.close()  # type: ignore[attr-defined]
            if self.running.get(job) is not None and self.running[job].done is done:
                del self.running[job]
            done.set()
            self.log.info("backfill-ranges-left", parent_job=job)

    async def _stop(self, job: str, reason: str) -> None:
        running = self.running.get(job)
        if running is None:
            return
        await running.handle.shutdown(reason)
        with trio.move_on_after(STOP_WAIT):
            await running.done.wait()

    async def shutdown(self, reason: str) -> None:
        """Stop every range this node runs gracefully (each releases its lease), waiting a few
        seconds at most, and look for no more plans."""
        self._stopping = True
        async with trio.open_nursery() as nursery:
            for job in list(self.running):
                nursery.start_soon(self._stop, job, reason)
