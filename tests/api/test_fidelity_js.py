"""Fidelity through js-stellar-sdk (``rpc.Server.getEvents``, the npm package): the simulator's RPC
and the events API over the same events (``tests/api/test_fidelity.py``'s store) give identical
answers inside the RPC's window for a matrix of filters, wildcards and pagination; before it the
RPC refuses and the API answers. (js-stellar-sdk sends no ``xdrFormat``: base64 only.)

Slow: the first run installs the SDK with npm (``scripts/js-sdk``, about 35 s), then each run
starts node twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import trio

from ingestion.rpc.protocol import INVALID_REQUEST
from ingestion.simulator import Simulator
from ingestion.simulator.rpc_events import all_events
from ingestion.testing.local_postgres import LocalPostgres
from tests.support.api_fidelity import APPROVE, CONFIG, COUNTER, PING, TRANSFER, rpc_and_api, whole_history
from tests.support.js_sdk import get_events_pages, node_modules

pytestmark = pytest.mark.slow


def matrix(sim: Simulator, oldest: int) -> list[dict[str, Any]]:
    events = [orjson.loads(e.body) for e in all_events(sim.rpc_log, sim.chain.latest - 5, sim.chain.latest)]
    contract = next(e["contractId"] for e in events if e["contractId"])
    account = next(e["topic"][1] for e in events if e["topic"][0] == TRANSFER)
    filter_sets: list[list[dict[str, Any]]] = [
        [],
        [{"type": "system"}],
        [{"type": "contract", "contractIds": [contract]}],
        [{"topics": [[TRANSFER, "*", "*", "*"]]}],
        [{"topics": [[TRANSFER, account, "**"]]}],
        [{"topics": [["*", "**"]]}, {"contractIds": [contract]}],
        [{"topics": [[PING], [COUNTER, "*"]]}],
        [{"topics": [[APPROVE, "**"]]}, {"type": "system"}],
        [{"topics": [["*"]]}],
    ]
    return [
        {"startLedger": start, "filters": filters, "limit": limit}
        for filters in filter_sets
        for start, limit in ((oldest, 7), (oldest + 11, 100))
    ]


CLOSE_TIME = "latestLedgerCloseTime"


def apart(answers: list[Any]) -> tuple[list[Any], set[int]]:
    """The answers without ``latestLedgerCloseTime``, and the set of those close times. (The API
    knows the close times of ledgers that hold events only: when the latest ledger has none, it
    sends the close time of the newest one that has: a known divergence, asserted apart.)"""
    pages = [[{k: v for k, v in p.items() if k != CLOSE_TIME} for p in answer] for answer in answers]
    return pages, {int(p[CLOSE_TIME]) for answer in answers for p in answer}


@pytest.fixture
async def both(pg: LocalPostgres, job: str) -> AsyncIterator[tuple[Simulator, str]]:
    async with rpc_and_api(pg.url, job) as served:
        yield served


async def test_js_stellar_sdk_gets_identical_answers_inside_the_rpcs_window(
    both: tuple[Simulator, str],
) -> None:
    sim, api_url = both
    first, oldest = sim.chain.spec.first_ledger, sim.chain.latest - CONFIG.retention_ledgers + 1
    modules = await trio.to_thread.run_sync(node_modules)
    requests = [*matrix(sim, oldest), {"startLedger": first, "filters": [], "limit": 10}]
    rpc = await trio.to_thread.run_sync(get_events_pages, modules, sim.rpc_url, requests)
    api = await trio.to_thread.run_sync(get_events_pages, modules, api_url, requests)
    (rpc_pages, rpc_closes), (api_pages, api_closes) = apart(rpc[:-1]), apart(api[:-1])
    assert api_pages == rpc_pages
    assert sum(len(p["events"]) for answer in rpc_pages for p in answer) > 300
    assert max(api_closes) <= max(rpc_closes)
    # before the window: the RPC refuses, the API answers from history (the lake's ledgers)
    assert rpc[-1]["error"]["code"] == INVALID_REQUEST
    older = [e.id for e in all_events(whole_history(sim), first, oldest - 1)][:10]
    assert [e["id"] for e in api[-1][0]["events"]] == older
