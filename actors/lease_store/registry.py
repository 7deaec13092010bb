"""The node registry: which nodes are live, by Redis's clock; used for balancing, never for safety."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from actors.lease_store import scripts
from actors.lease_store.keys import NODE_FORGET_MS, NODE_HOSTS_KEY, NODE_REGISTRY_KEY
from actors.lease_store.store import LeaseStore


class NodeRegistry:
    """The live nodes of the cluster: each heartbeats into one sorted set, scored with Redis's
    clock (so the nodes' clocks do not matter). Used only for balancing, never for safety.

    Beside it, each node that heartbeats with the jobs it hosts writes them into a hash (node ->
    the job names, one a line): :attr:`hosts` is what the last heartbeat read of it, so that a
    node never counts on a live node to lead a job that node does not host. A node absent from
    the hash (one of a version before it) is taken to host every job."""

    def __init__(self, client: redis.Redis, call_timeout: float | None = None, key: str = NODE_REGISTRY_KEY):
        self.key = key
        self.hosts_key = NODE_HOSTS_KEY if key == NODE_REGISTRY_KEY else f"{key}:jobs"
        self._store = LeaseStore(client, "-", call_timeout)  # for its bounded calls
        self._heartbeat = client.register_script(scripts.NODE_HEARTBEAT)
        self.hosts: dict[str, frozenset[str]] = {}  # node -> the jobs it hosts (as last read)

    async def heartbeat(self, node: str, live_ms: int, *, hosting: Iterable[str] | None = None) -> list[str]:
        """Record ``node`` as live now; the nodes that heartbeat within ``live_ms``. With
        ``hosting`` (the jobs ``node`` hosts): write them, and read every node's into
        :attr:`hosts` (in the same worker thread, a second round trip: the hash is a key of its
        own, in a slot of its own on a cluster).

        Raises:
            RedisUnavailable: failed or timed out.
        """
        client = self._store.client
        mine = None if hosting is None else "\n".join(sorted(set(hosting)))

        def call() -> tuple[list[str], dict[Any, Any] | None]:
            live = self._heartbeat(keys=[self.key], args=[node, live_ms, NODE_FORGET_MS])
            if mine is None:
                return live, None
            pipe = client.pipeline(transaction=False)
            pipe.hset(self.hosts_key, node, mine)  # (every time: a Redis that lost it has it again)
            pipe.hgetall(self.hosts_key)
            return live, pipe.execute()[-1]

        live, hosts = await self._store.run(call)
        if hosts is not None:
            self.hosts = {_text(n): frozenset(_text(v).split("\n")) for n, v in hosts.items()}
        return [_text(n) for n in live]

    async def leave(self, node: str) -> None:
        """Remove ``node`` (a node shutting down): the others count it out at once."""
        client = self._store.client

        def call() -> None:
            pipe = client.pipeline(transaction=False)
            pipe.zrem(self.key, node)
            pipe.hdel(self.hosts_key, node)
            pipe.execute()

        await self._store.run(call)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
