"""The Sentinel harness itself, with redis-py's Sentinel client: the tests below rely on it."""

from __future__ import annotations

import time

import pytest
import redis
from redis.sentinel import Sentinel

from tests.redis_ha import SERVICE, SentinelGroup

pytestmark = pytest.mark.slow


def test_planned_failover_and_kill_move_the_primary_and_master_for_follows(
    sentinel_group: SentinelGroup,
) -> None:
    g = sentinel_group
    sentinel = Sentinel([("127.0.0.1", s.port) for s in g.sentinels], socket_timeout=1.0)
    client = sentinel.master_for(SERVICE, socket_timeout=1.0, decode_responses=True)
    client.set("k", "1")
    first = g.primary()
    g.failover()
    second = g.wait_for_new_primary(first.port)
    g.wait_is_replica(first)
    for _ in range(50):  # the first call after a switch may meet the demoted primary once
        try:
            client.set("k", "2")
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    assert g.client(second).get("k") == "2"
    killed_at = time.monotonic()
    g.kill(second)
    third = g.wait_for_new_primary(second.port)
    print(f"\nSIGKILL to a promoted replica: {time.monotonic() - killed_at:.2f} s")
    assert third.port not in (second.port,)
    g.restart(second)
    g.wait_is_replica(second)
    client.close()
