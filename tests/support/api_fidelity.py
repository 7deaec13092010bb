"""The store the events API's fidelity tests compare against the simulator's Stellar RPC, filled as
a node fills it: the live job's batches are the RPC source's own (from the RPC's oldest ledger to
its tip), committed by the PostgreSQL sink; the ledgers before the window are a backfill range's
rows (the events the lake's ledgers hold); the projector then projects both. (The same store as
``tests/api/test_fidelity.py``'s, for the tests through js-stellar-sdk.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import trio
from stellar_sdk import scval

from actors.lease_store import Committed
from actors.source import Record, TermContext
from ingestion.api.core import ApiRules
from ingestion.api.projector import projector_action
from ingestion.api.reader import StoreReader
from ingestion.api.server import ApiApp, serve_api
from ingestion.postgres.sink import PostgresSink
from ingestion.rpc.protocol import Cursor
from ingestion.rpc.source import RpcSource
from ingestion.simulator import Simulator, SimulatorConfig, open_simulator
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import NETWORK_PASSPHRASE
from ingestion.simulator.rpc_events import EventLog, all_events

CONFIG = SimulatorConfig(
    rpc_port=0, ledger_interval=None, history_ledgers=70, retention_ledgers=30, ops_per_ledger=12, seed=5
)
TRANSFER = str(scval.to_symbol("transfer").to_xdr())
APPROVE = str(scval.to_symbol("approve").to_xdr())
PING = str(scval.to_symbol("ping").to_xdr())
COUNTER = str(scval.to_symbol("counter").to_xdr())


def whole_history(sim: Simulator) -> EventLog:
    """The simulated chain's events from its first ledger on, those before the RPC's retention
    included (what its lake's ledgers hold: the same chain, rebuilt without a retention)."""
    return EventLog(Chain(sim.chain.spec, history_ledgers=sim.chain.latest - sim.chain.spec.first_ledger + 1))


async def ingest(sim: Simulator, url: str, view: str) -> None:
    """The live job from the RPC's oldest ledger to its tip, and a range before the window."""
    oldest, latest = sim.chain.latest - CONFIG.retention_ledgers + 1, sim.chain.latest
    live = PostgresSink(url, view, call_timeout=5)
    await live.open_term("a", 1)
    cursor: str | None = None
    source = RpcSource((sim.rpc_url,), retry_base=0.02, retry_cap=0.2, request_timeout=5)
    with trio.fail_after(30):
        async with source.stream("0") as batches:
            async for batch in batches:
                done = await live.commit("a", 1, cursor, batch.records, batch.through)
                assert isinstance(done, Committed), done
                cursor = done.cursor
                if Cursor.parse(cursor) >= Cursor.through(latest):
                    break
    first = sim.chain.spec.first_ledger
    history = PostgresSink(url, f"{view}~{first}-{oldest - 1}", call_timeout=5)
    await history.open_term("a", 1)
    older = all_events(whole_history(sim), first, oldest - 1)
    done = await history.commit("a", 1, None, [Record(e.id, e.body.decode()) for e in older],
                                str(Cursor.through(oldest - 1)))  # fmt: skip
    assert isinstance(done, Committed)
    await projector_action(url, "ingestion", view, run_seconds=0)(1, TermContext("p", 1))
    live.close()
    history.close()


@asynccontextmanager
async def rpc_and_api(url: str, view: str) -> AsyncIterator[tuple[Simulator, str]]:
    """A simulator, and the events API over a view ``view`` of its events at ``url``."""
    async with open_simulator(CONFIG) as sim:
        await ingest(sim, url, view)
        app = ApiApp(StoreReader(url, "ingestion", view), ApiRules(passphrase=NETWORK_PASSPHRASE))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api, app, "127.0.0.1", 0, structlog.get_logger())
            yield sim, f"http://127.0.0.1:{port}/"
            nursery.cancel_scope.cancel()
