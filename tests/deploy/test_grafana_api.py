"""deploy/grafana/events-api.json, the events API's dashboard (issue 48, "Operable"): it shows
requests by method and outcome, latency, subscribers and the window served; every query is PromQL
that promtool accepts, and queries only metrics the API serves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.support.deploy import DEPLOY, require_tool, unknown_metrics

DASHBOARD = DEPLOY / "grafana" / "events-api.json"
# What issue 48 asks to see: requests by method and outcome, latency, subscribers, the window.
REQUIRED = (
    "ingestion_api_requests_total", "ingestion_api_request_seconds_bucket", "ingestion_api_subscribers",
    "ingestion_api_oldest_ledger", "ingestion_api_latest_ledger",
)  # fmt: skip


def panel_queries() -> dict[str, str]:
    board = json.loads(DASHBOARD.read_text())
    return {f"{p['title']} ({t['refId']})": t["expr"] for p in board["panels"] for t in p.get("targets", [])}


def test_the_dashboard_shows_what_issue_48_asks_for_and_only_metrics_the_api_serves() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = " ".join(panel_queries().values())
    assert all(metric in exprs for metric in REQUIRED)
    assert not unknown_metrics(exprs)


def test_promtool_accepts_every_panel_query(tmp_path: Path) -> None:
    queries = list(panel_queries().values())
    rules = [{"record": f"panel:query_{n}", "expr": expr} for n, expr in enumerate(queries)]
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run(
        [require_tool("promtool", "prometheus"), "check", "rules", "panels.yml"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout
