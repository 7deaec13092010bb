"""Watch lists of 1,000,000 accounts: memory, matching cost, and reloads (``python -m benchmarks.watchlist``).

The parent writes ``count`` random G accounts to a file and to a local Redis set (the test kit's
``LocalRedis``); each measurement then runs in a fresh child process, so that what the parent
allocated (the generated strings) is not in its figures:

- ``hold``: VmRSS before and after loading the list from the file (``FileWatch.open``), and the
  cost of :meth:`WatchList.matches` per record for records naming 2-3 addresses, hit (one watched)
  and miss (none watched, the case of almost every record), plus a record naming an M address.
- ``redis`` / ``file``: the first load, then a reload after an edit (the version moved, the file
  touched). The peak RSS (VmHWM) is reset before the reload (``/proc/self/clear_refs`` 5), so the
  peak during it shows whether the old list was dropped before the new one was built: about one
  list's worth above the idle process, not two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import trio
from stellar_sdk import MuxedAccount

from ingestion.common.keyspace import watch_keys
from ingestion.common.strkey import encode_account
from ingestion.testing.local_redis import LocalRedis
from ingestion.watchlist.edits import RedisWatch
from ingestion.watchlist.lists import EMPTY, FileWatch, WatchList

JOB = "bench-watch"


def memory_mib() -> dict[str, float]:
    """This process's VmRSS and VmHWM (peak), in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":")
            out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _random_accounts(count: int) -> list[str]:
    return [encode_account(os.urandom(32)) for _ in range(count)]


def _per_record_ns(watch: WatchList, records: list[tuple[str, ...]], rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for record in records:
            watch.matches(record)
        best = min(best, (time.perf_counter_ns() - start) / len(records))
    return round(best, 1)


def child_hold(path: str) -> dict[str, Any]:
    before = memory_mib()
    started = time.monotonic()
    source = FileWatch.open(path)
    seconds = time.monotonic() - started
    watch = trio.run(source.current)
    after = memory_mib()
    watched = list(watch.addresses)[:50_000]
    strangers = _random_accounts(150_000)

    muxed = MuxedAccount(watched[0], 7).account_muxed
    n = 50_000
    miss2 = [(strangers[i], strangers[n + i]) for i in range(n)]
    miss3 = [(strangers[i], strangers[n + i], strangers[2 * n + i]) for i in range(n)]
    hit3 = [(strangers[i], strangers[n + i], watched[i]) for i in range(n)]
    muxed3 = [(strangers[i], strangers[n + i], muxed) for i in range(n)]
    assert not any(watch.matches(r) for r in miss3) and all(watch.matches(r) for r in hit3)
    assert all(watch.matches(r) for r in muxed3)
    return {
        "entries": len(watch), "load_from_file_s": round(seconds, 3),
        "rss_before_mib": before["VmRSS"], "rss_after_mib": after["VmRSS"],
        "list_mib": round(after["VmRSS"] - before["VmRSS"], 1), "peak_mib": after["VmHWM"],
        "matches_ns_per_record": {
            "miss_2": _per_record_ns(watch, miss2), "miss_3": _per_record_ns(watch, miss3),
            "hit_3rd_of_3": _per_record_ns(watch, hit3),
            "muxed_3rd_of_3_cached": _per_record_ns(watch, muxed3),
            "empty_list_miss_3": _per_record_ns(EMPTY, miss3),
        },
    }  # fmt: skip


async def _reloads(source: Any, edit: Any) -> dict[str, Any]:
    base = memory_mib()
    started = time.monotonic()
    first = await source.current()
    first_s = time.monotonic() - started
    entries = len(first)
    del first  # a caller holds no list across calls
    loaded = memory_mib()
    edit()
    peak_reset = reset_peak()
    started = time.monotonic()
    second = await source.current()
    reload_s = time.monotonic() - started
    after = memory_mib()
    started = time.monotonic()
    for _ in range(1000):
        await source.current()
    unchanged_us = (time.monotonic() - started) * 1000
    return {
        "entries": entries, "reloaded_entries": len(second), "first_load_s": round(first_s, 3),
        "reload_s": round(reload_s, 3), "unchanged_check_us": round(unchanged_us, 1),
        "rss_before_mib": base["VmRSS"], "rss_loaded_mib": loaded["VmRSS"],
        "rss_after_reload_mib": after["VmRSS"],
        "peak_during_reload_mib": after["VmHWM"] if peak_reset else None,
    }  # fmt: skip


def child_redis(url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    source = RedisWatch(client, JOB)
    return trio.run(_reloads, source, lambda: client.incr(watch_keys(JOB)["version"]))


def child_file(path: str) -> dict[str, Any]:
    source = FileWatch.open(path)
    return trio.run(_reloads, source, lambda: os.utime(path, ns=(time.time_ns(), time.time_ns())))


def _child(phase: str, arg: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.watchlist", "--child", phase, arg],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))  # after the log lines


def run(count: int = 1_000_000, *, log: Any = print) -> dict[str, Any]:
    server = LocalRedis().start()
    results: dict[str, Any] = {"count": count}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "watch.txt"
            accounts = _random_accounts(count)
            path.write_text("# benchmark\n" + "\n".join(accounts) + "\n")
            client = redis.Redis.from_url(server.url, decode_responses=True)
            key = watch_keys(JOB)["watch"]
            for start in range(0, count, 10_000):
                client.sadd(key, *accounts[start : start + 10_000])
            client.incr(watch_keys(JOB)["version"])
            del accounts
            for phase, arg in (("hold", str(path)), ("file", str(path)), ("redis", server.url)):
                results[phase] = _child(phase, arg)
                log(f"{phase}: {json.dumps(results[phase])}")
    finally:
        server.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.watchlist", description=description)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=2, metavar=("PHASE", "ARG"), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        phase, arg = ns.child
        print(json.dumps({"hold": child_hold, "file": child_file, "redis": child_redis}[phase](arg)))
        return 0
    print(json.dumps(run(ns.count, log=lambda line: print(line, file=sys.stderr)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
