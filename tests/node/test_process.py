"""A node as an operator runs it: a real process, real Redis, the simulator."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
import trio

from actors.lease_store import job_keys
from ingestion.simulator import SimulatorConfig, open_simulator
from ingestion.testing.local_redis import LocalRedis


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


async def test_one_process_hosts_several_jobs_and_a_job_that_fails_stops_alone(
    redis_server: LocalRedis, job: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[jobs.{job}-tick]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 50\n'
    )
    names = {"ops": f"{job}-ops", "pays": f"{job}-pays", "broken": f"{job}-broken", "tick": f"{job}-tick"}
    async with open_simulator(SimulatorConfig(ledger_interval=0.1, history_ledgers=5)) as sim:
        args = [
            sys.executable, "-m", "ingestion", "--config", str(config), "--node-id", "n1",
            "--job", f"{names['ops']}=/operations", "--job", f"{names['pays']}=/payments",
            "--job", f"{names['broken']}=/transactions/{'ab' * 32}/operations",
            "--job", names["tick"],
            "--redis", redis_server.url, "--horizon", sim.url, "--start-cursor", "0",
            "--log-format", "json", "--lease-ttl-ms", "1500",
        ]  # fmt: skip
        proc = await trio.lowlevel.open_process(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines: list[dict[str, Any]] = []
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)

        async def read_lines() -> None:
            assert proc.stdout is not None
            buffer = b""
            while chunk := await proc.stdout.receive_some():
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                lines.extend(json.loads(x) for x in complete if x.startswith(b"{"))

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_lines)
                with trio.fail_after(30):
                    while True:
                        stopped = [e for e in lines if e["event"] == "job-stopped"]
                        counts = {k: client.xlen(job_keys(n)["events"]) for k, n in names.items()}
                        if stopped and counts["ops"] > 50 and counts["pays"] > 5 and counts["tick"] > 3:
                            break
                        await trio.sleep(0.1)
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    status = await proc.wait()
        finally:
            proc.kill()
    assert status == 0
    assert [e["job"] for e in lines if e["event"] == "job-stopped"] == [names["broken"]]
    leaders = {e["job"] for e in lines if e["event"] == "became-leader"}
    assert leaders == set(names.values())
    for e in lines:
        if e["event"] in ("became-leader", "lost-leadership", "lease-released", "job-stopped"):
            assert e["job"] in names.values() and e["node"] == "n1", e
    settled = [e for e in lines if e["event"] == "process-heap-settled"]  # (ingestion/node/heap.py)
    assert len(settled) == 1 and settled[0]["frozen"] > 10_000, settled
    released = {e["job"] for e in lines if e["event"] == "lost-leadership" and e["reason"] == "shutdown"}
    assert released == set(names.values()) - {names["broken"]}
    runs = [json.loads(f["record"]) for _id, f in client.xrange(job_keys(names["tick"])["events"])]
    assert [r["run"] for r in runs] == list(range(1, len(runs) + 1))


def test_a_job_named_twice_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", "--job", "a=/payments", "--job", "b", "--job", "a"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "ingestion: configuration error: node.job: job 'a' is given twice"
