"""End to end in one process: the simulator's long history, caught up through the election core
(two nodes, a graceful handoff in the middle of the catch-up) into the Redis events stream, then
live ledgers; checked record by record against the simulator."""

from __future__ import annotations

import pytest
import redis
import trio

from actors.lease import LeaseTiming
from actors.lease_store import job_keys
from ingestion.horizon.pages import compact_json
from ingestion.horizon.source import HorizonSource
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from ingestion.verify import SourceRecord, check_stream, read_entries, read_grants
from tests.support.nodes import Recorder, start_node

pytestmark = pytest.mark.slow  # 50,000 records: about 20 s on a loaded 2-core machine

TIMING = LeaseTiming(ttl=5.0, renew_interval=1.0, margin=1.0)


async def wait_for_events(client: redis.Redis, key: str, count: int, within: float) -> None:
    await wait_until(lambda: client.xlen(key) >= count, within, what=f"{count} events in {key}", every=0.05)


async def test_50k_history_then_live_ledgers_through_a_handoff_exactly_once(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=250, ops_per_ledger=200)
    events = job_keys(job)["events"]
    async with open_simulator(config) as sim:
        history = sim.records("/operations")
        assert len(history) == 50_000
        source = HorizonSource(sim.url, "/operations", retry_base=0.05, retry_cap=0.5)
        rec = Recorder()
        async with trio.open_nursery() as nursery:
            a = await start_node(nursery, rec, redis_server.url, job, "a", source, timing=TIMING)
            await rec.wait_for("became-leader", "a")
            b = await start_node(nursery, rec, redis_server.url, job, "b", source, timing=TIMING)
            await rec.wait_for("standby", "b")
            await wait_for_events(redis_client, events, 20_000, within=120)
            await a.shutdown()  # mid catch-up: b resumes from the committed cursor
            taken = await rec.wait_for("became-leader", "b")
            assert taken.fields["previous_node"] == "a"
            await wait_for_events(redis_client, events, len(history), within=120)
            live = [sim.close_ledger() for _ in range(3)]
            new = [r for seq in live for r in sim.records(f"/ledgers/{seq}/operations")]
            await wait_for_events(redis_client, events, len(history) + len(new), within=60)
            await b.shutdown()
    entries = redis_client.xrange(events)
    expected = history + new
    assert len(entries) == len(expected)
    for (_id, fields), want in zip(entries, expected, strict=True):
        assert fields["paging_token"] == want["paging_token"]
        assert fields["record"] == compact_json(want)  # byte for byte what Horizon streams
    writers = [f["node"] for _id, f in entries]
    assert writers[0] == "a" and "b" in writers
    # No interleaving, no overlap, judged on Redis's clock: each token's entries written by its
    # holder between its grant and the next (a step-down on a loaded machine may add terms).
    source = [SourceRecord(r["paging_token"], r) for r in expected]
    result = check_stream(read_entries(redis_client, job), source, read_grants(redis_client, job))
    assert result.ok, result.summary()
