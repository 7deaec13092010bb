"""A node as an operator runs it: a real process, real Redis, the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

from ingestion.local_redis import LocalRedis
from ingestion.simulator import SimulatorConfig, open_simulator


async def test_a_horizon_error_retrying_cannot_fix_stops_the_node_with_status_1(
    redis_server: LocalRedis, job: str
) -> None:
    async with open_simulator(SimulatorConfig(ledger_interval=None, history_ledgers=2)) as sim:
        args = [
            sys.executable, "-m", "ingestion", "--node-id", "n1", "--job", job,
            "--redis", redis_server.url, "--horizon", sim.url,
            "--resource", f"/transactions/{'ab' * 32}/operations",
            "--start-cursor", "0", "--log-format", "json",
        ]  # fmt: skip
        with trio.fail_after(30):
            done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    lines = [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]
    events = [e["event"] for e in lines]
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    assert "became-leader" in events and "horizon-fatal" in events
    fatal = next(e for e in lines if e["event"] == "horizon-fatal")
    assert "404" in fatal["error"] and "--resource" in fatal["error"]
    stopped = lines[-1]
    assert stopped["event"] == "node-stopped" and stopped["reason"] == "ingestion-fatal"
    assert "Traceback" not in done.stderr.decode()
    lost = next(e for e in lines if e["event"] == "lost-leadership")
    assert lost["reason"] == "released"


def test_usage_errors_exit_2_with_one_line_per_problem() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", "--lease-ttl-ms", "10", "--redis", "http://x"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 2
    problems = done.stderr.strip().splitlines()
    assert len(problems) == 2
    assert any("lease.ttl_ms" in p for p in problems) and any("redis.url" in p for p in problems)
