"""deploy/grafana/ingestion.json: a real Prometheus scrapes a live three-node cluster (an ingestion
job and a webhook job delivering it to a loopback receiver), and every panel's query returns series."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import free_port
from ingestion.testing.receiver import Receiver, serve_receiver
from tests.support.deploy import DEPLOY, require_tool, unknown_metrics

DASHBOARD = DEPLOY / "grafana" / "ingestion.json"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def panel_queries() -> dict[str, str]:
    board = json.loads(DASHBOARD.read_text())
    return {
        f"{panel['title']} ({target['refId']})": target["expr"]
        for panel in board["panels"]
        for target in panel.get("targets", [])  # a row has none
    }


def test_panel_ids_are_unique_and_rows_hold_no_queries() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    assert all("targets" not in panel for panel in panels if panel["type"] == "row")
    assert [panel["title"] for panel in panels if panel["type"] == "row"] == ["Webhooks"]


def test_the_dashboard_shows_what_issue_24_asks_for() -> None:
    exprs = " ".join(panel_queries().values())
    for metric in ("ingestion_leader", "ingestion_consumer_group_lag_entries",
                   "ingestion_events_ingested_total", "ingestion_elections_total",
                   "ingestion_source_up", "ingestion_source_lag_seconds",
                   "ingestion_webhook_delivered_total", "ingestion_webhook_attempts_total",
                   "ingestion_webhook_dead_letters_total", "ingestion_webhook_lag_seconds",
                   "ingestion_webhook_endpoint_state"):  # fmt: skip
        assert metric in exprs
    assert "job)" not in exprs.replace("ingestion_job)", "")  # never Prometheus's own job label


def test_every_metric_a_panel_queries_is_one_a_node_serves() -> None:
    assert not unknown_metrics(" ".join(panel_queries().values()))


async def query(client: httpx.AsyncClient, base: str, expr: str) -> list[Any]:
    response = await client.get(f"{base}/api/v1/query", params={"query": expr})
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.slow
async def test_every_panel_query_returns_series_from_a_live_cluster(job: str, tmp_path: Path) -> None:
    prometheus = require_tool("prometheus", "prometheus")
    receiver = Receiver(SECRET)
    async with trio.open_nursery() as outer:
        # The nodes also host a webhook job delivering the ingestion job, for the webhook row.
        hook_port = await outer.start(serve_receiver, receiver)
        hooks = tmp_path / "config.toml"
        hooks.write_text(
            f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
            f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\n'
            f'url = "http://127.0.0.1:{hook_port}/in"\nsecret = "{SECRET}"\nstart = "first"\n'
        )
        async with open_cluster(job, ttl_ms=1500) as cluster:
            ports = {name: free_port() for name in ("a", "b", "c")}
            for name, port in ports.items():
                await cluster.start_node(
                    name, extra=["--config", str(hooks), "--job", f"{job}-hook", "--metrics-port", str(port)]
                )
            # A consumer group on the events stream, for the lag panel.
            cluster.client.xgroup_create(cluster.keys["events"], "dashboard", id="0", mkstream=True)

            config = tmp_path / "prometheus.yml"
            config.write_text(json.dumps({  # JSON is YAML
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{
                    "job_name": "ingestion",
                    "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}],
                }],
            }))  # fmt: skip
            web = free_port()
            process = await trio.lowlevel.open_process(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            base = f"http://127.0.0.1:{web}"
            missing: dict[str, str] = panel_queries()
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    with trio.move_on_after(60):
                        while missing:
                            await trio.sleep(1)
                            if process.returncode is not None:
                                raise AssertionError(f"prometheus exited {process.returncode}")
                            try:
                                for title, expr in list(missing.items()):
                                    if await query(client, base, expr):
                                        del missing[title]
                            except httpx.TransportError:
                                continue  # not listening yet
                    # Prometheus sees all three nodes, under its own job and instance labels.
                    up = await query(client, base, 'up{job="ingestion"} == 1')
                    assert len(up) == 3
                    leaders = await query(client, base, "sum by (ingestion_job) (ingestion_leader)")
                    assert {(s["metric"]["ingestion_job"], s["value"][1]) for s in leaders} == {
                        (job, "1"),
                        (f"{job}-hook", "1"),
                    }
                    # one deliverer: its endpoint ok, the two standbys idle
                    states = await query(client, base, "sum by (state) (ingestion_webhook_endpoint_state)")
                    assert {s["metric"]["state"]: s["value"][1] for s in states} == {
                        "idle": "2",
                        "ok": "1",
                        "failing": "0",
                        "disabled": "0",
                        "paused": "0",
                    }
            finally:
                process.terminate()
                with trio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
            assert not missing, f"panels without series: {sorted(missing)}"
        outer.cancel_scope.cancel()
    assert receiver.records(), "the webhook job delivered nothing"
