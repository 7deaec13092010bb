"""The balancer counts on a live node only for the jobs that node hosts.

Nodes that host different jobs (one node 6 jobs, another 2 others) are both live in the registry;
the share over every live node (ceil(6 / 2) = 3) would have the first hand back leases that no
other node can take (issue 46's many-endpoints run: 120 ``rebalanced`` hand-backs, each job then
led again by the same node a TTL later). With the hosted jobs written beside the registry, the
first node's share of its own jobs is all of them, and a job that the other node hosts too is
still handed over to it. In-process, with a real redis-server.
"""

from __future__ import annotations

import redis
import structlog

from actors.balance import OVER_TICKS, Balancer
from actors.lease_store import NodeRegistry


def _balancer(redis_client: redis.Redis, key: str, node: str, jobs: list[str], handed: list[str]) -> Balancer:
    async def hand_back(job: str) -> None:
        handed.append(job)

    return Balancer(
        NodeRegistry(redis_client, key=key), node, jobs, leading=lambda j: node == "a", hand_back=hand_back,
        wake=lambda j: None, log=structlog.get_logger(), interval=10.0, live_window_ms=10_000, ttl=1.0,
    )  # fmt: skip


async def test_no_lease_is_handed_back_for_balance_when_no_other_live_node_hosts_its_job(
    redis_client: redis.Redis, job: str
) -> None:
    key = f"{job}:nodes"
    mine = [f"{job}-a{i}" for i in range(6)]
    handed_a: list[str] = []
    a = _balancer(redis_client, key, "a", mine, handed_a)
    b = _balancer(redis_client, key, "b", [f"{job}-b0", f"{job}-b1"], [])
    await b.tick()
    for _ in range(OVER_TICKS + 2):
        await a.tick()
    assert a.live == ("a", "b")
    assert handed_a == []
    assert a.picture().share == 6
    # b also hosts two of a's jobs: a, over ceil(6 / 2) = 3 then, hands those (only) over to b
    b.jobs = [*b.jobs, *mine[:2]]
    await b.tick()
    for _ in range(OVER_TICKS + 2):
        await a.tick()
    assert handed_a and set(handed_a) <= set(mine[:2])
    # b leaves: its hosted jobs go with it
    await b.leave()
    assert "b" not in redis_client.hgetall(f"{key}:jobs")
