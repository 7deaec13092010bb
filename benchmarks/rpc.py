"""Stellar RPC jobs: catching up a whole retention window, and ledger close -> committed at the tip.

Catch-up. The simulator runs as its own process with ``--rpc-port 0`` and a history exactly as long
as its retention window (``--history-ledgers N --retention-ledgers N``), no live ledgers. A plain
client first pages every event twice (the first pass builds the chain; the second is the server's
warm speed, the ceiling for anyone); then a node (``--source rpc --start-cursor 0``) follows the
job from the oldest ledger until its committed cursor is the scanned-through cursor of the latest
ledger, once per page limit. Figures: events per second (from ``became-leader`` to done), the
``getEvents`` requests the node sent (the simulator counts them), and the ratio to the plain warm
pass measured in the same run.

Tip latency. Another simulator closes a ledger every ``interval`` seconds. The harness asks the
RPC's ``getLatestLedger`` every 5 ms to note when each ledger appears, and reads the job's cursor
in Redis every 5 ms to note when it reaches that ledger's scanned-through cursor: the difference
is ledger close -> committed (events and cursor in one fenced commit). Also counted: the node's
``getEvents`` requests per ledger (it waits for the next close instead of polling in a loop).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import redis

from actors.lease_store import job_keys
from benchmarks.procs import cpu_line, cpu_snapshot, cpu_usage, memory_kib, percentile, redis_pid
from ingestion.rpc.protocol import Cursor
from ingestion.testing.launch import simulator_command
from ingestion.testing.processes import NodeProcess, _readline_within, stop_process


@attrs.define
class RpcSimulator:
    process: subprocess.Popen[bytes]
    rpc: str

    @classmethod
    def start(cls, *args: str) -> RpcSimulator:
        command = simulator_command(rpc=True, extra=["--rpc-max-healthy-latency", "0", *args])
        proc = subprocess.Popen(command, stdout=subprocess.PIPE)
        line = _readline_within(proc, 300)
        try:
            return cls(proc, json.loads(line)["rpc_url"])
        except (ValueError, KeyError):
            proc.kill()
            proc.wait()
            raise RuntimeError(f"simulator did not start: {line!r}") from None

    def call(self, http: httpx.Client, method: str, params: Any = None) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            body["params"] = params
        doc = http.post(self.rpc, json=body).json()
        if "error" in doc:
            raise RuntimeError(f"{method}: {doc['error']}")
        return doc["result"]

    def requests(self, http: httpx.Client) -> int:
        counts = http.get(f"{self.rpc}/_simulator/requests").json()
        return int(counts["methods"].get("getEvents", 0))

    def stop(self) -> None:
        stop_process(self.process)


def _page_everything(sim: RpcSimulator, http: httpx.Client, start: int, limit: int) -> tuple[int, float]:
    """(events, seconds) for a plain cursor chain from ``start`` to the latest ledger."""
    began = time.perf_counter()
    params: dict[str, Any] = {"startLedger": start, "pagination": {"limit": limit}}
    total = 0
    while True:
        result = sim.call(http, "getEvents", params)
        total += len(result["events"])
        if Cursor.parse(result["cursor"]).ledger >= int(result["latestLedger"]) and not (
            len(result["events"]) == limit
        ):
            return total, time.perf_counter() - began
        params = {"pagination": {"cursor": result["cursor"], "limit": limit}}


def _cursor(client: redis.Redis, job: str) -> str | None:
    value = client.hget(job_keys(job)["cursor"], "cursor")
    return None if value is None else value.decode()


def catch_up(
    redis_url: str,
    *,
    ledgers: int,
    limits: tuple[int, ...],
    log: Any,
    delay_ms: int = 0,
    rounds: int = 1,
    profile: Callable[[int], Any] | None = None,
    decode: tuple[bool, ...] = (True,),
) -> dict[str, Any]:
    """``rounds``: each round is a plain warm pass, then the node, once per limit and per
    ``decode`` setting (the job's ``decode``: events' ScVals decoded and the transfer view added,
    or the events as RPC sent them); the best of each counts (a node's first pages can be slow on
    a noisy machine, and one plain pass is as exposed). ``profile(pid)``, when given, is started on
    the first round's node processes (a profiler with ``stop()``); what its ``stop()`` returns goes
    into the run's ``profile``. ``runs`` holds one best run per limit and setting, in that order."""
    sim = RpcSimulator.start(
        "--history-ledgers", str(ledgers), "--retention-ledgers", str(ledgers),
        "--ops-per-ledger", "20", "--ledger-interval", "0",
        "--cache-records", str(25 * ledgers + 60_000), "--response-delay-ms", str(delay_ms),
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    out: dict[str, Any] = {"ledgers": ledgers, "delay_ms": delay_ms, "rounds": rounds, "runs": []}
    try:
        with httpx.Client(timeout=300) as http:
            latest = int(sim.call(http, "getLatestLedger")["sequence"])
            oldest = latest - ledgers + 1
            events, cold = _page_everything(sim, http, oldest, 10_000)
            shared = {"simulator": sim.process.pid, "redis": redis_pid(client)}
            log(
                f"  {ledgers:,} ledgers, {events:,} events, {delay_ms} ms per answer: plain client "
                f"{events / cold:,.0f} events/s building the chain"
            )
            plain: list[tuple[float, dict[str, Any]]] = []

            def plain_pass() -> float:
                before, thread_cpu = cpu_snapshot(shared), time.thread_time()
                _, warm = _page_everything(sim, http, oldest, 10_000)
                # the plain client is this thread: its CPU is the thread's, not the harness's
                after = cpu_snapshot(shared)
                before["plain client"], after["plain client"] = 0.0, time.thread_time() - thread_cpu
                cpu = cpu_usage(before, after, wall=warm, records=events, bound_by="plain client")
                plain.append((events / warm, cpu))
                log(f"    plain client, warm: {events / warm:,.0f} events/s; {cpu_line(cpu)}")
                return events / warm

            done = str(Cursor.through(latest))
            for limit in limits:
                tries: dict[bool, list[dict[str, Any]]] = {d: [] for d in decode}
                for r in range(rounds):
                    plain_eps = plain_pass()
                    for d in decode:
                        run = _node_catch_up(
                            sim, http, client, redis_url, limit, events, done, shared,
                            profile if r == 0 else None, decode=d,
                        )  # fmt: skip
                        run["plain_eps"] = plain_eps
                        tries[d].append(run)
                        log(
                            f"  node, page limit {limit:>5}, decode {'on' if d else 'off'}, round {r + 1}: "
                            f"{run['eps']:,.0f} events/s ({run['seconds']:.2f} s, {run['requests']} "
                            f"getEvents requests; {run['eps'] / plain_eps:.2f}x this round's plain pass)"
                        )
                        log(f"    node: {cpu_line(run['cpu'])}")
                for d in decode:
                    best = max(tries[d], key=lambda t: t["eps"])
                    best["decode"] = d
                    best["rounds_eps"] = [{"node": t["eps"], "plain": t["plain_eps"]} for t in tries[d]]
                    if tries[d][0].get("profile") is not None:
                        best["profile"] = tries[d][0]["profile"]
                    out["runs"].append(best)
            best_plain, plain_cpu = max(plain, key=lambda p: p[0])
            out.update(
                events=events, bare_cold_eps=events / cold, bare_warm_eps=best_plain, plain_cpu=plain_cpu
            )
            for run in out["runs"]:
                run["ratio_bare_warm"] = run["eps"] / best_plain
                log(
                    f"  node, page limit {run['limit']:>5}, decode {'on' if run['decode'] else 'off'}, "
                    f"best of {rounds}: {run['eps']:,.0f} events/s, "
                    f"{run['ratio_bare_warm']:.2f}x the best plain warm pass ({best_plain:,.0f} events/s)"
                )
    finally:
        sim.stop()
        client.close()
    return out


def _node_catch_up(
    sim: RpcSimulator,
    http: httpx.Client,
    client: redis.Redis,
    redis_url: str,
    limit: int,
    events: int,
    done: str,
    shared: dict[str, int | None],
    profile: Callable[[int], Any] | None,
    decode: bool = True,
) -> dict[str, Any]:
    """One node process catching up the whole window from the oldest ledger, timed from
    ``became-leader`` to its committed cursor reaching ``done``; with ``decode`` off, the job's
    ``decode = false`` (a config file of one job table)."""
    job = f"bench-rpc-{limit}" + ("" if decode else "-raw")
    client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
    before = sim.requests(http)
    config = Path(tempfile.mkdtemp(prefix="bench-rpc-")) / "config.toml"
    config.write_text(f'[jobs."{job}"]\nkind = "rpc"\ndecode = {"true" if decode else "false"}\n')
    node = NodeProcess.start(
        f"rpc-{limit}", redis_url=redis_url, horizon=None, ttl_ms=5000,
        job=job, extra=["--source", "rpc", "--rpc", sim.rpc, "--config", str(config)],
        env={"INGESTION_RPC_PAGE_LIMIT": str(limit)},
    )  # fmt: skip
    spy = None
    try:
        node.event("became-leader", timeout=60)
        pid = node.worker_pid  # the process that runs the job (its peak RSS is the node's)
        spy = profile(pid) if profile is not None else None
        pids: dict[str, int | None] = {"node": pid, "node parent": node.pid, **shared}
        if getattr(spy, "proc", None) is not None:
            pids["py-spy"] = spy.proc.pid  # type: ignore[union-attr]
        cpu_before = cpu_snapshot(pids)
        began = time.monotonic()
        deadline = began + 600
        while _cursor(client, job) != done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"limit {limit}: not caught up in 600 s")
            time.sleep(0.005)
        seconds = time.monotonic() - began
        cpu = cpu_usage(cpu_before, cpu_snapshot(pids), wall=seconds, records=events, bound_by="node")
        top = spy.stop() if spy is not None else None
        peak = memory_kib(pid)["VmHWM"]
    finally:
        node.stop()
    stored = client.xlen(job_keys(job)["events"])
    client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
    if stored != events:
        raise RuntimeError(f"limit {limit}: {stored} events committed, expected {events}")
    run = {
        "limit": limit, "seconds": seconds, "eps": events / seconds,
        "requests": sim.requests(http) - before, "peak_rss_kib": peak, "cpu": cpu,
    }  # fmt: skip
    if top is not None:
        run["profile"] = top
    return run


def tip_latency(redis_url: str, *, ledgers: int, interval: float, log: Any) -> dict[str, Any]:
    sim = RpcSimulator.start(
        "--history-ledgers", "10", "--ops-per-ledger", "20", "--ledger-interval", str(interval)
    )
    client = redis.Redis.from_url(redis_url)
    job = "bench-rpc-tip"
    client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
    node = NodeProcess.start(
        "rpc-tip", redis_url=redis_url, horizon=None, ttl_ms=5000, job=job,
        start_cursor="now", extra=["--source", "rpc", "--rpc", sim.rpc],
    )  # fmt: skip
    latencies: list[float] = []
    try:
        node.event("became-leader", timeout=60)
        with httpx.Client(timeout=10) as http:
            # Warm-up: a few ledgers for the node to learn the interval.
            latest = int(sim.call(http, "getLatestLedger")["sequence"])
            while int(sim.call(http, "getLatestLedger")["sequence"]) < latest + 3:
                time.sleep(0.05)
            before = sim.requests(http)
            seen = int(sim.call(http, "getLatestLedger")["sequence"])
            first = seen
            pending: dict[int, float] = {}
            end = time.monotonic() + ledgers * interval * 3 + 30
            while len(latencies) < ledgers and time.monotonic() < end:
                now_latest = int(sim.call(http, "getLatestLedger")["sequence"])
                t = time.monotonic()
                for seq in range(seen + 1, now_latest + 1):
                    pending[seq] = t
                seen = max(seen, now_latest)
                committed = _cursor(client, job)
                if committed is not None:
                    at = Cursor.parse(committed).ledger
                    for seq in sorted(s for s in pending if s <= at):
                        latencies.append((t - pending.pop(seq)) * 1000)
                time.sleep(0.005)
            requests = sim.requests(http) - before
            closed = seen - first
    finally:
        node.stop()
        sim.stop()
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token")))
        client.close()
    out = {
        "interval_s": interval,
        "ledgers": len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "requests_per_ledger": requests / max(1, closed),
    }
    log(
        f"  ledger close -> committed at the tip (a ledger every {interval:g} s, {len(latencies)} "
        f"ledgers): p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms, max {out['max_ms']:.0f} ms; "
        f"{out['requests_per_ledger']:.2f} getEvents requests per ledger"
    )
    return out


def run(redis_url: str, *, quick: bool, log: Any = print) -> dict[str, Any]:
    ledgers = 2_000 if quick else 20_000
    return {
        "catch_up": catch_up(redis_url, ledgers=ledgers, limits=(1000, 10_000), log=log),
        # A real RPC answers in tens to hundreds of ms: the cursor chain is sequential, so the
        # page size sets the pace.
        "catch_up_100ms": catch_up(redis_url, ledgers=ledgers, limits=(1000, 10_000), log=log, delay_ms=100),
        "tip": tip_latency(redis_url, ledgers=10 if quick else 40, interval=1.0, log=log),
    }
