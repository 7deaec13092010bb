"""The operator console on a cluster of 50 jobs: 3 node processes hosting the same 50 Horizon jobs.

Measured, in one run, side by side:

- what a page costs the cluster: Redis commands per second (INFO commandstats, less the INFO
  calls themselves) while nobody watches, while ``ingestion watch`` follows the three nodes, while
  the console's overview is open (its page load, then its events feed, as the page's script does)
  and while one job's page is open; each as the increase over nobody watching;
- how fast a page renders: the overview and a job's page served by a node (HTTP on loopback,
  p50/p95 of ``renders`` requests), and, when Debian's Chromium is there, the overview in the
  browser from navigation to its load event with the live feed connected.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import redis

from benchmarks.jobs import _commands, _start, _wait_balanced
from benchmarks.procs import percentile
from ingestion.testing.local_redis import free_port
from ingestion.testing.processes import NodeProcess, Simulator

CHROMIUM = "/usr/bin/chromium"


def _info_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


def _rate(client: redis.Redis, seconds: float) -> float:
    """Redis commands per second over ``seconds``, the INFO calls that measure them left out."""
    before, info_before, at = _commands(client), _info_calls(client), time.monotonic()
    time.sleep(seconds)
    spent = time.monotonic() - at
    return ((_commands(client) - before) - (_info_calls(client) - info_before)) / spent


class _Feed:
    """An events-feed client in a thread (what the page's EventSource does), counting messages."""

    def __init__(self, url: str) -> None:
        self.url, self.messages, self._stop = url, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(5, read=None)) as http, http.stream("GET", self.url) as feed:
            for line in feed.iter_lines():
                if line.startswith("data: "):
                    self.messages += 1
                if self._stop.is_set():
                    return

    def close(self) -> None:
        self._stop.set()


def _timed_gets(url: str, count: int) -> list[float]:
    out = []
    with httpx.Client(timeout=10) as http:
        for _ in range(count):
            at = time.perf_counter()
            answer = http.get(url)
            answer.raise_for_status()
            out.append((time.perf_counter() - at) * 1000)
    return out


def _browser_load_ms(url: str, rounds: int) -> list[float] | None:
    if shutil.which(CHROMIUM) is None:
        return None
    try:
        # lazy: optional dependency (playwright, a test extra)
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--headless=new"])  # fmt: skip
        # (the console forbids eval, which Playwright's waits use: let them run, as the tests do)
        page = browser.new_context(bypass_csp=True).new_page()
        for _ in range(rounds):
            page.goto(url, wait_until="load")
            page.wait_for_function("document.getElementById('live').textContent.includes('live')")
            nav = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
            entry = json.loads(nav)
            out.append(float(entry["loadEventEnd"]) - float(entry["startTime"]))
        browser.close()
    return out


def run(
    redis_url: str, *, jobs: int = 50, ttl_ms: int = 2000, window_s: float = 20.0, renders: int = 50,
    log: Any = print,
) -> dict[str, Any]:  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    # Quiet sources (no new ledger): what remains is the election's own steady traffic (renewals,
    # heartbeats, presence reports), so a viewer's share of the commands stands out of it.
    sim = Simulator.start(history_ledgers=5, ops_per_ledger=5, ledger_interval=3600.0)
    names = ["c1", "c2", "c3"]
    metrics = {n: free_port() for n in names}
    status = {n: free_port() for n in names}
    prefix = "con"
    nodes: dict[str, NodeProcess] = {}
    out: dict[str, Any] = {"jobs": jobs, "nodes": len(names), "ttl_ms": ttl_ms, "window_s": window_s}
    try:
        for name in names:
            ports = ["--metrics-port", str(metrics[name]), "--status-port", str(status[name])]
            nodes[name] = _start(name, redis_url, sim.url, ttl_ms, prefix, jobs, ports)
        _wait_balanced(client, prefix, jobs, names, 90)
        time.sleep(2 * ttl_ms / 1000)
        base = f"http://127.0.0.1:{metrics['c1']}"
        page = f"{base}/console/job/{prefix}07"
        _timed_gets(f"{base}/", 3)  # warm: the first page load looks for unreported jobs
        time.sleep(6)  # past the page loads' look for unreported jobs, which the next one repeats
        # Each viewer between two windows with nobody watching (A-B-A): the election's own
        # traffic drifts slowly, and the increase is measured against the mean of its neighbours.
        idles = [_rate(client, window_s)]
        rates: dict[str, float] = {}

        def phase(name: str, start: Any, stop: Any) -> None:
            handle = start()
            time.sleep(2)
            try:
                rates[name] = _rate(client, window_s)
            finally:
                stop(handle)
            idles.append(_rate(client, window_s))
            before, after = idles[-2], idles[-1]
            log(f"  {name}: {rates[name]:.1f} Redis commands/s; nobody watching before and after: "
                f"{before:.1f}, {after:.1f}; increase {rates[name] - (before + after) / 2:+.1f}/s")

        def start_watch() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, "-m", "ingestion", "watch", "--lines",
                 *(f"ws://127.0.0.1:{status[n]}" for n in names)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

        def stop_watch(proc: subprocess.Popen[bytes]) -> None:
            proc.terminate()
            proc.wait(10)

        def start_feed(url: str, load: str) -> _Feed:
            _timed_gets(load, 1)  # the page load, then its events feed, as the page's script does
            return _Feed(url)

        feeds: list[_Feed] = []
        phase("ingestion watch", start_watch, stop_watch)
        phase("console overview open", lambda: feeds.append(start_feed(f"{base}/console/events", f"{base}/"))
              or feeds[-1], lambda f: f.close())  # fmt: skip
        phase("console job page open", lambda: start_feed(f"{base}/console/events?job={prefix}07", page),
              lambda f: f.close())  # fmt: skip
        increases = {
            name: rates[name] - (idles[i] + idles[i + 1]) / 2 for i, name in enumerate(rates)
        }
        out["commands_per_s"] = {"idle": idles, **rates}
        out["increase_per_s"] = increases
        out["idle_spread_per_s"] = max(idles) - min(idles)
        out["overview_updates_per_s"] = feeds[0].messages / (window_s + 2) if feeds else None

        served = _timed_gets(f"{base}/", renders)
        state = _timed_gets(f"{base}/console/state", renders)
        detail = _timed_gets(page, renders)
        out["render_ms"] = {
            "overview_p50": statistics.median(served), "overview_p95": percentile(served, 95),
            "state_p50": statistics.median(state), "job_page_p50": statistics.median(detail),
            "job_page_p95": percentile(detail, 95),
        }  # fmt: skip
        log(f"  overview served: p50 {out['render_ms']['overview_p50']:.1f} ms, "
            f"p95 {out['render_ms']['overview_p95']:.1f} ms; job page p50 "
            f"{out['render_ms']['job_page_p50']:.1f} ms")  # fmt: skip
        loads = _browser_load_ms(f"{base}/", 10)
        if loads is not None:
            out["browser_load_ms"] = {"p50": statistics.median(loads), "max": max(loads)}
            log(f"  overview in Chromium, navigation to load: p50 {statistics.median(loads):.0f} ms, "
                f"max {max(loads):.0f} ms")  # fmt: skip
    finally:
        for p in nodes.values():
            p.stop()
        sim.stop()
    return out
