"""The events API's CPU per ``getEvents`` answer, two builds side by side in one run: the
machine is shared and noisy, so this counts the API process's own CPU seconds (``/proc/PID/stat``),
not wall time, over a fixed mix of requests (benchmarks/api_scale's four kinds, round-robin), sent
to the two processes in alternating chunks so that both see the same load.

``--before DIR`` is a source tree of the other build (e.g. ``git archive REV | tar -x -C DIR``);
it runs with this venv. Without it, only this tree's API is measured. ``--before-env`` and
``--after-env`` (``NAME=VALUE``, repeatable) set a build's environment, e.g. ``PSYCOPG_IMPL=python``.

    python -m benchmarks.api_cpu [--before DIR] [--requests 2000] [--clients 4] [--chunk 100]
        [--before-env NAME=VALUE] [--after-env NAME=VALUE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from benchmarks import api_store
from benchmarks.api_scale import Client, cpu_seconds, probes, start_api, uptime
from benchmarks.api_store import Shape


def chunk(port: int, requests: list[dict[str, Any]], clients: int) -> None:
    """``requests`` posted by ``clients`` threads at once (each its own keep-alive connection)."""

    def run(offset: int) -> None:
        client = Client(port)
        for params in requests[offset::clients]:
            body = client.call("getEvents", params)
            if b'"error"' in body[:40]:
                raise RuntimeError(body[:200])
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(
    before: Path | None,
    requests: int,
    clients: int,
    size: int,
    envs: dict[str, dict[str, str]] | None = None,
    log: Any = print,
) -> dict[str, Any]:
    shape = Shape()
    pg, _ = api_store.open_store(shape, log=log)
    logs = Path(tempfile.mkdtemp(prefix="api-cpu-log-"))
    builds = {"after": Path(__file__).resolve().parent.parent}
    if before is not None:
        builds = {"before": before.resolve(), **builds}
    apis: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name, source in builds.items():
            apis[name] = start_api(pg.url, shape, logs / f"{name}.log", source, (envs or {}).get(name))
        health = Client(next(iter(apis.values()))[1]).result("getHealth")
        kinds = probes(shape, int(health["oldestLedger"]), int(health["latestLedger"]), 100)
        mixed = [p.params for group in zip(*kinds.values(), strict=True) for p in group]
        for _, port in apis.values():  # warm: connections, caches, the store's pages
            chunk(port, mixed, clients)
        used = dict.fromkeys(apis, 0.0)
        load_before = uptime()
        for n in range(0, requests, size):
            part = [mixed[(n + k) % len(mixed)] for k in range(size)]
            order = list(apis) if (n // size) % 2 == 0 else list(reversed(apis))
            for name in order:
                process, port = apis[name]
                t = cpu_seconds(process.pid)
                chunk(port, part, clients)
                used[name] += cpu_seconds(process.pid) - t
        load_after = uptime()
    finally:
        for process, _ in apis.values():
            process.terminate()
            process.wait(10)
        pg.stop()
    return {
        "requests": requests, "clients": clients, "chunk": size, "env": envs or {},
        "cpu_ms_per_request": {name: round(1000 * s / requests, 3) for name, s in used.items()},
        "load_before": load_before, "load_after": load_after,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_cpu")
    p.add_argument("--before", type=Path, help="the other build's source tree")
    p.add_argument("--requests", type=int, default=2000, help="requests to each build")
    p.add_argument("--clients", type=int, default=4, help="concurrent keep-alive connections")
    p.add_argument("--chunk", type=int, default=100, help="requests to one build before the other's turn")
    p.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    envs = {
        name: dict(pair.split("=", 1) for pair in pairs)
        for name, pairs in (("before", args.before_env), ("after", args.after_env))
        if pairs
    }
    print(json.dumps(measure(args.before, args.requests, args.clients, args.chunk, envs), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
