"""The latency tail of push delivery under a steady load, as a new user tries it: three node
processes sharing a Horizon job (the simulator closes a ledger of 10 operations every 200 ms) and
an ordered webhook job delivering its records to a receiver in this process.

Committed -> received per record: the source stream entry's id (Redis's clock, this machine's)
to the receiver's arrival (this machine's wall clock). Also split: the first record of each
ledger (the wake-up after a commit) and the others (delivered behind it, in order).

    python -m benchmarks.webhook_tail [--seconds 60]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from actors.lease_store import connect, job_keys
from benchmarks.many_endpoints import SECRET, Arrivals, _p, _serve
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.processes import NodeProcess, Simulator

SOURCE, HOOK = "ledgers", "ledgers-push"


async def run(seconds: float, ops: int = 10, interval: float = 0.2) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    redis_server = LocalRedis().start()
    client = connect(redis_server.url, timeout=2.0)
    sim = await trio.to_thread.run_sync(
        lambda: Simulator.start(history_ledgers=10, ops_per_ledger=ops, ledger_interval=interval)
    )
    arrivals = Arrivals()
    nodes: list[NodeProcess] = []
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_serve, arrivals)
            with tempfile.TemporaryDirectory() as tmp:
                config = Path(tmp) / "config.toml"
                config.write_text(
                    f'[jobs.{SOURCE}]\nkind = "horizon"\nresource = "/operations"\n'
                    f'[jobs.{HOOK}]\nkind = "webhook"\nfrom = "{SOURCE}"\nurl = "http://127.0.0.1:{port}/"\n'
                    f'secret = "{SECRET}"\nstart = "now"\n'
                )
                for name in ("n1", "n2", "n3"):
                    start = functools.partial(
                        NodeProcess.start, name, redis_url=redis_server.url, horizon=sim.url, ttl_ms=5000,
                        start_cursor="now", job=SOURCE, extra=["--config", str(config), "--job", HOOK],
                    )  # fmt: skip
                    nodes.append(await trio.to_thread.run_sync(start))
                with trio.fail_after(60):
                    while not (client.get(job_keys(SOURCE)["lease"]) and client.get(job_keys(HOOK)["lease"])):  # noqa: ASYNC110
                        await trio.sleep(0.2)
                await trio.sleep(5)  # both led, the stream followed, the deliverer waiting
                begun = time.time()
                await trio.sleep(seconds)
                ended = time.time()
                await trio.sleep(2)  # the last records delivered
                rows: Any = client.xrange(
                    job_keys(SOURCE)["events"], f"{int(begun * 1000)}", f"{int(ended * 1000)}"
                )
                leader_moves = sum(
                    1 for n in nodes for line in n.lines if line.event == "lost-leadership"
                )  # fmt: skip
                nursery.cancel_scope.cancel()
    finally:
        for n in nodes:
            await trio.to_thread.run_sync(n.stop)
        await trio.to_thread.run_sync(sim.stop)
        client.close()
        redis_server.stop()
    every: list[float] = []
    firsts: list[float] = []
    missing = 0
    previous_ms = 0
    for entry_id, fields in rows:
        ms = int(entry_id.partition("-")[0])
        at = arrivals.at.get(f"{SOURCE}:{fields['paging_token']}")
        if at is None:
            missing += 1
            continue
        every.append(at * 1000 - ms)
        if ms != previous_ms:  # the first record of a commit (a ledger's records commit together)
            firsts.append(at * 1000 - ms)
        previous_ms = ms

    def figures(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(_p(values, 0.5), 1), "p90": round(_p(values, 0.9), 1),
            "p99": round(_p(values, 0.99), 1), "max": round(max(values, default=0), 1),
        }  # fmt: skip

    return {
        "seconds": seconds, "ops_per_ledger": ops, "ledger_interval_s": interval, "records": len(rows),
        "missing": missing, "leader_changes": leader_moves, "committed_to_received_ms": figures(every),
        "first_of_commit_ms": figures(firsts),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.webhook_tail", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    ns = parser.parse_args(argv)
    print(json.dumps(trio.run(run, ns.seconds), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
