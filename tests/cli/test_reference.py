"""docs/REFERENCE.md is generated from the code (``ingestion/cli/reference.py``) and kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingestion.cli import reference

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "REFERENCE.md"


def test_docs_reference_is_current() -> None:
    assert REFERENCE.read_text() == reference.render(), (
        f"docs/REFERENCE.md is stale: refresh it with `{reference.REFRESH}` and commit it"
    )


def test_the_generator_runs_as_a_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ingestion.cli.reference"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == reference.render()


def test_log_events_are_found_in_every_form_a_node_logs_them() -> None:
    events = reference.log_events()
    assert events["became-leader"]["levels"] == {"info"}  # self.log.info(...) in an actor
    assert "actors/cursor_writer.py" in events["fencing-token-rejected"]["where"]
    assert "ingestion/rpc/follower.py" in events["rpc-stale"]["where"]  # a pure core's Note(...)
    assert {"url", "to_url"} <= events["rpc-stale"]["fields"]
    assert events["history-gap"]["levels"] == {"warning", "error"}
    assert "replication" not in events  # pipe.info("replication") is a Redis command, not a log


def test_every_redis_key_and_metric_is_listed() -> None:
    from actors.lease_store.keys import NODE_REGISTRY_KEY, job_keys
    from ingestion.common import keyspace

    text = reference.render()
    everything = [*job_keys("J").values(), NODE_REGISTRY_KEY, *keyspace.webhook_keys("J").values(),
                  *keyspace.watch_keys("J").values(), keyspace.backfill_key("J"),
                  *keyspace.audit_keys("J").values(), keyspace.PRESENCE_KEY, keyspace.PRESENCE_CHANNEL,
                  keyspace.instance_key("ID")]  # fmt: skip
    rows = [line for line in text.splitlines() if line.startswith("| `ingestion:")]
    for key in everything:  # each in the one table, once
        assert len([row for row in rows if row.startswith(f"| `{key}` |")]) == 1, key
    assert len(rows) == len(everything) + 2  # (and the runtime's node hosts and deployment keys)
    names = {name for name, _, _, _ in reference.metric_families()}
    assert {"ingestion_leader", "ingestion_commits_total", "ingestion_commit_latency_seconds",
            "ingestion_redis_up", "ingestion_consumer_group_lag_entries"} <= names  # fmt: skip
    labels = {name: labels for name, _, labels, _ in reference.metric_families()}
    assert labels["ingestion_consumer_group_lag_entries"] == ["ingestion_job", "group"]
    # the webhook jobs' own collector (deploy/prometheus and deploy/grafana query these)
    assert labels["ingestion_webhook_delivered_total"] == ["ingestion_job"]
    # the audit jobs' (ingestion/audit/metrics.py; deploy/prometheus alerts on the findings)
    assert labels["ingestion_audit_ledger"] == ["ingestion_job"]
    assert labels["ingestion_audit_findings_total"] == ["ingestion_job", "kind"]
    assert labels["ingestion_webhook_attempts_total"] == ["ingestion_job", "outcome"]
    assert labels["ingestion_webhook_dead_letters_total"] == ["ingestion_job"]
    assert labels["ingestion_webhook_lag_seconds"] == ["ingestion_job"]
    assert labels["ingestion_webhook_endpoint_state"] == ["ingestion_job", "state"]


def test_a_key_without_a_meaning_stops_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from ingestion.common import keyspace

    monkeypatch.delitem(keyspace.APP_KEY_MEANINGS, "requests")
    with pytest.raises(SystemExit, match="requests"):
        reference.render()
