"""What decoding costs (``python -m benchmarks.decoding``), side by side with decoding off.

- **RPC catch-up**: one simulator (a 20,000-ledger window, 20 operations a ledger: about 60,000
  contract events), rounds alternating a plain ``getEvents`` client and two node processes, one
  with the job's ``decode = false`` and one with decoding on (the default), each from the oldest
  ledger to the latest; the best of each, and each node's rate over the plain client's.
- **The lake, per core**: the real pubnet ledgers of ``../shared/data/lake`` as one-ledger lake
  objects; per ledger, the CPU time of what a decode worker does (:func:`object_events`: the
  events as RPC serves them) and of what decoding adds in the node (the events stage's
  :func:`decode_event_text` over those events, its caches warm from the ledgers before, as in a
  backfill); ledgers per CPU second without and with, and the drop.
- **Horizon payments**: microseconds per record of the transfer view over the recorded real
  ``/payments`` pages.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchmarks import rpc
from benchmarks.lake import pubnet_objects
from ingestion.decode.decoded import decode_event_text
from ingestion.decode.payments import payment_record_text
from ingestion.lake.events import object_events
from ingestion.testing import recorded
from ingestion.testing.local_redis import LocalRedis


def rpc_side_by_side(redis_url: str, *, ledgers: int, rounds: int, log: Any) -> dict[str, Any]:
    out = rpc.catch_up(
        redis_url, ledgers=ledgers, limits=(10_000,), log=log, rounds=rounds, decode=(False, True)
    )
    runs = {("on" if r["decode"] else "off"): r for r in out["runs"]}
    result = {
        "ledgers": ledgers, "events": out["events"], "plain_eps": round(out["bare_warm_eps"]),
        **{f"node_{k}_eps": round(r["eps"]) for k, r in runs.items()},
        **{f"node_{k}_ratio": round(r["ratio_bare_warm"], 3) for k, r in runs.items()},
        **{f"node_{k}_rounds": [round(x["node"] / x["plain"], 2) for x in r["rounds_eps"]]
           for k, r in runs.items()},
        "on_over_off": round(runs["on"]["eps"] / runs["off"]["eps"], 3),
        **{f"node_{k}_cpu_us_per_event": {p: round(v, 2) for p, v in r["cpu"]["us_per_record"].items()}
           for k, r in runs.items()},
    }  # fmt: skip
    log(f"  RPC: {result}")
    return result


def lake_per_core(rounds: int = 5) -> dict[str, Any] | None:
    objects = pubnet_objects()
    if objects is None:
        return None
    best_worker, best_stage, events = float("inf"), float("inf"), 0
    for _ in range(rounds):
        worker = stage = 0.0
        events = 0
        for data in objects:
            began = time.process_time()
            held = object_events(data)
            worker += time.process_time() - began
            bodies = [e.body for ledger in held for e in ledger.events]
            events += len(bodies)
            began = time.process_time()
            for body in bodies:
                decode_event_text(body)
            stage += time.process_time() - began
        best_worker, best_stage = min(best_worker, worker), min(best_stage, stage)
    n = len(objects)
    off, on = n / best_worker, n / (best_worker + best_stage)
    return {
        "ledgers": n, "events": events, "worker_ms_per_ledger": round(best_worker / n * 1000, 2),
        "decode_ms_per_ledger": round(best_stage / n * 1000, 2),
        "decode_us_per_event": round(best_stage / events * 1e6, 2),
        "ledgers_per_cpu_s_off": round(off, 1), "ledgers_per_cpu_s_on": round(on, 1),
        "drop": round(1 - on / off, 3),
    }  # fmt: skip


def horizon_payments(rounds: int = 5) -> dict[str, Any] | None:
    pages = [
        recorded.HORIZON / "aurora-rs_stellar-horizon-rs" / "pubnet_payments_asc_200__all_payments.json",
        recorded.HORIZON / "lightsail-network_java-stellar-sdk" / "pages" / "payments.json",
        recorded.HORIZON / "StellarCN_stellar-model" / "payments_response.json",
    ]
    if not all(p.exists() for p in pages):
        return None
    texts = [
        json.dumps(r, separators=(",", ":"))
        for p in pages for r in json.loads(p.read_text())["_embedded"]["records"]
    ]  # fmt: skip
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for text in texts:
            payment_record_text(text)
        best = min(best, time.perf_counter() - began)
    return {"records": len(texts), "us_per_record": round(best / len(texts) * 1e6, 2)}


def run(redis_url: str, *, quick: bool, log: Any = print) -> dict[str, Any]:
    out: dict[str, Any] = {"lake": lake_per_core(), "horizon_payments": horizon_payments()}
    log(f"  lake per core: {out['lake']}")
    log(f"  Horizon payments: {out['horizon_payments']}")
    ledgers, rounds = (2_000, 1) if quick else (20_000, 3)
    out["rpc"] = rpc_side_by_side(redis_url, ledgers=ledgers, rounds=rounds, log=log)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decoding", description=__doc__)
    p.add_argument("--quick", action="store_true")
    ns = p.parse_args(argv)
    server = LocalRedis().start()
    try:
        result = run(server.url, quick=ns.quick)
    finally:
        server.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
