"""Helpers to run in-process nodes against a real Redis and watch what they log."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from actors.lease import LeaseTiming
from actors.lease_store import LeaseStore, connect
from actors.source import Source
from actors.supervisor import NodeHandle, NodeSpec, run_node

FAST_TIMING = LeaseTiming(ttl=1.5, renew_interval=0.3, margin=0.4, drift=0.01)
REDIS_TIMEOUT = 0.15


@attrs.define
class Event:
    at: float  # trio time the observer saw it
    node: str
    event: str
    fields: dict[str, Any]


@attrs.define
class Recorder:
    """Collects every node's election events with the trio time they happened at."""

    events: list[Event] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    def listener(self, node: str) -> Callable[[str, dict[str, Any]], None]:
        def record(event: str, fields: dict[str, Any]) -> None:
            self.events.append(Event(trio.current_time(), node, event, dict(fields)))
            self._changed.set()
            self._changed = trio.Event()

        return record

    def of(self, event: str, node: str | None = None) -> list[Event]:
        return [e for e in self.events if e.event == event and (node is None or e.node == node)]

    async def wait_for(self, event: str, node: str | None = None, *, count: int = 1,
                       within: float = 10.0, **fields: Any) -> Event:
        """The ``count``-th matching event, waiting (bounded) until it has happened."""
        with trio.fail_after(within):
            while True:
                found = [
                    e for e in self.of(event, node)
                    if all(e.fields.get(k) == v for k, v in fields.items())
                ]
                if len(found) >= count:
                    return found[count - 1]
                await self._changed.wait()


def store_for(url: str, job: str, timeout: float = REDIS_TIMEOUT) -> LeaseStore:
    return LeaseStore(connect(url, timeout=timeout), job)


async def start_node(
    nursery: trio.Nursery,
    recorder: Recorder,
    url: str,
    job: str,
    node: str,
    source: Source,
    *,
    timing: LeaseTiming = FAST_TIMING,
    start_cursor: str = "0",
    jitter: float = 0.01,
    state_dir: str | None = None,
    store: LeaseStore | None = None,
    handover_after: float | None = None,
) -> NodeHandle:
    spec = NodeSpec(
        node, job, int(timing.ttl * 1000), timing, jitter, start_cursor, state_dir, handover_after
    )
    log = structlog.get_logger().bind(node=node, job=job)
    from actors.observe import NodeObserver

    observer = NodeObserver(node, job)
    observer.listeners.append(recorder.listener(node))
    handle: NodeHandle = await nursery.start(
        run_node, store or store_for(url, job), source, spec, log, observer
    )
    return handle
