"""A job told to start at "now" starts at one moment: the first leader pins that moment in Redis
before its first record, so a failover before any record arrived skips nothing."""

from __future__ import annotations

import redis
import trio

from actors.lease_store import job_keys
from ingestion.horizon.source import HorizonSource
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from tests.support.nodes import Recorder, start_node


async def test_now_is_pinned_once_and_a_successor_ingests_what_arrived_while_leaderless(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=3, ops_per_ledger=4)
    async with open_simulator(config) as sim:
        source = HorizonSource(sim.url, "/operations", retry_base=0.05, retry_cap=0.2)
        newest_at_start = sim.records("/operations")[-1]["paging_token"]
        rec = Recorder()
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, rec, redis_server.url, job, "a", source, start_cursor="now")
            await rec.wait_for("became-leader", "a")
            keys = job_keys(job)
            await wait_until(
                lambda: redis_client.hget(keys["cursor"], "cursor") is not None, 5,
                what="a committed cursor", every=0.01,
            )  # fmt: skip
            assert redis_client.hget(keys["cursor"], "cursor") == newest_at_start
            await a.shutdown()
            # Leaderless: two ledgers close. A fresh "now" would skip them; the pinned cursor not.
            sim.close_ledger()
            sim.close_ledger()
            b = await start_node(nursery, rec, redis_server.url, job, "b", source, start_cursor="now")
            taken = await rec.wait_for("became-leader", "b")
            assert taken.fields["cursor"] == newest_at_start
            expected = [r["paging_token"] for r in sim.records("/operations")]
            expected = expected[expected.index(newest_at_start) + 1 :]
            assert len(expected) == 8
            await wait_until(
                lambda: redis_client.xlen(keys["events"]) >= len(expected), 10,
                what=f"the {len(expected)} records after the start",
            )  # fmt: skip
            await b.shutdown()
    got = [f["paging_token"] for _id, f in redis_client.xrange(keys["events"])]
    assert got == expected
