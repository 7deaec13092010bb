"""Many jobs on few nodes, with real processes, on one redis-server and on a 3-master Redis
Cluster: three nodes host the same six jobs, and the balancer spreads their leadership: every job
led, nobody above its share, nothing moving while membership is stable; a killed node's jobs re-led
within TTL + 1 s; a restarted node gets its share back; a drained node hands every job over
gracefully. Every job's stream stays exactly-once.
"""

from __future__ import annotations

import math
import signal
from collections import Counter
from collections.abc import Iterator

import pytest
import trio

from actors.lease_store import read_states
from ingestion.testing.cluster import ALLOWANCE, Cluster, figure, open_cluster
from tests.support.many_jobs import NODES, RESOURCES, holders, job_flags, job_names, verify_all
from tests.support.redis_cluster import redis_cluster

pytestmark = pytest.mark.slow

TTL_MS = 1500
TTL = TTL_MS / 1000


@pytest.fixture(params=["redis", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None: the harness's own redis-server; else the URL of a real 3-master Redis Cluster."""
    if request.param == "redis":
        yield None
        return
    with redis_cluster(masters=3, replicas=0) as group:
        yield group.url


async def wait_balanced(c: Cluster, nodes: tuple[str, ...], within: float) -> dict[str, str | None]:
    share = math.ceil(len(RESOURCES) / len(nodes))
    with trio.fail_after(within):
        while True:
            now = holders(c)
            counts = Counter(now.values())
            if None not in counts and set(counts) <= set(nodes) and max(counts.values()) <= share:
                return now
            await trio.sleep(0.05)


async def start_all(c: Cluster) -> None:
    for name in NODES:
        await c.start_node(name, extra=job_flags(c.job))


async def test_six_jobs_spread_over_three_nodes_and_hold_still(job: str, redis_url: str | None) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS, redis_url=redis_url) as c:
        started = trio.current_time()
        await start_all(c)
        placed = await wait_balanced(c, NODES, within=15)
        figure("balance-cold-start", seconds=trio.current_time() - started, jobs=6, nodes=3)
        assert Counter(placed.values()) == Counter({n: 2 for n in NODES})
        # The balance is read from Redis; the log lines of the last takeovers may still be on their
        # way through the pipes: the quiet window starts once every holder's line has arrived.
        for state in read_states(c.client, job_names(c.job)):
            await c.log.wait_for("became-leader", state.leader, job=state.job, token=state.lease_token)
        quiet_from = trio.current_time()
        await trio.sleep(5)
        now = holders(c)
        moves = [e for e in c.log.lines if e.at >= quiet_from
                 and e.event in ("became-leader", "lost-leadership", "handing-back")]  # fmt: skip
        # A term that ends on its own (a starved node's lease expiring) is harmless, judged by the
        # stream check below, and the balancer may answer it with a hand-back; it must not move
        # anything by itself.
        step_downs = [e for e in moves if e.event == "lost-leadership"
                      and e.fields.get("reason") != "rebalanced"]  # fmt: skip
        hand_backs = [e for e in moves if e.event == "handing-back"]
        context = [(round(e.at - quiet_from, 3), e.node, e.event, e.fields.get("job"), e.fields.get("reason"),
                    e.fields.get("handed_job"), e.fields.get("live"), e.fields.get("share"))
                   for e in c.log.lines if e.at >= quiet_from - 3 and e.event in (
                       "became-leader", "lost-leadership", "handing-back", "balancer-view",
                       "campaign-held-off", "lease-released")]  # fmt: skip
        why = "\n".join(" ".join(str(x) for x in row).replace(c.job, "J") for row in context)
        # Why a node holds off a job is said once until it leads that job again: looking at the
        # lease again (every half TTL at its share) is not news (said again at debug level only).
        said: Counter[tuple[str, str, str]] = Counter()
        for e in c.log.lines:
            if e.event == "became-leader":
                for key in [k for k in said if k[:2] == (e.node, e.fields.get("job"))]:
                    del said[key]
            elif e.event == "campaign-held-off":
                said[(e.node, str(e.fields.get("job")), str(e.fields.get("reason")))] += 1
        assert max(said.values(), default=0) <= 1, said
        print(f"\nquiet 5 s: {len(step_downs)} step-downs, {len(hand_backs)} hand-backs")
        assert len(hand_backs) <= 2 * len(step_downs), why
        if not step_downs:
            assert not moves and now == placed, why
        await verify_all(c)


async def test_a_killed_nodes_jobs_are_re_led_within_ttl_plus_1s_and_come_back_on_restart(
    job: str, redis_url: str | None
) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS, redis_url=redis_url) as c:
        await start_all(c)
        placed = await wait_balanced(c, NODES, within=15)
        victim = "n2"
        orphaned = {name for name, holder in placed.items() if holder == victim}
        killed_at = await c.kill(victim)
        survivors = ("n1", "n3")
        with trio.fail_after(TTL + 5):
            while True:
                now = holders(c)
                if all(now[name] in survivors for name in orphaned):
                    break
                await trio.sleep(0.02)
        relead = trio.current_time() - killed_at
        figure("balance-sigkill-relead", relead_ms=relead * 1000, lease_ttl_ms=TTL_MS, jobs=len(orphaned))
        # The crash window, ttl + jitter + a round trip, within test_failover's allowance for a
        # loaded machine (1 s): a re-lead that waited out one more lease still fails.
        assert relead <= TTL + ALLOWANCE, f"re-led after {relead:.2f}s"
        await wait_balanced(c, survivors, within=10)

        restarted_at = trio.current_time()
        await c.start_node(victim, extra=job_flags(c.job))
        restored = await wait_balanced(c, NODES, within=10)
        figure("balance-rejoin", seconds=trio.current_time() - restarted_at)
        assert Counter(restored.values()) == Counter({n: 2 for n in NODES})
        await c.wait_for_progress(50)
        await verify_all(c)


async def test_a_drained_node_hands_every_job_over_gracefully(job: str, redis_url: str | None) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS, redis_url=redis_url) as c:
        await start_all(c)
        placed = await wait_balanced(c, NODES, within=15)
        leaving = "n3"
        its_jobs = {name for name, holder in placed.items() if holder == leaving}
        asked = c.signal(leaving, signal.SIGTERM)
        assert await c.exited(leaving) == 0
        taken = {}
        with trio.fail_after(5):
            while len(taken) < len(its_jobs):
                for e in c.log.lines:
                    if e.at >= asked and e.event == "became-leader" and e.fields["job"] in its_jobs:
                        taken.setdefault(e.fields["job"], e.at - asked)
                await c.log.changed()
        released = [e for e in c.log.of("lost-leadership", leaving, since=asked)]
        assert {e.fields["job"] for e in released} == its_jobs
        assert all(e.fields["reason"] == "shutdown" for e in released)
        notices = [e for e in c.log.of("lease-released", leaving, since=asked)]
        assert len(notices) == len(its_jobs)  # one release (and notice) each
        figure("balance-drain", handoff_ms=max(taken.values()) * 1000, jobs=len(its_jobs))
        assert max(taken.values()) < ALLOWANCE, taken  # tens of ms by design; not a lease waited out
        await wait_balanced(c, ("n1", "n2"), within=5)
        await c.wait_for_progress(50)
        await verify_all(c)
