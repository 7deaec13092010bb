"""Waiting for new stream entries: one blocking ``XREAD`` for all the waiters of a node.

A webhook job that has delivered everything waits for its source job's next record. A blocking
``XREAD`` per waiter holds a worker thread and a pooled connection for the whole wait: 150 idle
webhook jobs on a node took every thread of trio's default limiter (40) and every connection of
redis-py's pool (100) that the node's renewals and commits need, which then timed out.

Here the waiters of a node (of one Redis client) take turns: whoever finds no read under way
issues one ``XREAD BLOCK`` naming every stream waited on (each from the lowest position waited
after), and wakes every waiter whose stream then holds an entry after its position. The read runs
on threads and connections of its own (a small limiter and pool), never the ones calls use; it
blocks at most ``BLOCK`` seconds, so a waiter that comes along during a read that does not name
its stream is served by the next one (entries are read from positions, so none is missed).

On a Redis Cluster one ``XREAD`` can only name the streams of one hash slot: the waiters take
turns per slot, each slot's read on the limiter's threads (``CLUSTER_THREADS`` at a time) and the
cluster client's connections.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Hashable
from typing import Any

import attrs
import redis
import trio
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from actors.lease_store.pipelined import one_per_run

BLOCK = 0.25  # seconds: the longest read, so the longest a newly waiting stream waits to be named
THREADS = 4  # the reads' own threads: one reading, and room for reads abandoned by a cancel
CLUSTER_THREADS = 32  # on a cluster: slots read at once


def entry_id(position: str) -> tuple[int, int]:
    """A stream entry id (``ms-seq``; ``0`` and ``0-0``: before the first) as a comparable pair."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)


@attrs.define(eq=False)
class _Waiter:
    key: str
    after: tuple[int, int]
    woken: trio.Event = attrs.Factory(trio.Event)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reader_client(client: Any, block: float) -> Any:
    """A client with a pool of its own, like ``client``'s, whose reads may last ``block`` seconds
    longer (the socket timeout bounds each read); a cluster's own client (see the module doc)."""
    if isinstance(client, RedisCluster):
        return client
    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs["socket_timeout"] = (kwargs.get("socket_timeout") or 1.0) + block
    if isinstance(pool, SentinelConnectionPool):
        own: Any = SentinelConnectionPool(
            pool.service_name, pool.sentinel_manager, max_connections=2 * THREADS, **kwargs
        )
    else:
        own = type(pool)(connection_class=pool.connection_class, max_connections=2 * THREADS, **kwargs)
    reader = redis.Redis(connection_pool=own)
    weakref.finalize(client, own.disconnect)  # (the reads' connections go with the node's client)
    return reader


class StreamWaits:
    """The waits of one node (one Redis client) for entries after a position in streams."""

    def __init__(self, client: Any, call_timeout: float, block: float = BLOCK) -> None:
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        # A cluster's connections time out after the call bound: its reads block within half of it.
        self._block = min(block, call_timeout / 2) if self._cluster else block
        self._call_timeout = call_timeout
        self._reader: Any = None
        self._waiters: dict[Hashable, set[_Waiter]] = {}
        self._reading: dict[Hashable, trio.Event] = {}  # set when that group's read has ended
        self._limiter = trio.CapacityLimiter(CLUSTER_THREADS if self._cluster else THREADS)

    def _group(self, key: str) -> Hashable:
        return self._client.keyslot(key) if self._cluster else None

    async def wait(self, key: str, after: str, seconds: float) -> bool:
        """Return once stream ``key`` holds an entry after ``after`` (True), or after ``seconds``
        (False). Never raises for Redis: a failed read is waited out (the caller's next read
        reports it)."""
        deadline = trio.current_time() + seconds
        me = _Waiter(key, entry_id(after))
        group = self._group(key)
        self._waiters.setdefault(group, set()).add(me)
        try:
            while not me.woken.is_set() and trio.current_time() < deadline:
                under_way = self._reading.get(group)
                if under_way is None:
                    await self._read(group, deadline)
                else:
                    with trio.move_on_at(deadline):
                        await under_way.wait()
            return me.woken.is_set()
        finally:
            waiters = self._waiters[group]
            waiters.discard(me)
            if not waiters:
                del self._waiters[group]

    async def _read(self, group: Hashable, deadline: float) -> None:
        """One ``XREAD BLOCK`` for every stream of ``group`` waited on; wakes those it serves."""
        ended = self._reading[group] = trio.Event()
        try:
            after: dict[str, tuple[int, int]] = {}
            for w in self._waiters.get(group, ()):
                if not w.woken.is_set():  # (one woken but not yet gone would be served again)
                    after[w.key] = min(after.get(w.key, w.after), w.after)
            block = max(0.001, min(self._block, deadline - trio.current_time()))
            ids = {key: f"{ms}-{seq}" for key, (ms, seq) in after.items()}
            found: dict[str, tuple[int, int]] | None = None
            with trio.move_on_after(block + self._call_timeout):
                try:
                    found = await trio.to_thread.run_sync(
                        self._xread, ids, math.ceil(block * 1000), abandon_on_cancel=True,
                        limiter=self._limiter,
                    )  # fmt: skip
                except (redis.RedisError, OSError):
                    pass
            if found is None:  # failed or timed out: wait out the block rather than spin
                await trio.sleep_until(min(deadline, trio.current_time() + block))
                return
            for w in self._waiters.get(group, ()):
                if w.key in found and found[w.key] > w.after:
                    w.woken.set()
        finally:
            del self._reading[group]
            ended.set()

    def _xread(self, ids: dict[str, str], block_ms: int) -> dict[str, tuple[int, int]]:
        """In a worker thread: {stream: its first entry after the id asked} for streams that have one."""
        if self._reader is None:
            self._reader = _reader_client(self._client, self._block)
        answer: Any = self._reader.xread(ids, count=1, block=block_ms)  # type: ignore[arg-type]
        rows = answer.items() if isinstance(answer, dict) else (answer or [])
        found = {}
        for key, entries in rows:
            if entries:
                found[_text(key)] = entry_id(_text(entries[0][0]))
        return found


_shared: weakref.WeakKeyDictionary[Any, dict[Any, StreamWaits]] = weakref.WeakKeyDictionary()


def stream_waits(client: Any, call_timeout: float) -> StreamWaits:
    """The waits shared by every caller on ``client`` in this trio run (one per node)."""
    return one_per_run(_shared, client, lambda: StreamWaits(client, call_timeout))
