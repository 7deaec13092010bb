"""The simulator's data lake: the lake reader derives, id for id and byte for byte, the events the
simulator's RPC serves; the lake holds the whole history (retention does not apply) and grows as
ledgers close, never with a hole."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from ingestion.cli.simulate import config_from_args
from ingestion.lake.events import batch_events, decompress, object_events, read_batch
from ingestion.lake.events import ledger_events as lake_ledger_events
from ingestion.lake.keys import LakeSchema
from ingestion.lake.store import LocalLake
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.simulator.chain import Chain
from ingestion.simulator.lake import SCHEMA, LakeWriter, ledger_close_meta, object_bytes
from ingestion.simulator.records import ChainSpec
from ingestion.simulator.rpc_events import SYSTEM_EVERY
from ingestion.simulator.rpc_events import ledger_events as rpc_ledger_events


def test_lake_events_equal_the_simulators_rpc_events_id_for_id() -> None:
    chain = Chain(ChainSpec(seed=7, ops_per_ledger=30, first_ledger=50_000_000), history_ledgers=45)
    served = derived = 0
    for seq in range(chain.first, chain.latest + 1):
        (ledger,) = object_events(object_bytes([ledger_close_meta(chain, seq)]))
        rpc = [e.body.decode() for e in rpc_ledger_events(chain, seq)]
        assert [e.body for e in ledger.events] == rpc, f"ledger {seq}"
        assert ledger.ledger == seq and ledger.protocol == 23
        served, derived = served + len(rpc), derived + len(ledger.events)
    assert served == derived > 100
    system = [seq for seq in range(chain.first, chain.latest + 1) if seq % SYSTEM_EVERY == 0]
    assert system  # the AfterAllTxs system events are among them


def test_the_partial_decode_equals_the_full_decode_on_the_simulators_lake() -> None:
    chain = Chain(ChainSpec(seed=11, ops_per_ledger=30, first_ledger=50_000_000), history_ledgers=45)
    metas = [ledger_close_meta(chain, seq) for seq in range(chain.first, chain.latest + 1)]
    for data in [object_bytes(metas[:1]), object_bytes(metas)]:  # one ledger per object, and 45
        raw = decompress(data)
        fast = batch_events(raw)
        assert fast == [lake_ledger_events(m) for m in read_batch(raw)[2]]
    assert len(fast) == 45 and sum(len(le.events) for le in fast) > 100
    assert any(e.type == "system" for le in fast for e in le.events)


def test_a_ledger_without_events_is_an_empty_ledger_in_the_lake() -> None:
    chain = Chain(ChainSpec(ops_per_ledger=0), history_ledgers=2)
    (meta,) = [ledger_close_meta(chain, chain.latest)]
    assert lake_ledger_events(meta).events == ()


def test_the_writer_refuses_a_hole(tmp_path: Path) -> None:
    chain = Chain(ChainSpec(), history_ledgers=3)
    writer = LakeWriter(tmp_path)
    writer.write_history(chain, chain.first, chain.first + 1)
    assert LakeSchema.from_manifest((tmp_path / ".config.json").read_bytes()) == SCHEMA
    with pytest.raises(ValueError, match="hole"):
        writer.write(chain.first + 3, object_bytes([ledger_close_meta(chain, chain.latest)]))


def test_simulate_lake_dir_flag() -> None:
    assert config_from_args(["--lake-dir", "/tmp/lake"]).lake_dir == "/tmp/lake"
    assert config_from_args([]).lake_dir is None


async def test_the_simulators_lake_holds_all_history_and_grows_with_the_chain(tmp_path: Path) -> None:
    config = SimulatorConfig(
        history_ledgers=30, retention_ledgers=10, ledger_interval=None, rpc_port=0, lake_dir=str(tmp_path)
    )
    async with open_simulator(config) as sim:
        assert sim.lake is not None
        for _ in range(3):
            sim.close_ledger()
        with trio.fail_after(20):
            await sim.wait_for_lake(sim.chain.latest)
        lake = LocalLake(tmp_path)
        assert await lake.edges() == (config.first_ledger, sim.chain.latest)
        assert sim.chain.first > config.first_ledger  # the lake holds what RPC no longer does
        schema = await lake.schema()
        assert schema is not None
        from_lake = []
        for seq in range(sim.chain.first, sim.chain.latest + 1):
            _, data = await lake.read_ledger(schema, seq)
            assert data is not None
            from_lake += [json.loads(e.body) for le in object_events(data) for e in le.events]
        # getEvents paged over HTTP from the oldest retained ledger
        served, cursor = [], None
        async with httpx.AsyncClient() as client:
            while True:
                params = {"pagination": {"limit": 50, **({"cursor": cursor} if cursor else {})}}
                if cursor is None:
                    params["startLedger"] = sim.chain.first
                body = {"jsonrpc": "2.0", "id": 1, "method": "getEvents", "params": params}
                result = (await client.post(sim.rpc_url, json=body)).json()["result"]
                served += result["events"]
                cursor = result["cursor"]
                if not result["events"]:
                    break
        assert [e["id"] for e in from_lake] == [e["id"] for e in served]
        assert from_lake == served
