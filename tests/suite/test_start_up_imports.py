"""What ``ingestion run`` loads before its first look at a stop signal and until it forks its
worker: what every node needs, and no library that only some nodes use. PostgreSQL's driver (a
PostgreSQL sink), the status WebSocket's (``observe.status_port``) and Prometheus's client
(``observe.metrics_port``) are imported where they are used: together about 0.15 s of a loaded
machine's start-up, and tests/cli/test_cli.py bounds a stop right after spawn at 2 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Loaded only by the nodes that use them (each import says so where it is).
NOT_AT_START = ("psycopg", "trio_websocket", "prometheus_client", "ingestion.api", "ingestion.postgres")

# ingestion/cli/run.py's main() up to the fork, without the questions to Redis: the modules it
# imports, the settings read as a node reads them, every job's source built once.
START = """
import json, sys
from ingestion.cli.run import check_source_flags, load_settings, parser
from ingestion.node import parent
from ingestion.node.preflight import check_sources
from ingestion.node.worker import start_node
ns = parser().parse_args(sys.argv[1:])
settings = load_settings(ns)
check_source_flags(ns, settings)
check_sources(settings)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_at_start(*flags: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", START, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in NOT_AT_START))


def test_a_node_without_postgresql_metrics_status_or_api_loads_none_of_their_libraries() -> None:
    assert heavy(loaded_at_start("--job", "j")) == []


def test_the_check_names_a_library_and_its_submodules_only() -> None:
    loaded = {"psycopg.pq", "trio", "trio_websockets", "ingestion.api.service", "ingestion.apis"}
    assert heavy(loaded) == ["ingestion.api.service", "psycopg.pq"]
