"""The simulator's Stellar RPC as the official SDK sees it: stellar_sdk's ``SorobanServer`` (its own
HTTP client and pydantic models) against the RPC port, for every method the simulator serves.

The SDK sends absent options as JSON ``null`` (``"endLedger": null``, ``"cursor": null``); a real
RPC decodes with Go's rules, where ``null`` leaves a field at its zero value, and so must we."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from stellar_sdk import SorobanServer, scval
from stellar_sdk.exceptions import SorobanRpcErrorResponse
from stellar_sdk.soroban_rpc import EventFilter, EventFilterType

from ingestion.rpc.protocol import INVALID_REQUEST, RANGE_MESSAGE, Cursor
from ingestion.rpc.protocol import EventFilter as Filter
from ingestion.simulator import Simulator, SimulatorConfig, open_simulator
from ingestion.simulator.records import NETWORK_PASSPHRASE, PROTOCOL_VERSION

CONFIG = SimulatorConfig(
    rpc_port=0, ledger_interval=None, history_ledgers=40, retention_ledgers=30, ops_per_ledger=20, seed=11
)
TRANSFER = str(scval.to_symbol("transfer").to_xdr())


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with open_simulator(CONFIG) as s:
        yield s


async def with_sdk(sim: Simulator, work: Any) -> Any:
    def run() -> Any:
        with SorobanServer(sim.rpc_url) as server:
            return work(server)

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(run)


async def test_sdk_get_events_pages_every_event_from_the_oldest_ledger(sim: Simulator) -> None:
    oldest = sim.chain.latest - CONFIG.retention_ledgers + 1

    def page_all(server: SorobanServer) -> list[str]:
        got: list[str] = []
        page = server.get_events(start_ledger=oldest, limit=50)  # endLedger and cursor: null
        while page.events:
            got += [e.id for e in page.events]
            page = server.get_events(cursor=page.cursor, limit=50)
        return got

    got = await with_sdk(sim, page_all)
    expected = [e["id"] for e in sim.rpc_events()]
    assert got == expected and len(got) > 50


async def test_sdk_get_events_with_filters_and_an_end_ledger(sim: Simulator) -> None:
    oldest = sim.chain.latest - CONFIG.retention_ledgers + 1
    filters = [EventFilter(event_type=EventFilterType.CONTRACT, topics=[[TRANSFER, "*", "*", "*"]])]
    page = await with_sdk(
        sim, lambda s: s.get_events(start_ledger=oldest, end_ledger=oldest + 5, filters=filters, limit=1000)
    )
    ours = Filter(types=("contract",), topics=((TRANSFER, "*", "*", "*"),))
    expected = [e["id"] for e in sim.rpc_events((ours,)) if e["ledger"] < oldest + 5]
    assert [e.id for e in page.events] == expected and expected
    assert all(e.event_type == "contract" and e.topic[0] == TRANSFER for e in page.events)
    assert page.cursor == str(Cursor.through(oldest + 4))
    assert page.latest_ledger == sim.chain.latest


async def test_sdk_sees_the_range_error_as_a_real_rpc_sends_it(sim: Simulator) -> None:
    with pytest.raises(SorobanRpcErrorResponse) as caught:
        await with_sdk(sim, lambda s: s.get_events(start_ledger=1))
    oldest = sim.chain.latest - CONFIG.retention_ledgers + 1
    assert caught.value.code == INVALID_REQUEST
    assert caught.value.message == RANGE_MESSAGE.format(oldest=oldest, latest=sim.chain.latest)


async def test_sdk_reads_health_latest_ledger_and_network(sim: Simulator) -> None:
    seq = sim.close_ledger()  # history closed in the past: a live ledger makes the node healthy

    def read(server: SorobanServer) -> tuple[Any, Any, Any]:
        return server.get_health(), server.get_latest_ledger(), server.get_network()

    health, latest, network = await with_sdk(sim, read)
    assert health.status == "healthy" and health.latest_ledger == seq
    assert latest.sequence == seq and latest.protocol_version == PROTOCOL_VERSION
    assert network.passphrase == NETWORK_PASSPHRASE and network.protocol_version == PROTOCOL_VERSION
