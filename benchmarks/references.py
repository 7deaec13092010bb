"""The two no-commit references for catch-up throughput, each run as its own process.

``python -m benchmarks.references sdk URL N`` streams ``N`` operations from cursor 0 with the official
Stellar Python SDK (``Server(url).operations().cursor("0").stream()``, synchronous); ``paged`` does a
bare paged fetch (httpx, ``limit=200``, ``json.loads`` of each page, nothing else); ``sse-warm``
reads ``N`` records off the SSE stream without parsing them (used only to warm the simulator).
Each prints one JSON line: ``{"records": n, "seconds": s, "cpu_seconds": c}`` (``c``: the CPU
this process used in the timed part, user + system: the interpreter's start-up left out).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx
from stellar_sdk import Server


def paged(url: str, count: int, deadline: float) -> int:
    n = 0
    cursor = "0"
    with httpx.Client(timeout=30) as client:
        while n < count and time.monotonic() < deadline:
            r = client.get(f"{url}/operations", params={"order": "asc", "limit": "200", "cursor": cursor})
            r.raise_for_status()
            records = json.loads(r.content)["_embedded"]["records"]
            if not records:
                break
            n += len(records)
            cursor = records[-1]["paging_token"]
    return n


def sdk(url: str, count: int, deadline: float) -> int:
    n = 0
    server = Server(horizon_url=url)
    # limit(200): a real Horizon closes a stream after `limit` events (10 by default).
    for _record in server.operations().cursor("0").limit(200).stream():
        n += 1
        if n >= count or time.monotonic() >= deadline:
            break
    return n


def sse_warm(url: str, count: int, deadline: float) -> int:
    n = 0
    try:
        n = _read_sse(httpx, url, count, deadline)
    except httpx.HTTPError:
        pass  # only a warm-up: whatever was read is warm
    return n


def _read_sse(httpx: Any, url: str, count: int, deadline: float) -> int:
    n = 0
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "GET",
            f"{url}/operations",
            params={"order": "asc", "cursor": "0"},
            headers={"Accept": "text/event-stream"},
        ) as response,
    ):
        for chunk in response.iter_bytes():
            n += chunk.count(b"\nid: ") + chunk.startswith(b"id: ")
            if n >= count or time.monotonic() >= deadline:
                break
    return n


def main(argv: list[str]) -> int:
    kind, url, count = argv[0], argv[1], int(argv[2])
    limit = float(argv[3]) if len(argv) > 3 else 300.0
    run = {"sdk": sdk, "paged": paged, "sse-warm": sse_warm}[kind]
    # The client's library is imported before the clock starts, as a node has imported its own
    # before it leads (importing httpx is about 0.12 s, 6 % of a 100,000-record bare fetch).
    __import__("stellar_sdk" if kind == "sdk" else "httpx")
    started, cpu = time.monotonic(), time.process_time()
    n = run(url, count, started + limit)
    seconds, cpu = time.monotonic() - started, time.process_time() - cpu
    print(json.dumps({"records": n, "seconds": seconds, "cpu_seconds": cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
