"""The simulator's network: the passphrase it is started with, said by Horizon's root, RPC's
getNetwork and the lake's manifest; getLedgers' hashes; and a reset from the control endpoint
that starts the chain again at ledger 1 with new hashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from ingestion.cli.simulate import config_from_args
from ingestion.lake.keys import LakeSchema
from ingestion.simulator import SimulatorConfig, open_simulator

OTHER = "Other Network ; December 2026"


async def rpc(client: httpx.AsyncClient, url: str, method: str, params: Any = None) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer: dict[str, Any] = (await client.post(url, json=body)).json()
    return answer


async def test_the_passphrase_is_said_by_the_root_get_network_and_the_lake(tmp_path: Path) -> None:
    assert config_from_args(["--network-passphrase", OTHER]).network_passphrase == OTHER
    config = SimulatorConfig(
        rpc_port=0, ledger_interval=None, history_ledgers=3, network_passphrase=OTHER, lake_dir=str(tmp_path)
    )
    async with open_simulator(config) as sim, httpx.AsyncClient(timeout=10) as client:
        root = (await client.get(sim.url + "/")).json()
        assert root["network_passphrase"] == OTHER
        assert (await rpc(client, sim.rpc_url, "getNetwork"))["result"]["passphrase"] == OTHER
        await sim.wait_for_lake(sim.chain.latest)
        manifest = (tmp_path / ".config.json").read_bytes()
        assert LakeSchema.from_manifest(manifest).network_passphrase == OTHER


async def test_a_reset_starts_the_chain_at_ledger_1_with_new_hashes() -> None:
    config = SimulatorConfig(rpc_port=0, ledger_interval=None, history_ledgers=5, first_ledger=10)
    async with open_simulator(config) as sim, httpx.AsyncClient(timeout=10) as client:
        before = (await client.get(f"{sim.url}/ledgers/12")).json()["hash"]
        latest = (await rpc(client, sim.rpc_url, "getLatestLedger"))["result"]
        ledgers = await rpc(
            client, sim.rpc_url, "getLedgers", {"startLedger": 14, "pagination": {"limit": 1}}
        )
        assert ledgers["result"]["ledgers"][0] == {
            "hash": latest["id"], "sequence": 14, "ledgerCloseTime": latest["closeTime"]
        }  # fmt: skip
        reset = (await client.post(f"{sim.url}/_simulator/reset", json={})).json()
        assert reset == {"latest_ledger": 1, "seed": config.seed + 1}
        assert (await client.get(sim.url + "/")).json()["history_latest_ledger"] == 1
        assert (await client.get(f"{sim.url}/ledgers/12")).status_code == 404
        await client.post(f"{sim.url}/_simulator/ledgers", json={"count": 11})
        after = (await client.get(f"{sim.url}/ledgers/12")).json()["hash"]
        assert after != before
        out_of_range = await rpc(client, sim.rpc_url, "getLedgers", {"startLedger": 14})
        assert out_of_range["error"]["code"] == -32602
        bad = (await client.post(f"{sim.url}/_simulator/reset", json={"sed": 1})).status_code
        assert bad == 400
