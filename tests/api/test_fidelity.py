"""Fidelity: the official stellar-sdk (``SorobanServer.get_events``) against the simulator's Stellar
RPC and against the events API over the same events give identical answers inside the RPC's
window, for a matrix of filters, wildcards, pagination and both ``xdrFormat``s; before the window
the RPC refuses and the API answers, with the events the chain's older ledgers hold.

The store is filled as a node fills it: the live job's batches are the RPC source's own
(:class:`~ingestion.rpc.source.RpcSource` from the RPC's oldest ledger to its tip), committed by
the PostgreSQL sink; the ledgers before the window are a backfill range's rows (the events the
lake's ledgers hold: the simulator's event log, which its lake writes too); the projector then
projects both (``tests/support/api_fidelity.py``, the store the js-stellar-sdk tests use too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import trio
from stellar_sdk import SorobanServer
from stellar_sdk.exceptions import SorobanRpcErrorResponse
from stellar_sdk.soroban_rpc import EventFilter, EventFilterType

from ingestion.rpc.protocol import INVALID_REQUEST
from ingestion.simulator import Simulator
from ingestion.simulator.rpc_events import all_events
from ingestion.testing.local_postgres import LocalPostgres
from tests.support.api_fidelity import APPROVE, CONFIG, COUNTER, PING, TRANSFER, rpc_and_api, whole_history


@pytest.fixture
async def both(pg: LocalPostgres, job: str) -> AsyncIterator[tuple[Simulator, str]]:
    """A simulator and the API over a view of its events (the test's own job name)."""
    async with rpc_and_api(pg.url, job) as served:
        yield served


def filters_matrix(sim: Simulator) -> list[list[EventFilter]]:
    events = [orjson.loads(e.body) for e in all_events(sim.rpc_log, sim.chain.latest - 5, sim.chain.latest)]
    contract = next(e["contractId"] for e in events if e["contractId"])
    account = next(e["topic"][1] for e in events if e["topic"][0] == TRANSFER)
    return [
        [],
        [EventFilter(event_type=EventFilterType.SYSTEM)],
        [EventFilter(event_type=EventFilterType.CONTRACT, contract_ids=[contract])],
        [EventFilter(topics=[[TRANSFER, "*", "*", "*"]])],
        [EventFilter(topics=[[TRANSFER, account, "**"]])],
        [EventFilter(topics=[["*", "**"]]), EventFilter(contract_ids=[contract])],
        [EventFilter(topics=[[PING], [COUNTER, "*"]])],
        [EventFilter(topics=[[APPROVE, "**"]]), EventFilter(event_type=EventFilterType.SYSTEM)],
        [EventFilter(topics=[["*"]])],
    ]


def pages(server: SorobanServer, start: int, filters: list[EventFilter], limit: int) -> list[dict[str, Any]]:
    """Every page from ``start`` to the tip, as the SDK parsed them (cursor and latest included)."""
    out = []
    page = server.get_events(start_ledger=start, filters=filters, limit=limit)
    while True:
        out.append(
            page.model_dump(exclude={"oldest_ledger", "oldest_ledger_close_time", "latest_Ledger_close_time"})
        )
        if not page.events:
            return out
        page = server.get_events(filters=filters, cursor=page.cursor, limit=limit)


async def test_the_sdk_gets_identical_answers_inside_the_rpcs_window(both: tuple[Simulator, str]) -> None:
    sim, api_url = both
    oldest = sim.chain.latest - CONFIG.retention_ledgers + 1

    def compare() -> int:
        compared = 0
        with SorobanServer(sim.rpc_url) as rpc, SorobanServer(api_url) as api:
            for filters in filters_matrix(sim):
                for start, limit in ((oldest, 7), (oldest + 11, 100)):
                    want = pages(rpc, start, filters, limit)
                    assert pages(api, start, filters, limit) == want, filters
                    compared += sum(len(p["events"]) for p in want)
        return compared

    with trio.fail_after(60):
        compared = await trio.to_thread.run_sync(compare)
    assert compared > 300  # (351 with this seed)


async def test_json_format_answers_are_identical_too(both: tuple[Simulator, str]) -> None:
    sim, api_url = both
    oldest = sim.chain.latest - CONFIG.retention_ledgers + 1
    async with httpx.AsyncClient(timeout=10) as client:
        for filters in ([], [{"topics": [[TRANSFER, "**"]]}], [{"type": "system"}]):
            params = {
                "startLedger": oldest,
                "filters": filters,
                "xdrFormat": "json",
                "pagination": {"limit": 40},
            }
            body = {"jsonrpc": "2.0", "id": 1, "method": "getEvents", "params": params}
            want = (await client.post(sim.rpc_url, json=body)).json()["result"]
            got = (await client.post(api_url, json=body)).json()["result"]
            assert got["events"] == want["events"] and got["cursor"] == want["cursor"]
            assert want["events"] and "topicJson" in want["events"][0]


async def test_before_the_window_the_rpc_refuses_and_the_api_answers_from_history(
    both: tuple[Simulator, str],
) -> None:
    sim, api_url = both
    first, oldest = sim.chain.spec.first_ledger, sim.chain.latest - CONFIG.retention_ledgers + 1
    assert sim.chain.first == oldest  # (the RPC holds no more)

    def ask() -> tuple[SorobanRpcErrorResponse, list[str], Any]:
        with SorobanServer(sim.rpc_url) as rpc, SorobanServer(api_url) as api:
            with pytest.raises(SorobanRpcErrorResponse) as refused:
                rpc.get_events(start_ledger=first, limit=10)
            page = api.get_events(start_ledger=first, end_ledger=oldest, limit=10_000)
            return refused.value, [e.id for e in page.events], api.get_health()

    refused, ids, health = await trio.to_thread.run_sync(ask)
    assert refused.code == INVALID_REQUEST
    assert ids == [e.id for e in all_events(whole_history(sim), first, oldest - 1)] and len(ids) > 50
    assert (health.oldest_ledger, health.latest_ledger) == (first, sim.chain.latest)
