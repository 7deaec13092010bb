"""The supervisor: opens the node's nursery, wires the actors' channels and starts them in order.

    Ingestor --CommitCursor--> CursorWriter
       ^  |                         |
       |  +------TermEnded------+   | FencingTokenRejected
       |                        v   v
    LeaseGranted/Extended/Revoked  Elector <--RenewSucceeded/Failed/Rejected-- Heartbeat
       +----------------------------+  +----------StartRenewing/StopRenewing------^

Every actor is started with ``nursery.start`` so the node is ready only when all of them are. The
Elector is started last; when it returns (after a shutdown request) the node is done.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from actors.balance import MAX_RANK_DELAY, Balancer, CampaignGate
from actors.commit_pace import CommitPace
from actors.cursor_writer import CursorWriter
from actors.elector import Elector, IngestionFatal, ReleaseNoticed
from actors.health import ProbedSource, SourceWatch
from actors.heartbeat import Heartbeat
from actors.ingestor import Ingestor, leaves
from actors.lease import LeaseTiming, LostReason
from actors.lease_store import LeaseStore, NodeRegistry
from actors.messages import (
    CampaignNow,
    ElectorInput,
    HandBack,
    HeartbeatInput,
    IngestorInput,
    ShutdownRequested,
    WriterInput,
)
from actors.observe import NodeObserver
from actors.sink import ProbedSink, RedisStreamSink, Sink
from actors.source import HeldOffSource, Source
from actors.token_memory import TokenMemory

RELEASE_POLL = 1.0  # seconds a release-listener wait lasts before it is re-armed


@attrs.frozen
class NodeSpec:
    node: str
    job: str
    ttl_ms: int
    timing: LeaseTiming
    jitter: float
    start_cursor: str
    state_dir: str | None = None  # where the node keeps the highest token it has seen (None: memory)
    # Seconds every request to the source may fail before a leader hands over to a node that can
    # reach it (sources with a ``health`` and a ``probe()`` only; None: never).
    handover_after: float | None = None


@attrs.define
class NodeHandle:
    """What the owner of a running node can do with it."""

    spec: NodeSpec
    observer: NodeObserver
    _inbox: trio.MemorySendChannel[ElectorInput | ReleaseNoticed]
    # For the balancer: the job's source watch (which nodes can lead it) and Elector (who leads).
    watch: SourceWatch | None = None
    elector: Elector | None = None

    async def shutdown(self, signal: str = "request") -> None:
        """Ask the node to stop gracefully: finish the in-flight commit, release the lease."""
        try:
            await self._inbox.send(ShutdownRequested(signal))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # already stopped

    def shutdown_soon(self, signal: str = "request") -> None:
        """:meth:`shutdown` from synchronous code (a node restarted after it was asked to stop)."""
        try:
            self._inbox.send_nowait(ShutdownRequested(signal))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # busy (a drain sends it again) or stopped

    def wake(self) -> None:
        """Wake a held-off standby: the balance changed, it should ask again now."""
        try:
            self._inbox.send_nowait(CampaignNow())
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # busy (it will look soon anyway) or stopped

    async def hand_back(self, token: int | None = None) -> None:
        """Ask the node to end term ``token`` gracefully and stay a standby (balancing); by
        default the term it leads now, as its observer says (nothing when it leads none). A
        term that has ended by the time the Elector reads the request is not followed by
        another's end: the Elector ignores a hand-back for any term but its current one."""
        token = token if token is not None else leading_term(self.observer)
        if token is None:
            return
        try:
            await self._inbox.send(HandBack(token))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def leading_term(observer: NodeObserver) -> int | None:
    """The token of the term the node leads now, None when it leads none."""
    status = observer.snapshot()
    return status.token if status.role == "leader" else None


async def listen_for_releases(
    store: LeaseStore, out: trio.MemorySendChannel[ElectorInput | ReleaseNoticed]
) -> None:
    notices = store.release_notices()
    with out:
        try:
            while True:
                holder = await notices.wait(RELEASE_POLL)
                if holder is not None:
                    await out.send(ReleaseNoticed(holder, notices.handed_over))
        finally:
            notices.close()


async def run_node(
    store: LeaseStore,
    source: Source,
    spec: NodeSpec,
    log: Any,
    observer: NodeObserver | None = None,
    *,
    gate: CampaignGate | None = None,
    sink: Sink | None = None,
    task_status: trio.TaskStatus[NodeHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one node until it is asked to shut down (returns) or ingestion fails fatally (raises).

    ``gate``: asked before every campaign (the balancer, when one process hosts several jobs).
    ``sink``: where the job's records and cursor go (default: the events stream in ``store``)."""
    job_sink: Sink = sink if sink is not None else RedisStreamSink(store)
    observer = observer or NodeObserver(spec.node, spec.job)
    elector_send, elector_recv = trio.open_memory_channel[ElectorInput | ReleaseNoticed](16)
    heartbeat_send, heartbeat_recv = trio.open_memory_channel[HeartbeatInput](4)
    ingestor_send, ingestor_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[WriterInput](0)

    # What this node knows of the job on this Redis deployment (durable with a state directory).
    memory = TokenMemory(spec.job, spec.state_dir, deployment=store.deployment)

    async with trio.open_nursery() as nursery:
        await nursery.start(
            CursorWriter(
                store, spec.node, writer_recv, elector_send.clone(), log, observer, memory=memory,
                sink=job_sink,
            ).run
        )
        await nursery.start(
            Heartbeat(
                store,
                spec.node,
                spec.ttl_ms,
                spec.timing.renew_interval,
                heartbeat_recv,
                elector_send.clone(),
                log,
            ).run
        )
        ingestor = Ingestor(source, spec.node, ingestor_recv, writer_send, elector_send.clone(), log)
        # An in-flight commit is answered within the sink's call bound: wait that long for it.
        ingestor.commit_drain = job_sink.call_timeout + 0.25
        # A commit may hold the sink (a Redis script blocks everyone) for a fifth of the call bound.
        ingestor.pace = CommitPace(budget=job_sink.call_timeout / 5)
        ingestor.sink_keeps_cursor = not isinstance(job_sink, RedisStreamSink)
        ingestor.start_cursor = spec.start_cursor
        await nursery.start(ingestor.run)
        nursery.start_soon(listen_for_releases, store, elector_send.clone())
        nursery.start_soon(store.follow_primary)  # returns at once without Sentinel
        handle = NodeHandle(spec, observer, elector_send.clone())
        watch: SourceWatch | None = None
        if spec.handover_after is not None and isinstance(source, ProbedSource):
            to_elector = elector_send.clone()

            async def hand_over(token: int) -> None:
                try:
                    await to_elector.send(HandBack(token, LostReason.SOURCE_UNAVAILABLE.value))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            watch = SourceWatch(
                store, spec.node, source, spec.ttl_ms / 1000, spec.handover_after, log, observer,
                leading=functools.partial(leading_term, observer), hand_over=hand_over,
            )  # fmt: skip
            await nursery.start(watch.run)
        handle.watch = watch
        if isinstance(source, HeldOffSource):
            nursery.start_soon(source.look_between_campaigns)
        elector = Elector(
            store,
            spec.node,
            spec.ttl_ms,
            spec.timing,
            spec.jitter,
            spec.start_cursor,
            elector_recv,
            heartbeat_send,
            ingestor_send,
            log,
            observer,
            memory=memory,
            gate=gate,
            source_watch=watch,
            hold_check=source.hold_off if isinstance(source, HeldOffSource) else None,
            sink_probe=job_sink.probe if isinstance(job_sink, ProbedSink) else None,
            sink_error=(lambda: job_sink.probe_error) if isinstance(job_sink, ProbedSink) else (lambda: None),
            sink_keeps_cursor=ingestor.sink_keeps_cursor,
        )
        elector_send.close()
        handle.elector = elector

        async def elector_then_stop(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                await elector.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel("the elector has stopped")

        await nursery.start(elector_then_stop)
        task_status.started(handle)


@attrs.frozen
class JobRun:
    """One job a node process hosts: its store, source, spec, log and observer."""

    store: LeaseStore
    source: Source
    spec: NodeSpec
    log: Any
    observer: NodeObserver
    sink: Sink | None = None  # None: the events stream in ``store``


@attrs.define
class JobsHandle:
    """What the owner of :func:`run_jobs` can do: drain every job."""

    handles: dict[str, NodeHandle]
    balancer: Balancer | None
    # Set when a job is stopped for good here (or the node drains): a failed job is not restarted.
    stops: dict[str, trio.Event] = attrs.Factory(dict)

    async def stop_job(self, job: str, reason: str) -> None:
        """Stop one job on this node for good (gracefully: it finishes its commit and releases
        its lease) while the others go on; it no longer counts in the balancer's share. A job
        that has stopped already is left alone."""
        handle = self.handles.get(job)
        if handle is None:
            return
        if job in self.stops:
            self.stops[job].set()
        if self.balancer is not None:
            self.balancer.job_stopped(job)
        if handle.watch is not None:
            await handle.watch.forget()
        await handle.shutdown(reason)

    async def shutdown(self, signal: str = "request") -> None:
        """Leave the node registry first (the others' shares grow at once), then stop every job
        gracefully: each finishes its commit and releases its lease with a notice."""
        for stop in self.stops.values():
            stop.set()
        if self.balancer is not None:
            self.balancer.draining = True
            await self.balancer.leave()
        for handle in self.handles.values():
            if handle.watch is not None:
                await handle.watch.forget()  # no longer able: the placement skips this node
        for handle in self.handles.values():
            await handle.shutdown(signal)


async def run_jobs(
    jobs: list[JobRun],
    log: Any,
    *,
    registry: NodeRegistry | None = None,
    on_fatal: Any = None,
    balanced: bool = False,
    owns_registration: bool = True,
    max_rank_delay: float = MAX_RANK_DELAY,
    able_of: Callable[[str], frozenset[str] | None] | None = None,
    task_status: trio.TaskStatus[JobsHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Host several elected jobs under one nursery until every one has stopped.

    With a ``registry`` (and more than one job, or ``balanced``) a
    :class:`~actors.balance.Balancer` spreads their leadership over the live nodes (and, unless
    ``owns_registration`` is False, unregisters the node when it stops); ``max_rank_delay`` is
    its longest wait before a fallback campaign for a job placed on another node, and
    ``able_of(job)`` (when given) the other nodes able to lead a job, instead of its source watch's
    view. A job whose
    source fails fatally stops alone: ``on_fatal(job, error)`` is called (default: nothing) and
    the others go on. A job whose actors raise anything else once it has started (a bug, or input
    nobody foresaw, outside a term: a term's own failure ends only that term) is logged
    ``job-failed`` and started again after a back-off (a TTL, doubled for each failure in a row,
    at most :data:`JOB_RESTART_CAP` s); the others go on.
    """
    node = jobs[0].spec.node
    handles: dict[str, NodeHandle] = {}
    stops = {job.spec.job: trio.Event() for job in jobs}
    balancer: Balancer | None = None
    async with trio.open_nursery() as nursery:
        if registry is not None and (len(jobs) > 1 or balanced):
            ttl = jobs[0].spec.ttl_ms

            async def hand_back(job: str) -> None:
                # The term the balancer saw leading: read in the same step as its decision.
                if job in handles:
                    await handles[job].hand_back()

            def wake(job: str) -> None:
                if job in handles:
                    handles[job].wake()

            balancer = Balancer(
                registry,
                node,
                [j.spec.job for j in jobs],
                # (the role alone: a snapshot of the whole status, 200 times a decision, cost the
                # node of 200 jobs most of its main thread)
                leading=lambda job: handles[job].observer.role == "leader" if job in handles else False,
                hand_back=hand_back,
                wake=wake,
                log=log,
                interval=max(0.1, ttl / 4000),
                live_window_ms=ttl,
                ttl=ttl / 1000,
                able=able_of if able_of is not None else (
                    lambda job: w.able if job in handles and (w := handles[job].watch) else None
                ),
                holder=lambda job: e.seen_holder if job in handles and (e := handles[job].elector) else None,
                owns_registration=owns_registration,
                max_rank_delay=max_rank_delay,
            )
            await nursery.start(balancer.run)
        left = len(jobs)

        async def run_job(job: JobRun, *, task_status: trio.TaskStatus[NodeHandle]) -> None:
            nonlocal left
            # Every log line of this job's tasks (its source's included) carries the job: bound in
            # this task's own context, which the job's tasks inherit.
            structlog.contextvars.bind_contextvars(job=job.spec.job)
            try:
                await run_restarting(job, task_status)
            except* IngestionFatal as group:
                # Stopped here only: no longer counted as able to lead it, nor in the share.
                if balancer is not None:
                    balancer.job_stopped(job.spec.job)
                handle = handles.get(job.spec.job)
                if handle is not None and handle.watch is not None:
                    await handle.watch.forget()
                if on_fatal is not None:
                    on_fatal(job.spec.job, str(group.exceptions[0]))
            finally:
                left -= 1
                if not left:
                    nursery.cancel_scope.cancel("every job has stopped")

        async def run_restarting(job: JobRun, first: trio.TaskStatus[NodeHandle]) -> None:
            status = _Restarts(first, handles, job.spec.job, stops[job.spec.job])
            failures = 0
            while True:
                began = trio.current_time()
                try:
                    await run_node(
                        job.store, job.source, job.spec, job.log, job.observer,
                        gate=balancer.gate(job.spec.job) if balancer is not None else None,
                        sink=job.sink, task_status=status,
                    )  # fmt: skip
                    return
                except Exception as exc:  # (an exception group too; a cancellation is not one)
                    if not status.handed or _holds(exc, IngestionFatal):
                        raise  # a job that cannot start fails the node's start, as before
                    ttl = job.spec.ttl_ms / 1000
                    failures = 1 if trio.current_time() - began > JOB_RESTART_CAP else failures + 1
                    wait = min(JOB_RESTART_CAP, ttl * 2 ** (failures - 1))
                    failure = next(leaves(exc))
                    error = f"{type(failure).__name__}: {failure}"
                    job.log.error("job-failed", error=error, restart_in_s=round(wait, 3),
                                  failures=failures, exc_info=exc)  # fmt: skip
                    if job.observer.role == "leader":  # (its elector was cancelled mid-term)
                        job.observer.election_event("lost-leadership", token=job.observer.token,
                                                    reason=LostReason.TERM_FAILED.value)  # fmt: skip
                    job.observer.election_event("campaign-held-off", reason="job-failed", error=error)
                with trio.move_on_after(wait):
                    await stops[job.spec.job].wait()
                if stops[job.spec.job].is_set():
                    return

        for job in jobs:
            handles[job.spec.job] = await nursery.start(run_job, job)
        task_status.started(JobsHandle(handles, balancer, stops))


JOB_RESTART_CAP = 60.0  # seconds: the longest wait before a failed job is started again


@attrs.define
class _Restarts:
    """The task status a job's node is started with, each time: the first start is the job's
    (``nursery.start`` waits for it); a restart only replaces the job's handle."""

    first: trio.TaskStatus[NodeHandle]
    handles: dict[str, NodeHandle]
    job: str
    stop: trio.Event  # the job was stopped here (or the node drains)
    handed: bool = False

    def started(self, value: Any = None) -> None:  # (a NodeHandle: run_node always gives one)
        self.handles[self.job] = value
        if not self.handed:
            self.handed = True
            self.first.started(value)
        elif self.stop.is_set():
            # Asked to stop while it was starting again: the ask went to the node that had
            # failed, so this one is asked now.
            value.shutdown_soon()


def _holds(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(kind) is not None
    return isinstance(exc, kind)
