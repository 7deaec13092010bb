"""The events API at scale (issue 48's acceptance): ``getEvents`` over HTTP against the bare SQL
query for the same page, side by side in one run, over the store of ``benchmarks/api_store.py``
(10 million events by default), and requests/s at ``limit = 100`` with concurrent clients.

Four kinds of request, each ``limit = 100``, drawn by a seeded generator:

- ``newest``: the newest page, no filter, from ``latestLedger - 4`` (about 100 events);
- ``contract``: one contract over all history (``startLedger`` the oldest), the contract drawn
  log-uniformly by popularity rank from 20 to the last (from ~10^4 events down to a handful);
- ``wildcard``: ``[transfer, *, Address(account), **]`` (transfers to one account, SAC tokens'
  four topics and SEP-41 tokens' three) over all history, the account log-uniform by rank;
- ``rare``: a filter matching one event in a million over all history, alternately the rare
  contract (``contractIds``) and the rare verb (``[set_admin, **]``).

For each request, in turn (which goes first alternates): the API (``ingestion api``, its own
process, a keep-alive HTTP/1.1 connection, the body read whole) and the bare SQL on
``api_events`` (psycopg, one connection, the rows fetched): the minimal query for the page on the
index that serves it, hand-written here, not taken from the API's planner. The two must return
the same event ids. Then throughput: ``--clients`` threads in each of two client processes for
``--seconds``, the four kinds round-robin.

    python -m benchmarks.api_scale [--events N] [--requests 200] [--clients 8] [--seconds 20]
        [--api-processes 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import orjson
import psycopg

from benchmarks import api_store
from benchmarks.api_store import Shape
from benchmarks.procs import percentile
from ingestion.rpc.protocol import Cursor
from ingestion.testing.local_redis import free_port

KINDS = ("newest", "contract", "wildcard", "rare")
LIMIT = 100
NEWEST_SPAN = 4


@attrs.frozen
class Probe:
    """One request: its ``getEvents`` params and the bare SQL for the same page."""

    kind: str
    params: dict[str, Any]
    sql: str
    args: tuple[Any, ...]


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high - 1, int(math.exp(rng.uniform(math.log(low), math.log(high)))))


def probes(shape: Shape, oldest: int, latest: int, count: int, seed: int = 1) -> dict[str, list[Probe]]:
    """``count`` requests of each kind (see the module's docstring)."""
    rng = random.Random(seed)
    q = f'"{shape.schema}"'
    high = str(Cursor(latest + 1))
    page = f"ORDER BY id LIMIT {LIMIT}"
    base = f"SELECT id, record FROM {q}.api_events WHERE view = %s AND id >= %s AND id < %s"
    out: dict[str, list[Probe]] = {kind: [] for kind in KINDS}
    transfer = api_store.symbol("transfer")
    start, everything = latest - NEWEST_SPAN, str(Cursor(oldest))
    rare_verb = api_store.symbol(api_store.RARE_VERB)
    for n in range(count):
        newest = {"startLedger": start, "pagination": {"limit": LIMIT}}
        out["newest"].append(Probe("newest", newest, f"{base} {page}", (shape.job, str(Cursor(start)), high)))
        contract = api_store.contract_id(shape, _log_uniform(rng, 20, shape.contracts))
        one = {"startLedger": oldest, "filters": [{"type": "contract", "contractIds": [contract]}]}
        sql = f"{base} AND contract_id = %s {page}"
        out["contract"].append(Probe("contract", one | {"pagination": {"limit": LIMIT}}, sql,
                                     (shape.job, everything, high, contract)))  # fmt: skip
        rank = _log_uniform(rng, 10, shape.accounts)
        account = api_store.account_address(api_store.account_key(shape, rank))
        wildcard = {"startLedger": oldest, "filters": [{"topics": [[transfer, "*", account, "**"]]}]}
        sql = f"{base} AND topic3 = %s AND topic1 = %s AND topic_count >= 3 {page}"
        out["wildcard"].append(Probe("wildcard", wildcard | {"pagination": {"limit": LIMIT}}, sql,
                                     (shape.job, everything, high, account, transfer)))  # fmt: skip
        if n % 2 == 0:
            rare: dict[str, Any] = {"contractIds": [shape.rare_contract]}
            sql, arg = f"{base} AND contract_id = %s {page}", shape.rare_contract
        else:
            rare = {"topics": [[rare_verb, "**"]]}
            sql, arg = f"{base} AND topic1 = %s AND topic_count >= 1 {page}", rare_verb
        params = {"startLedger": oldest, "filters": [rare], "pagination": {"limit": LIMIT}}
        out["rare"].append(Probe("rare", params, sql, (shape.job, everything, high, arg)))
    return out


# -- the API over HTTP ---------------------------------------------------------------------------------


class Client:
    """A keep-alive HTTP/1.1 connection to the API: ``call`` posts one JSON-RPC request."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
        self.conn.request("POST", "/", body, {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method}: HTTP {response.status}: {data[:200]!r}")
        return data

    def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        answer = orjson.loads(self.call(method, params))
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def close(self) -> None:
        self.conn.close()


def start_api(
    url: str, shape: Shape, log_path: Path, source: Path | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``ingestion api`` reading ``url``, on a free port, once it answers ``getHealth``; from the
    tree at ``source`` (first on ``PYTHONPATH``: another build, side by side) with ``env`` added."""
    port = free_port()
    config = Path(tempfile.mkdtemp(prefix="api-scale-")) / "config.toml"
    config.write_text(
        f'[api]\njob = "{shape.job}"\nport = {port}\nlisten_host = "127.0.0.1"\nread_url = "{url}"\n'
        f'max_limit = 10000\n\n[sink]\nurl = "{url}"\nschema = "{shape.schema}"\n\n[log]\nlevel = "warning"\n'
    )
    environment = {**os.environ, **({"PYTHONPATH": str(source)} if source else {}), **(env or {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ingestion", "api", "--config", str(config)],
            stdout=log, stderr=log, env=environment, cwd=source,
        )  # fmt: skip
    end = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"ingestion api exited {process.returncode}: {log_path.read_text()[-2000:]}")
        try:
            client = Client(port)
            client.result("getHealth")
            client.close()
            return process, port
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > end:
                process.kill()
                raise
            time.sleep(0.1)


def _ids(body: bytes) -> list[str]:
    answer = orjson.loads(body)
    if "error" in answer:
        raise RuntimeError(f"getEvents: {answer['error']}")
    return [e["id"] for e in answer["result"]["events"]]


def side_by_side(port: int, url: str, kinds: dict[str, list[Probe]]) -> dict[str, Any]:
    """Each probe through the API and as bare SQL, alternating which goes first; p50/p99 of each
    and their ratio, per kind."""
    client = Client(port)
    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for kind, probes_ in kinds.items():
            api_ms: list[float] = []
            sql_ms: list[float] = []
            events: list[int] = []
            for n, probe in enumerate(probes_ * 2):  # the first pass warms, the second counts
                if n % 2:
                    (sql_ids, sql_t), (api_ids, api_t) = _via_sql(conn, probe), _via_api(client, probe)
                else:
                    (api_ids, api_t), (sql_ids, sql_t) = _via_api(client, probe), _via_sql(conn, probe)
                if api_ids != sql_ids:
                    raise AssertionError(f"{kind} {probe.params}: API {api_ids[:3]}..., SQL {sql_ids[:3]}...")
                if n >= len(probes_):
                    api_ms.append(api_t)
                    sql_ms.append(sql_t)
                    events.append(len(api_ids))
            figures = _figures(api_ms, sql_ms)
            out[kind] = {**figures, "events_p50": percentile(events, 50), "requests": len(api_ms)}
    client.close()
    return out


def _via_api(client: Client, probe: Probe) -> tuple[list[str], float]:
    t = time.perf_counter()
    ids = _ids(client.call("getEvents", probe.params))
    return ids, (time.perf_counter() - t) * 1000


def _via_sql(conn: psycopg.Connection[Any], probe: Probe) -> tuple[list[str], float]:
    t = time.perf_counter()
    rows = conn.execute(probe.sql, probe.args).fetchall()  # type: ignore[arg-type]
    return [str(r[0]) for r in rows], (time.perf_counter() - t) * 1000


def _figures(api_ms: list[float], sql_ms: list[float]) -> dict[str, Any]:
    api50, api99 = percentile(api_ms, 50), percentile(api_ms, 99)
    sql50, sql99 = percentile(sql_ms, 50), percentile(sql_ms, 99)
    return {
        "api_p50_ms": round(api50, 2), "api_p99_ms": round(api99, 2),
        "sql_p50_ms": round(sql50, 2), "sql_p99_ms": round(sql99, 2),
        "ratio_p50": round(api50 / sql50, 2), "ratio_p99": round(api99 / sql99, 2),
    }  # fmt: skip


# -- throughput ----------------------------------------------------------------------------------------


def _flood(args: tuple[list[int], list[dict[str, Any]], int, float]) -> tuple[int, int, list[float]]:
    """One client process: ``clients`` threads (thread i on ``ports[i % len(ports)]``) posting the
    requests round-robin until ``seconds`` pass. Returns (answered, errors, latencies in ms)."""
    ports, requests, clients, seconds = args
    answered, errors, latencies = [0], [0], []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def run(offset: int) -> None:
        port = ports[offset % len(ports)]
        client = Client(port)
        n = offset
        ok = bad = 0
        mine: list[float] = []
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                body = client.call("getEvents", requests[n % len(requests)])
                if b'"error"' in body[:40]:
                    bad += 1
                else:
                    ok += 1
                    mine.append((time.perf_counter() - t) * 1000)
            except (OSError, http.client.HTTPException, RuntimeError):
                bad += 1
                client.close()
                client = Client(port)
            n += clients
        client.close()
        with lock:
            answered[0] += ok
            errors[0] += bad
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answered[0], errors[0], latencies


def throughput(
    ports: list[int], kinds: dict[str, list[Probe]], clients: int, seconds: float, processes: int = 2
) -> dict[str, Any]:
    """Requests/s of the four kinds round-robin, ``clients`` threads in each of ``processes``,
    spread over the API processes at ``ports``."""
    mixed = [p.params for group in zip(*kinds.values(), strict=True) for p in group]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        started = time.monotonic()
        results = pool.map(_flood, [(ports, mixed[i::processes], clients, seconds) for i in range(processes)])
        elapsed = time.monotonic() - started
    answered = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[2]]
    return {
        "answered": answered,
        "clients": clients * processes,
        "seconds": round(elapsed, 1),
        "requests_per_s": round(answered / seconds, 1),
        "errors": sum(r[1] for r in results),
        "p50_ms": round(percentile(latencies, 50), 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 2) if latencies else None,
    }


def bare_sql(url: str, kinds: dict[str, list[Probe]]) -> dict[str, Any]:
    """The bare SQL alone (before the API can serve): p50/p99 per kind, and each kind's plan."""
    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for kind, probes_ in kinds.items():
            ms: list[float] = []
            for n, probe in enumerate(probes_ * 2):
                t = time.perf_counter()
                conn.execute(probe.sql, probe.args).fetchall()  # type: ignore[arg-type]
                if n >= len(probes_):
                    ms.append((time.perf_counter() - t) * 1000)
            plan = conn.execute("EXPLAIN " + probes_[0].sql, probes_[0].args).fetchall()  # type: ignore[arg-type, operator]
            out[kind] = {
                "sql_p50_ms": round(percentile(ms, 50), 2), "sql_p99_ms": round(percentile(ms, 99), 2),
                "plan": " / ".join(str(r[0]).strip() for r in plan[:3]),
            }  # fmt: skip
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def measure(
    shape: Shape,
    requests: int,
    clients: int,
    seconds: float,
    *,
    api_processes: int = 1,
    sql_only: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    pg, generated = api_store.open_store(shape, log=log)
    try:
        projected = api_store.ensure_projected(pg, shape, log=log)
        if sql_only:
            with psycopg.connect(pg.url) as conn:
                q = f'"{shape.schema}"'
                row = conn.execute(f"SELECT min(ledger), max(ledger) FROM {q}.api_events").fetchone()
            assert row is not None
            kinds = probes(shape, int(row[0]), int(row[1]), requests)
            load_before = uptime()
            return {"events": shape.events, "generated": generated, "api_store": projected,
                    "window": list(row), "bare_sql": bare_sql(pg.url, kinds), "load_before": load_before,
                    "load_after": uptime()}  # fmt: skip
        logs = Path(tempfile.mkdtemp(prefix="api-scale-log-"))
        apis = [start_api(pg.url, shape, logs / f"api-{n}.log") for n in range(api_processes)]
        port = apis[0][1]
        try:
            health = Client(port).result("getHealth")
            oldest, latest = int(health["oldestLedger"]), int(health["latestLedger"])
            kinds = probes(shape, oldest, latest, requests)
            load_before = uptime()
            latency = side_by_side(port, pg.url, kinds)
            used = sum(cpu_seconds(process.pid) for process, _ in apis)
            rate = throughput([p for _, p in apis], kinds, clients, seconds)
            used = sum(cpu_seconds(process.pid) for process, _ in apis) - used
            # the API processes' own CPU per answer: what bounds a process's rate, whatever the load
            rate["api_cpu_ms_per_request"] = round(1000 * used / max(1, rate["answered"]), 2)
            rate["api_processes"] = api_processes
            load_after = uptime()
        finally:
            for process, _ in apis:
                process.terminate()
                process.wait(10)
    finally:
        pg.stop()
    return {
        "events": shape.events, "generated": generated, "api_store": projected,
        "window": [oldest, latest], "latency": latency, "throughput": rate,
        "load_before": load_before, "load_after": load_after, "cpus": os.cpu_count(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.api_scale")
    p.add_argument("--events", type=int, default=Shape().events)
    p.add_argument("--requests", type=int, default=200, help="requests of each kind, side by side")
    p.add_argument("--clients", type=int, default=8, help="threads in each of the two client processes")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--api-processes", type=int, default=1, help="ingestion api processes the clients share")
    p.add_argument("--sql-only", action="store_true", help="the bare SQL alone")
    args = p.parse_args(argv)
    shape = Shape(events=args.events)
    result = measure(shape, args.requests, args.clients, args.seconds, api_processes=args.api_processes,
                     sql_only=args.sql_only)  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
