"""The completeness watermark of an RPC job (issue 49), in a real node (in process) against the
simulator's Stellar RPC and a real Redis: a watch list that matches nothing still moves it with
the RPC's closed ledgers, and a skipped history gap holds it at the ledger before the gap."""

from __future__ import annotations

import redis
import structlog

from actors.lease_store import job_keys
from ingestion.decode.stage import rule_for, stage_for
from ingestion.rpc.protocol import Cursor
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from ingestion.watchlist.lists import InlineWatch
from tests.support.rpc_nodes import at_tip, cursor, node, source, until_at_tip

NOBODY = "GAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAWHF"  # a valid account no event names
# Ledgers followed one by one with the watch list matching nothing: at least 60 s of pubnet
# (one ledger every 5 to 6 s), each followed before the next closes.
QUIET_LEDGERS = 12


def watermark(client: redis.Redis, job: str) -> int | None:
    value = client.hget(job_keys(job)["cursor"], "complete_through")
    return None if value is None else int(value)


def watched_source(url: str, **kw: object) -> object:
    rule, decode = rule_for("rpc")
    return stage_for(source(url, **kw), rule, decode, InlineWatch([NOBODY]))  # type: ignore[arg-type]


async def test_a_watch_list_that_matches_nothing_still_moves_the_watermark_with_every_closed_ledger(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=30, ops_per_ledger=20, rpc_port=0)
    async with open_simulator(config) as sim:
        async with node(redis_server.url, job, watched_source(sim.rpc_url)):  # type: ignore[arg-type]
            await until_at_tip(redis_client, job, sim)
            assert watermark(redis_client, job) == sim.chain.latest
            for _ in range(QUIET_LEDGERS):
                closed = sim.close_ledger()
                await wait_until(
                    lambda closed=closed: watermark(redis_client, job) == closed,  # type: ignore[misc]
                    5,
                    what=f"the watermark at ledger {closed}",
                )
    assert redis_client.xlen(job_keys(job)["events"]) == 0  # the list matched nothing
    assert redis_client.hget(job_keys(job)["cursor"], "complete_held") is None


async def test_a_skipped_history_gap_holds_the_watermark_at_the_ledger_before_it_and_says_so(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    config = SimulatorConfig(
        ledger_interval=None, history_ledgers=40, ops_per_ledger=20, rpc_port=0, retention_ledgers=60
    )
    async with open_simulator(config) as sim:
        async with node(redis_server.url, job, watched_source(sim.rpc_url, on_history_gap="skip")):  # type: ignore[arg-type]
            await until_at_tip(redis_client, job, sim)
        before_gap = sim.chain.latest
        assert watermark(redis_client, job) == before_gap
        for _ in range(100):  # the job is stopped while retention moves on past its cursor
            sim.close_ledger()
        assert sim.chain.first > before_gap + 1  # ledgers the job never read are gone
        with structlog.testing.capture_logs() as logs:
            async with node(redis_server.url, job, watched_source(sim.rpc_url, on_history_gap="skip")):  # type: ignore[arg-type]
                await until_at_tip(redis_client, job, sim)
                for _ in range(3):
                    sim.close_ledger()
                await until_at_tip(redis_client, job, sim)
    assert cursor(redis_client, job) == str(Cursor.through(sim.chain.latest))  # the job went on
    assert at_tip(redis_client, job, sim)
    assert watermark(redis_client, job) == before_gap  # and its watermark did not
    held = redis_client.hget(job_keys(job)["cursor"], "complete_held")
    assert held is not None and f"before {sim.chain.first - 3}" in str(held)
    said = [e for e in logs if e["event"] == "complete-through-held"]
    assert len(said) == 1 and said[0]["complete_through"] == before_gap, said
