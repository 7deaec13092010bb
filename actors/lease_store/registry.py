"""The node registry: which nodes are live, by Redis's clock; used for balancing, never for safety."""

from __future__ import annotations

import functools

import redis

from actors.lease_store import scripts
from actors.lease_store.keys import NODE_FORGET_MS, NODE_REGISTRY_KEY
from actors.lease_store.store import LeaseStore


class NodeRegistry:
    """The live nodes of the cluster: each heartbeats into one sorted set, scored with Redis's
    clock (so the nodes' clocks do not matter). Used only for balancing, never for safety."""

    def __init__(self, client: redis.Redis, call_timeout: float | None = None, key: str = NODE_REGISTRY_KEY):
        self.key = key
        self._store = LeaseStore(client, "-", call_timeout)  # for its bounded calls
        self._heartbeat = client.register_script(scripts.NODE_HEARTBEAT)

    async def heartbeat(self, node: str, live_ms: int) -> list[str]:
        """Record ``node`` as live now; the nodes that heartbeat within ``live_ms``.

        Raises:
            RedisUnavailable: failed or timed out.
        """
        live: list[str] = await self._store.run(
            functools.partial(self._heartbeat, keys=[self.key], args=[node, live_ms, NODE_FORGET_MS])
        )
        return live

    async def leave(self, node: str) -> None:
        """Remove ``node`` (a node shutting down): the others count it out at once."""
        await self._store.run(self._store.client.zrem, self.key, node)
