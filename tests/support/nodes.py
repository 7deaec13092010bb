"""Helpers to run in-process nodes against a real Redis and watch what they log."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import redis
import structlog
import trio

from actors.lease import LeaseTiming
from actors.lease_store import LeaseStore, connect, job_keys
from actors.observe import NodeObserver
from actors.source import Source, SyntheticSource
from actors.supervisor import NodeHandle, NodeSpec, run_node

FAST_TIMING = LeaseTiming(ttl=1.5, renew_interval=0.3, margin=0.4, drift=0.01)
REDIS_TIMEOUT = 0.15

OpenStore = Callable[..., LeaseStore]  # the ``open_store`` fixture: ``(url, job, *, timeout=..., **options)``


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


@contextmanager
def lease_store(
    url: str,
    job: str,
    *,
    timeout: float = REDIS_TIMEOUT,
    store_class: type[LeaseStore] = LeaseStore,
    **options: Any,
) -> Iterator[LeaseStore]:
    """A lease store for ``job`` on a Redis client of its own, closed on the way out.

    ``timeout`` bounds each call (the nodes' own, by default); ``options`` go to ``store_class``.
    The ``open_store`` fixture opens these for the length of a test.
    """
    client = connect(url, timeout=timeout)
    try:
        yield store_class(client, job, **options)
    finally:
        client.close()


async def _run_node_on_own_store(
    url: str,
    job: str,
    source: Source,
    spec: NodeSpec,
    log: Any,
    observer: NodeObserver,
    *,
    task_status: trio.TaskStatus[NodeHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    with lease_store(url, job) as store:
        await run_node(store, source, spec, log, observer, task_status=task_status)


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
    observer = NodeObserver(node, job)
    observer.listeners.append(recorder.listener(node))
    handle: NodeHandle
    if store is None:  # the node's own store, closed when the node ends
        handle = await nursery.start(_run_node_on_own_store, url, job, source, spec, log, observer)
    else:
        handle = await nursery.start(run_node, store, source, spec, log, observer)
    return handle


def events_in_stream(client: redis.Redis, job: str) -> list[tuple[int, str, str]]:
    """(record index, token, node) for every entry of the job's events stream, in order: the
    records of a :class:`SyntheticSource`."""
    entries = client.xrange(job_keys(job)["events"])
    return [
        (SyntheticSource.index_of(f["paging_token"]), f["token"], f["node"]) for _id, f in entries
    ]


def assert_exactly_once_in_order(client: redis.Redis, job: str) -> int:
    """The job's events stream holds synthetic records 1..n, each once, in order; returns n."""
    indexes = [i for i, _t, _n in events_in_stream(client, job)]
    assert indexes == list(range(1, len(indexes) + 1)), "gap, duplicate or reordering"
    return len(indexes)
