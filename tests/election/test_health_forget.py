"""The job's health hash forgets nodes as the node registry does (NODE_FORGET_MS): a node silent
that long loses its last-success field *and* its failing marker; and a node id cannot be read as
a failing marker (real Redis, the report_health script)."""

from __future__ import annotations

import pytest
import redis

from actors.lease_store import NODE_FORGET_MS
from ingestion.config import ConfigError, Settings
from ingestion.testing.local_redis import LocalRedis
from tests.support.nodes import OpenStore


async def test_a_node_dead_for_the_forget_window_loses_its_failing_marker_too(
    redis_server: LocalRedis, redis_client: redis.Redis, open_store: OpenStore, job: str
) -> None:
    store = open_store(redis_server.url, job)
    # "dead" answered once, long ago, then failed, and then stopped reporting for good.
    assert await store.report_health("dead", NODE_FORGET_MS + 5_000, 10_000, NODE_FORGET_MS + 1_000) == []
    # "never" failed from the start and is as long gone.
    await store.report_health("never", None, 10_000, NODE_FORGET_MS + 1_000)
    assert await store.report_health("live", 0, 10_000) == ["live"]
    assert set(redis_client.hkeys(store.keys["health"])) == {"live"}


def test_a_node_id_that_reads_as_a_failing_marker_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"node\.id: must not start with 'failing:'"):
        Settings.from_mapping({"node": {"id": "failing:n1"}})
