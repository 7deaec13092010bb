"""How fast the simulator's Stellar RPC serves ``getEvents``: events per second while paging a history.

``python -m benchmarks.rpc_events [--ledgers 2000] [--ops-per-ledger 20] [--limit 1000] [--passes 3]``

Runs the simulator as its own process (``--rpc-port 0``), then pages every event of its history
from the oldest ledger with a cursor chain at ``limit`` per request, ``passes`` times. The first
pass builds each ledger (the chain's Horizon records, then the events derived from them); later
passes are served from the event cache. Prints one JSON line per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def page_everything(client: httpx.Client, url: str, start: int, limit: int) -> tuple[int, int]:
    """(events, requests) paging from ``start`` until a page comes back empty."""
    params: dict[str, object] = {"startLedger": start, "pagination": {"limit": limit}}
    total = requests = 0
    while True:
        body = {"jsonrpc": "2.0", "id": requests, "method": "getEvents", "params": params}
        result = client.post(url, json=body).json()["result"]
        requests += 1
        if not result["events"]:
            return total, requests
        total += len(result["events"])
        params = {"pagination": {"cursor": result["cursor"], "limit": limit}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rpc_events")
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--ops-per-ledger", type=int, default=20)
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args(argv)
    command = [
        sys.executable,
        "-m",
        "ingestion",
        "simulate",
        "--port",
        "0",
        "--rpc-port",
        "0",
        "--ledger-interval",
        "0",
        "--history-ledgers",
        str(args.ledgers),
        "--ops-per-ledger",
        str(args.ops_per_ledger),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(command, stdout=subprocess.PIPE, cwd=REPO, env=env) as proc:
        try:
            assert proc.stdout is not None
            url = json.loads(proc.stdout.readline())["rpc_url"]
            with httpx.Client(timeout=120) as client:
                health = client.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "getLatestLedger"})
                latest = health.json()["result"]["sequence"]
                start = latest - args.ledgers + 1
                for n in range(1, args.passes + 1):
                    began = time.perf_counter()
                    events, requests = page_everything(client, url, start, args.limit)
                    seconds = time.perf_counter() - began
                    line = {
                        "pass": n,
                        "ledgers": args.ledgers,
                        "ops_per_ledger": args.ops_per_ledger,
                        "limit": args.limit,
                        "events": events,
                        "requests": requests,
                        "seconds": round(seconds, 3),
                        "events_per_second": round(events / seconds),
                    }
                    print(json.dumps(line), flush=True)
        finally:
            proc.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
