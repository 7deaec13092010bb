"""The events API on a real node process: ``[api] job`` makes it host the projector job
``api.<job>`` beside the job, and ``api.port`` serves the job's events from the simulator's RPC,
the newest ledger's events visible shortly after they close."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis, free_port
from ingestion.testing.processes import NodeProcess
from ingestion.testing.wait import wait_until

CONFIG = SimulatorConfig(rpc_port=0, ledger_interval=None, history_ledgers=20, ops_per_ledger=10, seed=3)


@pytest.mark.slow  # a node process and the simulator: about 15 s on the loaded 2-core machine
async def test_a_node_hosts_the_projector_and_serves_its_jobs_events(
    pg: LocalPostgres, redis_server: LocalRedis, job: str
) -> None:
    port, metrics = free_port(), free_port()
    async with open_simulator(CONFIG) as sim:
        node = await trio.to_thread.run_sync(
            lambda: NodeProcess.start(
                "api-n1", redis_url=redis_server.url, horizon=None, ttl_ms=2000, job=job,
                extra=["--source", "rpc", "--rpc", sim.rpc_url, "--sink", pg.url,
                       "--metrics-port", str(metrics)],
                env={"INGESTION_API_JOB": job, "INGESTION_API_PORT": str(port),
                     "INGESTION_OBSERVE_LISTEN_HOST": "127.0.0.1"},
            )
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/"
        try:
            async with httpx.AsyncClient(timeout=5) as client:

                async def ask(method: str, params: Any = None) -> dict[str, Any]:
                    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                    try:
                        answer: dict[str, Any] = (await client.post(url, json=body)).json()
                    except httpx.HTTPError:
                        return {}
                    return answer

                latest: dict[str, Any] = {}

                async def at(ledger: int) -> bool:
                    latest.update(await ask("getHealth"))
                    return latest.get("result", {}).get("latestLedger", 0) >= ledger

                await wait_until(lambda: at(sim.chain.latest), 30, what="the API at the tip", every=0.05)
                oldest = latest["result"]["oldestLedger"]
                page = (await ask("getEvents", {"startLedger": oldest, "pagination": {"limit": 10000}}))[
                    "result"
                ]
                want = [e["id"] for e in sim.rpc_events() if e["ledger"] >= oldest]
                assert [e["id"] for e in page["events"]] == want and want
                closed = sim.close_ledger()
                await wait_until(lambda: at(closed), 10, what="the newly closed ledger served", every=0.05)
                after = {"pagination": {"cursor": page["cursor"], "limit": 10000}}
                fresh = (await ask("getEvents", after))["result"]["events"]
                assert [e["id"] for e in fresh] == [
                    e["id"] for e in sim.rpc_events() if e["ledger"] == closed
                ]
                # The node's console shows the API it serves, from its own counters.
                shown = (await client.get(f"http://127.0.0.1:{metrics}/console/state")).json()["api"]
                assert shown["job"] == job and shown["latest_ledger"] == closed
                served = {(r["method"], r["outcome"]): r["count"] for r in shown["requests"]}
                assert served[("getEvents", "ok")] == 2 and served[("getHealth", "ok")] >= 2
            projector = f"api.{job}"
            led = await trio.to_thread.run_sync(
                lambda: node.wait_for(
                    lambda line: line.event == "became-leader" and line.fields.get("job") == projector, 5
                )
            )
            assert led.fields["job"] == projector
        finally:
            await trio.to_thread.run_sync(node.stop)
