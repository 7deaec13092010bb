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

from typing import Any

import attrs
import trio

from actors.cursor_writer import CursorWriter
from actors.elector import Elector, ReleaseNoticed
from actors.heartbeat import Heartbeat
from actors.ingestor import Ingestor
from actors.lease import LeaseTiming
from actors.lease_store import LeaseStore
from actors.messages import (
    CommitCursor,
    ElectorInput,
    HeartbeatInput,
    IngestorInput,
    ShutdownRequested,
)
from actors.observe import NodeObserver
from actors.source import Source
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


@attrs.define
class NodeHandle:
    """What the owner of a running node can do with it."""

    spec: NodeSpec
    observer: NodeObserver
    _inbox: trio.MemorySendChannel[ElectorInput | ReleaseNoticed]

    async def shutdown(self, signal: str = "request") -> None:
        """Ask the node to stop gracefully: finish the in-flight commit, release the lease."""
        try:
            await self._inbox.send(ShutdownRequested(signal))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # already stopped


async def listen_for_releases(
    store: LeaseStore, out: trio.MemorySendChannel[ElectorInput | ReleaseNoticed]
) -> None:
    notices = store.release_notices()
    with out:
        try:
            while True:
                holder = await notices.wait(RELEASE_POLL)
                if holder is not None:
                    await out.send(ReleaseNoticed(holder))
        finally:
            notices.close()


async def run_node(
    store: LeaseStore,
    source: Source,
    spec: NodeSpec,
    log: Any,
    observer: NodeObserver | None = None,
    *,
    task_status: trio.TaskStatus[NodeHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one node until it is asked to shut down (returns) or ingestion fails fatally (raises)."""
    observer = observer or NodeObserver(spec.node, spec.job)
    elector_send, elector_recv = trio.open_memory_channel[ElectorInput | ReleaseNoticed](16)
    heartbeat_send, heartbeat_recv = trio.open_memory_channel[HeartbeatInput](4)
    ingestor_send, ingestor_recv = trio.open_memory_channel[IngestorInput](4)
    writer_send, writer_recv = trio.open_memory_channel[CommitCursor](0)

    async with trio.open_nursery() as nursery:
        await nursery.start(
            CursorWriter(
                store, spec.node, writer_recv, elector_send.clone(), log, observer
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
        # An in-flight commit is answered within the store's call bound: wait that long for it.
        ingestor.commit_drain = store.call_timeout + 0.25
        await nursery.start(ingestor.run)
        nursery.start_soon(listen_for_releases, store, elector_send.clone())
        nursery.start_soon(store.follow_primary)  # returns at once without Sentinel
        handle = NodeHandle(spec, observer, elector_send.clone())
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
            memory=TokenMemory(spec.job, spec.state_dir),
        )
        elector_send.close()

        async def elector_then_stop(*, task_status: trio.TaskStatus[None]) -> None:
            try:
                await elector.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel("the elector has stopped")

        await nursery.start(elector_then_stop)
        task_status.started(handle)
