"""A process crash in a balanced cluster, with real processes: six jobs on three nodes, every node
leading its share (two). A node's worker is SIGKILLed; its parent says the node is going away
(it leaves the node registry, then releases the worker's leases with the reason
``node-exiting``), so the standbys, held off at their share until then, take both jobs over in
milliseconds, not after the dead node ages out of the registry (about a lease TTL). The node,
restarted, gets its share back; every stream stays exactly-once.

The 20-kill measurement is ``python -m benchmarks --only process_crash`` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import math
import signal
from collections import Counter

import pytest
import trio

from actors.lease_store import job_keys, read_states
from ingestion.testing.cluster import Cluster, figure, open_cluster
from tests.support.many_jobs import NODES, RESOURCES, holders, job_flags, job_names, verify_all

pytestmark = pytest.mark.slow

# Long enough that a takeover which waited for the dead node to leave the registry (its liveness
# window is one TTL) or for the lease to count as free for adoption (one TTL) takes seconds.
TTL_MS = 3000
# A loaded 2-core machine: scheduling and the log pipe to the harness. The release and the
# takeover take milliseconds; the old path took at least a TTL (3 s), so this bound fails it.
ALLOWANCE = 0.6
KILLS = 2


async def wait_balanced(c: Cluster, nodes: tuple[str, ...], within: float) -> dict[str, str | None]:
    share = math.ceil(len(RESOURCES) / len(nodes))
    with trio.fail_after(within):
        while True:
            now = holders(c)
            counts = Counter(now.values())
            if None not in counts and set(counts) <= set(nodes) and max(counts.values()) <= share:
                return now
            await trio.sleep(0.05)


async def settled(c: Cluster) -> dict[str, str | None]:
    """Every node at its share, and every holder's ``became-leader`` line arrived."""
    await wait_balanced(c, NODES, within=30)
    for state in read_states(c.client, job_names(c.job)):
        await c.log.wait_for("became-leader", state.leader, job=state.job, token=state.lease_token)
    await trio.sleep(c.ttl_ms / 1000)  # the balancer's ticks see the same picture everywhere
    now = holders(c)
    assert Counter(now.values()) == Counter({n: 2 for n in NODES}), now
    return now


async def test_a_killed_worker_s_jobs_are_taken_at_once_by_standbys_at_their_share(job: str) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS) as c:
        for name in NODES:
            await c.start_node(name, extra=job_flags(c.job))
        worst: list[float] = []
        for kill in range(KILLS):
            placed = await settled(c)
            victim = NODES[kill % len(NODES)]
            orphaned = {state.job: state.lease_token for state in read_states(
                c.client, [name for name, holder in placed.items() if holder == victim])}  # fmt: skip
            assert len(orphaned) == 2
            killed_at = c.kill_worker(victim)
            died = await c.log.wait_for("worker-died", victim, since=killed_at, within=5)
            assert sorted(died.fields["leases_released"]) == sorted(f"{n}:{t}" for n, t in orphaned.items())
            within = TTL_MS / 1000 + 3
            taken = {name: await c.log.wait_for("became-leader", job=name, since=killed_at, within=within)
                     for name in orphaned}  # fmt: skip
            relead = max(line.at for line in taken.values()) - killed_at
            worst.append(relead)
            figure("balanced-worker-killed", kill=kill, relead_ms=relead * 1000,
                   release_ms=died.fields["release_ms"], lease_ttl_ms=TTL_MS)  # fmt: skip
            assert relead <= ALLOWANCE, f"re-led after {relead:.3f}s"
            for name, line in taken.items():
                assert line.node != victim and line.fields["previous_token"] == orphaned[name]
            # the audit says why the lease was released
            released = [f for _id, f in c.client.xrange(job_keys(next(iter(orphaned)))["audit"])
                        if f["event"] == "released"]  # fmt: skip
            assert released[-1]["reason"] == "node-exiting", released[-1]
            assert await c.exited(victim) == 128 + signal.SIGKILL
            await c.start_node(victim, extra=job_flags(c.job))
        print(f"\nre-lead after a worker SIGKILL, 2 jobs each, worst of {KILLS}: {max(worst) * 1000:.0f} ms")
        await settled(c)
        await c.wait_for_progress(50)
        await verify_all(c)
