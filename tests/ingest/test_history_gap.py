"""History retention (#11.2) with real Redis: a job whose committed cursor fell out of Horizon's
retained history stops with ``history-gap`` and writes nothing, or (``on_history_gap = "skip"``)
records the gap in the audit stream and resumes from the oldest retained ledger."""

from __future__ import annotations

import sys

import pytest
import redis
import trio

from actors.lease_store import job_keys
from ingestion.horizon.source import HorizonSource
from ingestion.node.build import audit_writer
from ingestion.simulator import Simulator, SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import json_lines, wait_until
from tests.support.nodes import OpenStore, Recorder, start_node

CONFIG = SimulatorConfig(ledger_interval=None, history_ledgers=10, ops_per_ledger=4, retention_ledgers=20)


async def ingest_everything_then_stop(sim: Simulator, url: str, job: str, client: redis.Redis) -> str:
    """Run a node until it has ingested the whole collection, stop it; return the cursor."""
    source = HorizonSource(sim.url, "/operations", retry_base=0.05, retry_cap=0.2)
    total = len(sim.records("/operations"))
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, Recorder(), url, job, "first", source)
        events = job_keys(job)["events"]
        await wait_until(lambda: client.xlen(events) >= total, 10, what=f"all {total} records in the stream")
        await node.shutdown()
    cursor = client.hget(job_keys(job)["cursor"], "cursor")
    assert cursor == sim.records("/operations")[-1]["paging_token"]
    return str(cursor)


@pytest.mark.slow
async def test_a_stopped_job_restarted_after_its_cursor_fell_out_of_retention_exits_1_writing_nothing(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    async with open_simulator(CONFIG) as sim:
        cursor = await ingest_everything_then_stop(sim, redis_server.url, job, redis_client)
        for _ in range(40):  # the job is stopped while history moves on past its cursor
            sim.close_ledger()
        keys = job_keys(job)
        events_before = redis_client.xlen(keys["events"])
        args = [
            sys.executable, "-m", "ingestion", "--node-id", "again", "--job", job,
            "--redis", redis_server.url, "--horizon", sim.url, "--resource", "/operations",
            "--start-cursor", "0", "--log-format", "json",
        ]  # fmt: skip
        with trio.fail_after(30):
            done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
        elder = sim.chain.first
    lines = json_lines(done.stdout)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    gap = next(e for e in lines if e["event"] == "history-gap")
    assert gap["level"] == "error"
    assert (gap["cursor"], gap["cursor_ledger"], gap["elder_ledger"], gap["horizon"]) == (
        cursor, int(cursor) >> 32, elder, sim.url
    )
    assert lines[-1]["event"] == "node-stopped" and lines[-1]["reason"] == "ingestion-fatal"
    assert redis_client.xlen(keys["events"]) == events_before
    assert redis_client.hget(keys["cursor"], "cursor") == cursor
    assert "Traceback" not in done.stderr.decode()


async def test_on_history_gap_skip_writes_a_fenced_audit_entry_and_resumes_from_the_elder_ledger(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    async with open_simulator(CONFIG) as sim:
        cursor = await ingest_everything_then_stop(sim, redis_server.url, job, redis_client)
        events_before = redis_client.xlen(job_keys(job)["events"])
        for _ in range(40):
            sim.close_ledger()
        retained = [r["paging_token"] for r in sim.records("/operations")]
        store = open_store(redis_server.url, job)
        source = HorizonSource(
            sim.url, "/operations", retry_base=0.05, retry_cap=0.2,
            on_history_gap="skip", audit=audit_writer(store),
        )  # fmt: skip
        rec = Recorder()
        async with trio.open_nursery() as nursery:
            node = await start_node(nursery, rec, redis_server.url, job, "skipper", source, store=store)
            led = await rec.wait_for("became-leader", "skipper")
            wanted = events_before + len(retained)
            await wait_until(
                lambda: redis_client.xlen(job_keys(job)["events"]) >= wanted, 10,
                what=f"the {len(retained)} retained records in the stream after the gap",
            )  # fmt: skip
            await node.shutdown()
        elder = sim.chain.first
    keys = job_keys(job)
    got = [f["paging_token"] for _id, f in redis_client.xrange(keys["events"])][events_before:]
    assert got == retained and int(got[0]) >> 32 == elder
    gaps = [f for _id, f in redis_client.xrange(keys["audit"]) if f["event"] == "history-gap"]
    assert gaps == [
        {
            "event": "history-gap",
            "node": "skipper",
            "token": str(led.fields["token"]),
            "cursor": cursor,
            "cursor_ledger": str(int(cursor) >> 32),
            "elder_ledger": str(elder),
            "horizon": sim.url,
        }
    ]
