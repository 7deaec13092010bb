"""A node watching 1,000,000 accounts (``python -m benchmarks.watching``): a lake backfill and a live
RPC job, each checked for exactly the events naming a watched account.

One simulator process writes its whole chain to a lake (``--lake-dir``) and serves Stellar RPC
with a short window, a ledger every second. ``count`` random G accounts (that no event names) and
``real`` accounts that some events name are the list:

- **lake**: a lake job from the chain's first ledger with ``watch_file`` (the list in a file),
  until its cursor reaches the lake's last ledger. Then the lake's own events over that span,
  decoded and filtered here by the same list, must be exactly the committed events (ids, in order).
- **rpc**: a live RPC job with ``watch_set`` (the list in the Redis set, written with the
  operator's ``add``), started at ``now`` and followed for ``live`` ledgers; RPC's own events over
  the span it covered, decoded and filtered here, must be exactly the committed events.

For each: the node's worker peak RSS (VmHWM: the list, the decoding caches, everything), the time
to load the list at the start of the term (the log's ``watch-reloaded`` for the set), and the
records committed out of those read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis
import trio

from actors.lease_store import job_keys
from benchmarks.procs import memory_kib
from benchmarks.rpc import RpcSimulator, _cursor
from ingestion.common.keyspace import watch_keys
from ingestion.common.strkey import encode_account
from ingestion.decode.decoded import decode_event_text
from ingestion.rpc.protocol import Cursor
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.processes import NodeProcess
from ingestion.verify import fetch_lake_events, fetch_rpc_events
from ingestion.watchlist import edits as watch_redis
from ingestion.watchlist import lists as watch


def _addresses(record: Any) -> tuple[str, ...]:
    return decode_event_text(json.dumps(record, separators=(",", ":")))[1]


def _pick(events: list[Any], how_many: int, rng: random.Random) -> list[str]:
    """G accounts some events name (each in a few events, not most)."""
    counts: dict[str, int] = {}
    for e in events:
        for a in set(_addresses(e.record)):
            if a.startswith("G"):
                counts[a] = counts.get(a, 0) + 1
    few = sorted(a for a, n in counts.items() if 1 <= n <= max(2, len(events) // 50))
    return rng.sample(few, min(how_many, len(few)))


def _expected(events: list[Any], listed: watch.WatchList) -> list[str]:
    return [e.paging_token for e in events if listed.matches(_addresses(e.record))]


def _committed(client: redis.Redis, job: str) -> list[str]:
    entries: Any = client.xrange(job_keys(job)["events"])
    return [f[b"paging_token"].decode() for _, f in entries]


def _ledger(cursor: str | None) -> int:
    """The last ledger a committed cursor covers (0: none yet; a start ledger N: N - 1)."""
    if not cursor or cursor == "0":
        return 0
    return int(cursor) - 1 if cursor.isdigit() else Cursor.parse(cursor).ledger


def _config(path: Path, job: str, table: dict[str, Any]) -> Path:
    path.write_text(f'[jobs."{job}"]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    return path


def run(redis_url: str, *, count: int = 1_000_000, real: int = 20, live: int = 20, history: int = 2_000,
        log: Any = print) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(36)
    work = Path(tempfile.mkdtemp(prefix="bench-watching-"))
    lake = work / "lake"
    client = redis.Redis.from_url(redis_url)
    sim = RpcSimulator.start(
        "--history-ledgers", str(history), "--retention-ledgers", "200", "--ops-per-ledger", "20",
        "--ledger-interval", "1", "--lake-dir", str(lake),
    )  # fmt: skip
    out: dict[str, Any] = {"accounts": count, "history_ledgers": history}
    try:
        with httpx.Client(timeout=300) as http:
            latest = int(sim.call(http, "getLatestLedger")["sequence"])
        first = latest - history + 1
        lake_last = first + history - 1 - 1  # the lake holds every closed ledger of the history
        through = str(Cursor.through(latest - 50))
        window = partial(fetch_rpc_events, sim.rpc, [], latest - 150, through=through)
        sample = trio.run(window)
        chosen = _pick(sample, real, rng)
        accounts = [encode_account(os.urandom(32)) for _ in range(count)] + chosen
        rng.shuffle(accounts)
        listing = work / "watch.txt"
        listing.write_text("\n".join(accounts) + "\n")
        listed = watch.WatchList.of(accounts)
        del accounts
        log(f"  {count:,} random accounts + {len(chosen)} named by events; lake ledgers {first}-{lake_last}")

        # -- the lake backfill, watch_file
        job = "bench-watch-lake"
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token", "audit")))
        config = _config(work / "lake.toml", job, {
            "kind": "lake", "lake": str(lake), "start_cursor": str(first), "watch_file": str(listing),
        })  # fmt: skip
        node = NodeProcess.start("watch-lake", redis_url=redis_url, horizon=None, ttl_ms=5000, job=job,
                                 start_cursor=str(first), extra=["--config", str(config)])  # fmt: skip
        try:
            node.event("became-leader", timeout=120)
            began = time.monotonic()
            while _ledger(_cursor(client, job)) < lake_last:
                if time.monotonic() > began + 1200:
                    raise TimeoutError("the lake job did not reach the lake's end in 1200 s")
                time.sleep(0.05)
            seconds = time.monotonic() - began
            peak = memory_kib(node.worker_pid)["VmHWM"]
        finally:
            node.stop()
        through = _ledger(_cursor(client, job))
        events = trio.run(fetch_lake_events, str(lake), [], first, through)
        expected, got = _expected(events, listed), _committed(client, job)
        out["lake"] = {
            "ledgers": through - first + 1, "seconds": round(seconds, 1), "events_read": len(events),
            "committed": len(got), "exact": got == expected, "expected": len(expected),
            "worker_peak_rss_mib": round(peak / 1024, 1),
        }  # fmt: skip
        log(f"  lake: {out['lake']}")

        # -- the live RPC job, watch_set
        job = "bench-watch-rpc"
        client.delete(*(job_keys(job)[k] for k in ("events", "cursor", "lease", "token", "audit")))
        client.delete(*watch_keys(job).values())
        decoded = redis.Redis.from_url(redis_url, decode_responses=True)
        loaded = time.monotonic()
        members = sorted(listed.addresses)
        for i in range(0, len(members), 100_000):
            watch_redis.add(decoded, job, members[i : i + 100_000])
        del members
        out["set_written_s"] = round(time.monotonic() - loaded, 1)
        config = _config(work / "rpc.toml", job, {"kind": "rpc", "rpc": [sim.rpc], "watch_set": True})
        node = NodeProcess.start("watch-rpc", redis_url=redis_url, horizon=None, ttl_ms=5000, job=job,
                                 start_cursor="now", extra=["--config", str(config)])  # fmt: skip
        try:
            node.event("became-leader", timeout=120)
            reloaded = node.event("watch-reloaded", timeout=60)
            began = time.monotonic()
            while not _ledger(_cursor(client, job)):
                time.sleep(0.05)
            start = Cursor.parse(_cursor(client, job) or "")  # "now", pinned at the term's start
            while _ledger(_cursor(client, job)) < start.ledger + live:
                if time.monotonic() > began + live * 5 + 60:
                    raise TimeoutError(f"the RPC job did not follow {live} live ledgers")
                time.sleep(0.05)
            peak = memory_kib(node.worker_pid)["VmHWM"]
        finally:
            node.stop()
        end = _cursor(client, job) or "0"
        events = trio.run(partial(fetch_rpc_events, sim.rpc, [], start.ledger, through=end))
        events = [e for e in events if Cursor.parse(e.paging_token) > start]
        expected, got = _expected(events, listed), _committed(client, job)
        out["rpc"] = {
            "ledgers": Cursor.parse(end).ledger - start.ledger, "events_read": len(events),
            "committed": len(got), "exact": got == expected, "expected": len(expected),
            "list_load_s": reloaded.fields.get("seconds"), "worker_peak_rss_mib": round(peak / 1024, 1),
        }  # fmt: skip
        log(f"  rpc: {out['rpc']}")
        client.delete(*watch_keys(job).values())
        decoded.close()
    finally:
        sim.stop()
        client.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.watching", description=__doc__)
    p.add_argument("--accounts", type=int, default=1_000_000)
    p.add_argument("--history", type=int, default=2_000, help="ledgers in the lake")
    p.add_argument("--redis", help="a Redis to use (default: start one)")
    ns = p.parse_args(argv)
    server = None if ns.redis else LocalRedis().start()
    try:
        result = run(ns.redis or server.url, count=ns.accounts, history=ns.history)  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result))
    return 0 if result["lake"]["exact"] and result["rpc"]["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
