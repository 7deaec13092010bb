"""What ``redis.min_replicas_acked`` makes "committed" mean through a planned failover.

``SENTINEL FAILOVER`` promotes a replica while the old primary stays a writable primary for a
while, and its other replicas keep replicating from it. A commit the node sends there meanwhile is
discarded when the old primary is demoted and resynchronises from the new one. With N below the
number of replicas those other replicas can acknowledge it (``WAIT N`` succeeds) and the node
reports it committed; with N = every replica the promoted one, which no longer replicates from
the old primary, cannot acknowledge it, so each such commit comes back *unknown*, never committed.

Real Sentinel deployment (one primary, two replicas, three sentinels), two node processes under
load from the simulator. The old primary's stream is read throughout, so the entries it took that
the new primary never got are known exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import trio

from actors.lease_store import job_keys
from ingestion.testing.cluster import assert_verified
from ingestion.testing.redis_ha import promoted, sentinel_cluster, start_nodes

pytestmark = pytest.mark.slow


async def _watch_stream(client: Any, key: str, seen: dict[str, dict[str, str]], done: trio.Event) -> None:
    """Copy every entry of ``key`` on one server into ``seen`` until it is a replica (or gone)."""
    last = "0-0"
    while not done.is_set():
        try:
            for entry_id, fields in client.xrange(key, min=f"({last}"):
                seen[entry_id] = fields
                last = entry_id
            if client.info("replication").get("role") != "master":
                return
        except (redis.RedisError, OSError):
            return
        await trio.sleep(0.01)


async def test_with_every_replica_acking_a_demoted_primarys_commits_come_back_unknown(
    job: str,
) -> None:
    async with sentinel_cluster(job, min_replicas_acked=2) as (c, g):
        await start_nodes(c, "n1", "n2")
        await c.wait_for_events(200)
        old = g.primary()
        key = job_keys(job)["events"]
        on_old: dict[str, dict[str, str]] = {}
        done = trio.Event()
        watcher = g.client(old)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_stream, watcher, key, on_old, done)
            await trio.sleep(0.2)
            failover_at = trio.current_time()
            await trio.to_thread.run_sync(g.failover)
            port, _seen = await promoted(g, old.port, job)
            await trio.to_thread.run_sync(g.wait_is_replica, old)
            done.set()
        watcher.close()
        await c.wait_for_progress(200, within=30)
        new = g.client(g.server(port))
        try:
            kept = {(f["paging_token"], f["token"]) for _id, f in new.xrange(key)}
        finally:
            new.close()
        discarded = [f for f in on_old.values() if (f["paging_token"], f["token"]) not in kept]
        tokens = sorted({int(f["token"]) for f in discarded})
        print(f"\nplanned failover, acks = every replica: {len(discarded)} entries under tokens "
              f"{tokens} taken by the old primary and discarded")
        # Each term that wrote there had its commit reported unknown (which ends the term, so it
        # wrote nothing after): none of the discarded entries was ever reported committed.
        for token in tokens:
            await c.log.wait_for("commit-outcome-unknown", token=token, since=failover_at)
        await assert_verified(c, 400)
