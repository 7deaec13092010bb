"""Webhook delivery measured side by side with a bare httpx client: catch-up throughput (ordered, one
record per POST; ``batch = 100``), and steady-state latency from a record's commit to its arrival.

Everything real on loopback: a ``redis-server``, the example receiver (hypercorn, verifying every
signature with ``standardwebhooks``), a webhook job elected and fenced like any job. The bare client
POSTs the same bodies, one after the other, to the same receiver: the ratio is what delivery's
guarantees (a fenced commit per acknowledged POST, in order) cost.

    python -m benchmarks.webhooks [--records N] [--rounds K]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis as redis_py
import structlog
import trio

from actors.lease import LeaseTiming
from actors.lease_store import LeaseStore, connect, job_keys
from actors.observe import NodeObserver
from actors.source import SyntheticSource
from actors.supervisor import NodeSpec, run_node
from benchmarks.standby import _Monitor, _script_names
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.processes import NodeProcess, Simulator
from ingestion.testing.receiver import Receiver, serve_receiver
from ingestion.webhook.core import RetrySchedule, parse_secrets, sign
from ingestion.webhook.records import StreamRecords
from ingestion.webhook.source import WebhookSource

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TIMING = LeaseTiming(ttl=5.0, renew_interval=1.0, margin=1.0, drift=0.01)


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))


async def _commit(url: str, job: str, first: int, last: int) -> None:
    store = LeaseStore(connect(url, timeout=5.0), job)
    got: Any = await store.acquire("bench", 60_000)
    cursor = await store.committed_cursor()
    src = SyntheticSource(total=last)
    for lo in range(first, last + 1, 5000):
        records = [src.record(i) for i in range(lo, min(lo + 5000, last + 1))]
        done: Any = await store.commit("bench", got.token, cursor, records)
        cursor = done.cursor
    await store.release("bench", got.token)
    store.client.close()


async def _deliver(url: str, source_job: str, job: str, port: int, count: int, batch: int) -> float:
    """Seconds for a webhook job to deliver ``count`` records already committed."""
    receiver_total = count
    store = LeaseStore(connect(url, timeout=1.0), job)
    hook = WebhookSource(
        job=job, from_job=source_job, from_kind="scheduled",
        records=StreamRecords(LeaseStore(store.client, source_job, call_timeout=1.0), f"webhook:{job}"),
        store=store, url=f"http://127.0.0.1:{port}/", keys=parse_secrets(SECRET),
        schedule=RetrySchedule((0.1,)), log=structlog.get_logger(), batch=batch,
    )  # fmt: skip
    spec = NodeSpec("n1", job, 5000, TIMING, 0.0, "0", None, None)
    async with trio.open_nursery() as nursery:
        started = time.perf_counter()
        handle = await nursery.start(
            run_node, store, hook, spec, structlog.get_logger(), NodeObserver("n1", job)
        )
        while hook.stats.delivered < receiver_total:  # noqa: ASYNC110 (the stats have no event)
            await trio.sleep(0.005)
        elapsed = time.perf_counter() - started
        await handle.shutdown()
    store.client.close()
    return elapsed


async def _bare(port: int, bodies: list[tuple[str, bytes]]) -> float:
    keys = parse_secrets(SECRET)
    async with httpx.AsyncClient(timeout=15) as client:
        started = time.perf_counter()
        for msg_id, body in bodies:
            ts = int(time.time())
            headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts),
                       "webhook-signature": sign(keys, msg_id, ts, body), "webhook-fencing-token": "1",
                       "content-type": "application/json"}  # fmt: skip
            answer = await client.post(f"http://127.0.0.1:{port}/", content=body, headers=headers)
            assert answer.status_code == 204, answer.text
        return time.perf_counter() - started


async def _latency(url: str, source_job: str, job: str, port: int, receiver: Receiver, n: int) -> list[float]:
    """Commit → received (ms) for ``n`` records committed one at a time, 20 ms apart."""
    store = LeaseStore(connect(url, timeout=1.0), job)
    hook = WebhookSource(
        job=job, from_job=source_job, from_kind="scheduled",
        records=StreamRecords(LeaseStore(store.client, source_job, call_timeout=1.0), f"webhook:{job}"),
        store=store, url=f"http://127.0.0.1:{port}/", keys=parse_secrets(SECRET),
        schedule=RetrySchedule((0.1,)), log=structlog.get_logger(),
    )  # fmt: skip
    spec = NodeSpec("n1", job, 5000, TIMING, 0.0, "now", None, None)
    await _commit(url, source_job, 1, 1)
    source = LeaseStore(connect(url, timeout=1.0), source_job)
    got: Any = await source.acquire("src", 600_000)
    cursor = SyntheticSource.token_of(1)
    samples = []
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(
            run_node, store, hook, spec, structlog.get_logger(), NodeObserver("n1", job)
        )
        await trio.sleep(0.5)
        for i in range(2, n + 2):
            record = SyntheticSource(total=None).record(i)
            committed_at = time.time()
            done: Any = await source.commit("src", got.token, cursor, [record])
            cursor = done.cursor
            msg_id = f"{source_job}:{record.paging_token}"
            with trio.fail_after(5):
                while msg_id not in receiver.received_at:  # noqa: ASYNC110 (a tight poll: latency)
                    await trio.sleep(0.0005)
            samples.append((receiver.received_at[msg_id] - committed_at) * 1000)
            await trio.sleep(0.02)
        await handle.shutdown()
    store.client.close()
    source.client.close()
    return samples


def standby_cost(url: str, jobs: int = 10, seconds: float = 30.0, ttl_ms: int = 5000) -> dict[str, Any]:
    """Redis commands per second a standby node hosting ``jobs`` webhook jobs sends, per job: the
    harness holds every lease (renewing them as a leader would) and counts, with ``MONITOR``,
    what the node sends."""
    client = redis_py.Redis.from_url(url)
    names = [f"hook{i}" for i in range(jobs)]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        tables = "".join(
            f'[jobs.{n}]\nkind = "webhook"\nfrom = "src"\nurl = "http://127.0.0.1:9/"\nsecret = "{SECRET}"\n'
            for n in names
        )
        config.write_text(
            f"[node]\njob = {json.dumps(names)}\n[lease]\nttl_ms = {ttl_ms}\n"
            '[jobs.src]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 1000\n' + tables
        )
        for n in names:
            client.set(job_keys(n)["token"], 1)
            client.set(job_keys(n)["lease"], "1|harness-leader", px=60_000)
        node = subprocess.Popen(
            [sys.executable, "-m", "ingestion", "--config", str(config), "--node-id", "standby",
             "--redis", url, "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
        )  # fmt: skip
        mon = _Monitor(url, _script_names(), {client.client_info()["addr"]})
        try:
            time.sleep(5.0)  # start-up, the first campaigns
            mon.start()
            time.sleep(0.5)
            mon.counting = True
            started = time.monotonic()
            while time.monotonic() < started + seconds:
                for n in names:
                    client.pexpire(job_keys(n)["lease"], ttl_ms)
                time.sleep(ttl_ms / 5000)
            mon.counting = False
            elapsed = time.monotonic() - started
            assert node.poll() is None, "the standby node exited"
            for n in names:
                assert client.get(job_keys(n)["lease"]) == b"1|harness-leader", "a standby took a lease"
        finally:
            mon.stop()
            node.terminate()
            node.wait(10)
            client.close()
    sent = sum(mon.sent.values())
    return {
        "jobs": jobs, "ttl_ms": ttl_ms, "seconds": round(elapsed, 1),
        "commands_per_s_per_job": round(sent / elapsed / jobs, 3),
        "by_command_per_s": {k: round(v / elapsed, 3) for k, v in sorted(mon.sent.items())},
    }  # fmt: skip


async def close_to_received(url: str, receiver: Receiver, port: int, trials: int = 100) -> dict[str, Any]:
    """Ledger close -> received: a node process follows the simulator's stream (from ``now``)
    and, as a second job of the same node, delivers its records to the in-process receiver; the
    harness closes one ledger at a time and notes when the receiver has all of its records."""
    ops = 20
    sim = await trio.to_thread.run_sync(lambda: Simulator.start(history_ledgers=10, ops_per_ledger=ops))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(
            '[jobs.closing]\nkind = "horizon"\nresource = "/operations"\n'
            f'[jobs.closing-push]\nkind = "webhook"\nfrom = "closing"\nurl = "http://127.0.0.1:{port}/"\n'
            f'secret = "{SECRET}"\nstart = "now"\n'
        )
        node = await trio.to_thread.run_sync(
            lambda: NodeProcess.start(
                "push",
                redis_url=url,
                horizon=sim.url,
                ttl_ms=5000,
                start_cursor="now",
                job="closing",
                extra=["--config", str(config), "--job", "closing-push"],
            )
        )
        samples: list[float] = []
        firsts: list[float] = []
        try:
            await trio.to_thread.run_sync(lambda: node.event("became-leader", timeout=30))
            await trio.sleep(2.0)  # both jobs led, the stream open
            async with httpx.AsyncClient(timeout=10) as http:
                for i in range(trials + 3):
                    await trio.sleep(random.uniform(0.02, 0.06))
                    closed_at = time.time()
                    answer = await http.post(f"{sim.url}/_simulator/ledgers", json={"count": 1})
                    seq = int(answer.json()["latest_ledger"])

                    def arrived(seq: int = seq) -> list[float]:
                        return [t for i, t in receiver.received_at.items()
                                if i.startswith("closing:") and int(i[8:]) >> 32 == seq]  # fmt: skip

                    with trio.fail_after(15):
                        while len(arrived()) < ops:  # noqa: ASYNC110 (the receiver has no event per record)
                            await trio.sleep(0.0005)
                    if i >= 3:
                        samples.append((max(arrived()) - closed_at) * 1000)
                        firsts.append((min(arrived()) - closed_at) * 1000)
        except BaseException:
            for line in node.lines[-30:]:  # the node's last words, for whoever reads the failure
                print(f"  node: {line.event} {json.dumps(line.fields)[:300]}", file=sys.stderr)
            raise
        finally:
            await trio.to_thread.run_sync(node.stop)
            await trio.to_thread.run_sync(sim.stop)
    return {
        "trials": trials, "ops_per_ledger": ops, "last_p50_ms": round(_p(samples, 0.5), 1),
        "last_p99_ms": round(_p(samples, 0.99), 1), "last_max_ms": round(max(samples), 1),
        "first_p50_ms": round(_p(firsts, 0.5), 1), "first_p99_ms": round(_p(firsts, 0.99), 1),
    }  # fmt: skip


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _receiver_process() -> tuple[Any, int]:
    """The example receiver in a process of its own (the deliverer and the bare client each get
    the other core), and its port."""
    proc = subprocess.Popen(
        # (--db :memory:: the benchmark measures the sender, not the receiver's disk)
        [sys.executable, "-m", "ingestion.testing.receiver", "--port", "0", "--db", ":memory:"],
        stdout=subprocess.PIPE, env={**os.environ, "WEBHOOK_SECRET": SECRET},
    )  # fmt: skip
    assert proc.stdout is not None
    line = json.loads(proc.stdout.readline())
    assert line["event"] == "receiver-listening", line
    return proc, int(line["port"])


async def main_async(records: int, rounds: int) -> dict[str, Any]:
    _quiet()
    out: dict[str, Any] = {"records": records, "rounds": []}
    redis_server = LocalRedis().start()
    proc, remote = _receiver_process()
    try:
        receiver = Receiver(SECRET)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_receiver, receiver)
            await _commit(redis_server.url, "src", 1, records)
            src = SyntheticSource(total=records)
            bodies = [
                (f"bare:{src.token_of(i)}", json.dumps({"type": "t", "timestamp": "x", "data": json.loads(
                    src.record(i).body)}).encode())
                for i in range(1, records + 1)
            ]  # fmt: skip
            # Throughput: the receiver in its own process, as an application's would be.
            for k in range(rounds):
                bare = await _bare(remote, bodies)
                ordered = await _deliver(redis_server.url, "src", f"ordered{k}", remote, records, 1)
                batched = await _deliver(redis_server.url, "src", f"batched{k}", remote, records, 100)
                out["rounds"].append({
                    "bare_per_s": round(records / bare), "ordered_per_s": round(records / ordered),
                    "ordered_ratio": round(bare / ordered, 3), "batch100_per_s": round(records / batched),
                })  # fmt: skip
                print(json.dumps(out["rounds"][-1]), file=sys.stderr)
            # Latency: the receiver in this process, to read its arrival times on one clock.
            lat = await _latency(redis_server.url, "live", "live-hook", port, receiver, 300)
            out["latency_ms"] = {
                "p50": round(_p(lat, 0.5), 2), "p99": round(_p(lat, 0.99), 2),
                "max": round(max(lat), 2), "mean": round(statistics.mean(lat), 2),
            }  # fmt: skip
            out["close_to_received"] = await close_to_received(redis_server.url, receiver, port)
            print(json.dumps(out["close_to_received"]), file=sys.stderr)
            out["standby"] = await trio.to_thread.run_sync(standby_cost, redis_server.url)
            print(json.dumps(out["standby"]), file=sys.stderr)
            nursery.cancel_scope.cancel()
    finally:
        proc.terminate()
        proc.wait(10)
        redis_server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.webhooks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args(argv)
    print(json.dumps(trio.run(main_async, ns.records, ns.rounds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
