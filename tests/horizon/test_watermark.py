"""The completeness watermark of a Horizon job (issue 49), in a real node (in process) against the
simulator's Horizon and a real Redis: a watch list that matches nothing still moves it with
Horizon's closed ledgers, and a skipped history gap freezes it at the ledger before the gap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
import trio

from actors.lease_store import job_keys
from ingestion.decode.stage import rule_for, stage_for
from ingestion.horizon.source import HorizonSource
from ingestion.node.build import audit_writer
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.wait import wait_until
from ingestion.watchlist.lists import InlineWatch
from tests.support.nodes import OpenStore, Recorder, start_node

NOBODY = "GAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAWHF"  # a valid account no record names
LOOK = 0.2  # seconds: horizon.complete_check_ms
QUIET_LEDGERS = 12  # at least 60 s of pubnet, each ledger followed before the next closes


def watermark(client: redis.Redis, job: str) -> int | None:
    value = client.hget(job_keys(job)["cursor"], "complete_through")
    return None if value is None else int(value)


def watched(url: str, **kw: Any) -> Any:
    source = HorizonSource(
        url, "/operations", retry_base=0.05, retry_cap=0.2, complete_check_interval=LOOK, **kw
    )
    rule, decode = rule_for("horizon", "/operations")
    return stage_for(source, rule, decode, InlineWatch([NOBODY]))


@asynccontextmanager
async def node(url: str, job: str, source: Any, **kw: Any) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        handle = await start_node(nursery, Recorder(), url, job, "n1", source, **kw)
        try:
            yield
        finally:
            await handle.shutdown()


async def test_a_watch_list_that_matches_nothing_still_moves_the_watermark_with_horizons_ledgers(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=30, ops_per_ledger=20)
    async with open_simulator(config) as sim, node(redis_server.url, job, watched(sim.url)):
        await wait_until(
            lambda: watermark(redis_client, job) == sim.chain.latest, 15, what="the watermark at the tip"
        )
        for _ in range(QUIET_LEDGERS):
            closed = sim.close_ledger()
            # within 2 ledgers as soon as the ledger's records are read, then at the ledger itself
            await wait_until(
                lambda closed=closed: (watermark(redis_client, job) or 0) >= closed - 2,  # type: ignore[misc]
                5,
                what="within 2 ledgers",
            )
            await wait_until(
                lambda closed=closed: watermark(redis_client, job) == closed,  # type: ignore[misc]
                5,
                what=f"the watermark at ledger {closed}",
            )
    assert redis_client.xlen(job_keys(job)["events"]) == 0  # the list matched nothing
    assert redis_client.hget(job_keys(job)["cursor"], "complete_held") is None


async def test_a_skipped_history_gap_freezes_the_watermark_at_the_ledger_before_it(
    redis_server: LocalRedis, redis_client: redis.Redis, job: str, open_store: OpenStore
) -> None:
    config = SimulatorConfig(ledger_interval=None, history_ledgers=10, ops_per_ledger=4, retention_ledgers=20)
    async with open_simulator(config) as sim:
        async with node(redis_server.url, job, watched(sim.url)):
            await wait_until(lambda: watermark(redis_client, job) == sim.chain.latest, 15, what="at the tip")
        before_gap = sim.chain.latest
        for _ in range(40):  # the job is stopped while history moves on past its cursor
            sim.close_ledger()
        elder = sim.chain.first
        assert elder > before_gap + 1  # ledgers the job never read are gone
        store = open_store(redis_server.url, job)
        source = watched(sim.url, on_history_gap="skip", audit=audit_writer(store))
        async with node(redis_server.url, job, source, store=store):
            key = job_keys(job)["cursor"]
            await wait_until(lambda: redis_client.hget(key, "complete_held") is not None, 15, what="held")
            for _ in range(3):
                sim.close_ledger()
            tip = str(((sim.chain.latest + 1) << 32) - 1)  # the last position of the latest ledger
            await wait_until(lambda: redis_client.hget(key, "cursor") == tip, 15, what="the job at the tip")
    assert watermark(redis_client, job) == before_gap  # the job went on, its watermark did not
    held = redis_client.hget(job_keys(job)["cursor"], "complete_held")
    assert f"before {elder}" in str(held) and sim.url in str(held)
