"""``ingestion api`` as operators run it: its own process, read-only, never elected (its config
names a Redis that does not exist: it never asks it), stopped by SIGTERM with exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import free_port
from ingestion.testing.wait import wait_until


async def test_the_api_runs_on_its_own_and_stops_cleanly(
    pg: LocalPostgres, view: str, tmp_path: Path
) -> None:
    port, nowhere = free_port(), free_port()
    config = tmp_path / "api.toml"
    config.write_text(
        f'[redis]\nurl = "redis://127.0.0.1:{nowhere}/0"\n[sink]\nurl = "{pg.url}"\n'
        f'[api]\njob = "{view}"\nlisten_host = "127.0.0.1"\n'
    )
    argv = [sys.executable, "-m", "ingestion", "api", "--config", str(config), "--port", str(port)]
    process = await trio.to_thread.run_sync(
        lambda: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    )
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "getHealth"}

        def healthy() -> dict[str, object] | None:
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/", json=body, timeout=2).json()
            except httpx.HTTPError:
                return None
            return answer.get("result")  # type: ignore[no-any-return]

        result = await wait_until(healthy, 20, what="ingestion api answering getHealth")
        assert result == {
            "status": "healthy",
            "latestLedger": 300,
            "oldestLedger": 1,
            "ledgerRetentionWindow": 300,
        }
        async with httpx.AsyncClient(timeout=2) as client:
            metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        assert 'ingestion_api_requests_total{method="getHealth",outcome="ok"}' in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=10)
    assert process.returncode == 0, out.decode()
    assert b"api-listening" in out and b"Traceback" not in out
    assert b"process-heap-settled" in out  # serving, its start-up heap frozen (ingestion/node/heap.py)


def test_a_port_is_needed(tmp_path: Path) -> None:
    config = tmp_path / "api.toml"
    config.write_text('[sink]\nurl = "postgresql://127.0.0.1:1/x"\n[api]\njob = "j"\n')
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", "api", "--config", str(config)], capture_output=True, timeout=30
    )
    assert done.returncode == 2 and b"no port" in done.stderr


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
