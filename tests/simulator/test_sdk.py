"""A real third-party Horizon client (stellar_sdk's sync Server) pages and streams from it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
import stellar_sdk  # a dependency of the package: missing is an error, never a skip
import trio

from ingestion.simulator import Simulator, SimulatorConfig
from tests.support.simulator import running


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    config = SimulatorConfig(ledger_interval=0.1, history_ledgers=10, ops_per_ledger=50, seed=5)
    async for s in running(config):
        yield s


async def test_stellar_sdk_pages_through_every_operation(sim: Simulator) -> None:
    expected = [r["paging_token"] for r in sim.records("/operations")][:500]

    def page_through() -> list[str]:
        with stellar_sdk.Server(horizon_url=sim.url) as server:
            builder = server.operations().limit(200).order(desc=False)
            got: list[str] = []
            page: dict[str, Any] = builder.call()
            while page["_embedded"]["records"] and len(got) < 500:
                got.extend(r["paging_token"] for r in page["_embedded"]["records"])
                page = builder.next()
            return got

    got = await trio.to_thread.run_sync(page_through)
    assert got[:500] == expected


async def test_stellar_sdk_streams_operations_from_a_cursor(sim: Simulator) -> None:
    ops = sim.records("/operations")
    cursor = ops[-3]["paging_token"]

    def stream_some() -> list[dict[str, Any]]:
        with stellar_sdk.Server(horizon_url=sim.url) as server:
            stream = server.operations().cursor(cursor).stream()
            return list(itertools.islice(stream, 6))  # 2 existing, then live ones

    with trio.fail_after(20):
        got = await trio.to_thread.run_sync(stream_some, abandon_on_cancel=True)
    assert [r["paging_token"] for r in got[:2]] == [r["paging_token"] for r in ops[-2:]]
    tokens = [int(r["paging_token"]) for r in got]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6


async def test_stellar_sdk_reads_single_records_and_root(sim: Simulator) -> None:
    tx = sim.records("/transactions")[0]

    def fetch() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        with stellar_sdk.Server(horizon_url=sim.url) as server:
            return (
                server.root().call(),
                server.transactions().transaction(tx["hash"]).call(),
                server.ledgers().ledger(tx["ledger"]).call(),
            )

    root, got_tx, ledger = await trio.to_thread.run_sync(fetch)
    assert root["history_latest_ledger"] >= tx["ledger"]
    assert got_tx == tx
    assert ledger["sequence"] == tx["ledger"]
