"""Many endpoints on one node: a node process leading 200 jobs, 150 of them idle webhook jobs,
beside two other nodes, for ``--seconds`` (issue 46's acceptance: 10 minutes).

The big node leads 50 scheduled jobs (each commits a record a second) and 150 webhook jobs, each
delivering its own source job's records (``srcN``, committed by the harness as that job's leader)
to a path of its own on a receiver in this process that notes when each delivery arrived. The two
other nodes lead 20 scheduled jobs each (Redis and the machine are shared, as in a cluster).
Every ``--every`` seconds the harness commits one record to each of the 150 sources, one after the
other over the first half of the round (``--burst``: all at once), and measures commit -> received
for each webhook job. Counted from the big node's log: lost leases
(``lost-leadership``), renewal failures (``renew-failed``), ``redis-unavailable``, ``term-ended``,
``duplicate-node-id``; at the end, how many of its 200 jobs it leads.

    python -m benchmarks.many_endpoints [--seconds 600] [--every 20]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from actors.lease_store import LeaseStore, connect, read_states
from actors.source import SyntheticSource
from ingestion.common.asgi import Receive, Scope, Send, read_body, respond, serve_lifespan
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.processes import NodeProcess

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TTL_MS = 5000


class Arrivals:
    """The receiver: answers 204 to every POST and notes when each ``webhook-id`` first came."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.posts = 0

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        await read_body(receive)
        self.posts += 1
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.at.setdefault(headers.get("webhook-id", ""), time.time())
        await respond(send, 204, b"text/plain", b"")


async def _serve(arrivals: Arrivals, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    config.keep_alive_timeout = 120
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(functools.partial(serve, arrivals.app, config, mode="asgi"))  # type: ignore[arg-type]
        task_status.started(int(binds[0].rsplit(":", 1)[-1]))


def _scheduled(name: str) -> str:
    return f'[jobs.{name}]\nkind = "scheduled"\naction = "ingestion.jobs:heartbeat"\nperiod_ms = 1000\n'


def _config(path: Path, port: int, webhooks: int, others: int) -> dict[str, list[str]]:
    """Write the config; {node: the jobs it leads}."""
    hooks = [f"hook{i:03d}" for i in range(webhooks)]
    text = "".join(_scheduled(f"src{i:03d}") for i in range(webhooks))
    text += "".join(
        f'[jobs.{h}]\nkind = "webhook"\nfrom = "src{i:03d}"\nurl = "http://127.0.0.1:{port}/{h}"\n'
        f'secret = "{SECRET}"\n'
        for i, h in enumerate(hooks)
    )
    nodes = {
        "big": [f"beat{i:02d}" for i in range(others)] + hooks,
        "n2": [f"two{i:02d}" for i in range(20)],
        "n3": [f"three{i:02d}" for i in range(20)],
    }
    text += "".join(_scheduled(j) for n in nodes.values() for j in n if not j.startswith("hook"))
    path.write_text(text)
    return nodes


def _start(node: str, jobs: list[str], url: str, config: Path) -> NodeProcess:
    extra = ["--config", str(config), *(f for j in jobs[1:] for f in ("--job", j))]
    return NodeProcess.start(node, redis_url=url, horizon=None, ttl_ms=TTL_MS, job=jobs[0], extra=extra)


def _holders(client: Any, jobs: list[str]) -> Counter[str | None]:
    return Counter(state.leader for state in read_states(client, jobs))


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run(
    seconds: float,
    every: float,
    webhooks: int = 150,
    others: int = 50,
    limit: float = 300,
    burst: bool = False,
) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    redis_server = LocalRedis().start()
    client = connect(redis_server.url, timeout=2.0)
    arrivals = Arrivals()
    procs: dict[str, NodeProcess] = {}
    out: dict[str, Any] = {
        "webhooks": webhooks, "jobs_on_big_node": webhooks + others, "every_s": every, "burst": burst,
    }  # fmt: skip
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_serve, arrivals)
            with tempfile.TemporaryDirectory() as tmp:
                config = Path(tmp) / "config.toml"
                nodes = _config(config, port, webhooks, others)
                sources = [LeaseStore(client, f"src{i:03d}", call_timeout=2.0) for i in range(webhooks)]
                tokens = [(await s.acquire("harness", 3_600_000)).token for s in sources]  # type: ignore[union-attr]
                cursors: list[str | None] = [None] * webhooks
                for node, jobs in nodes.items():
                    procs[node] = await trio.to_thread.run_sync(_start, node, jobs, redis_server.url, config)
                started = time.monotonic()
                while _holders(client, nodes["big"])["big"] < len(nodes["big"]):
                    if time.monotonic() - started > limit:
                        seen = Counter(line.event for line in procs["big"].lines)
                        raise RuntimeError(
                            f"not all led within {limit} s: {_holders(client, nodes['big'])} {seen}"
                        )
                    await trio.sleep(0.5)
                out["all_led_after_s"] = round(time.monotonic() - started, 1)
                await trio.sleep(3)  # every webhook job past its first read, waiting
                mark = len(procs["big"].lines)
                latencies: list[float] = []
                late: list[float] = []
                missing = 0
                rounds = 0
                begun = time.monotonic()
                record = 0
                while time.monotonic() - begun < seconds:
                    record += 1
                    rec = SyntheticSource(total=None).record(record)
                    committed: list[float] = []
                    round_start = trio.current_time()
                    for i, s in enumerate(sources):
                        if not burst:  # one source after the other, spread over the round
                            await trio.sleep_until(round_start + i * (every / 2) / webhooks)
                        done: Any = await s.commit("harness", tokens[i], cursors[i], [rec])
                        cursors[i] = done.cursor
                        committed.append(time.time())
                    ids = [f"src{i:03d}:{rec.paging_token}" for i in range(webhooks)]
                    with trio.move_on_after(5):
                        while not all(i in arrivals.at for i in ids):  # noqa: ASYNC110 (no event per arrival)
                            await trio.sleep(0.005)
                    for i, msg in enumerate(ids):
                        if msg not in arrivals.at:
                            missing += 1
                            continue
                        ms = (arrivals.at[msg] - committed[i]) * 1000
                        latencies.append(ms)
                        if ms > 1000:
                            late.append(ms)
                    rounds += 1
                    print(json.dumps({"round": rounds, "p50_ms": round(_p(latencies[-webhooks:], 0.5), 1),
                                      "max_ms": round(max(latencies[-webhooks:], default=0), 1)}),
                          file=sys.stderr)  # fmt: skip
                    await trio.sleep(max(0.0, every - (time.monotonic() - begun) % every))
                out["seconds"] = round(time.monotonic() - begun, 1)
                lines = procs["big"].lines[mark:]
                events = Counter(line.event for line in lines)
                losses = Counter(
                    str(line.fields.get("reason")) for line in lines if line.event == "lost-leadership"
                )
                held = _holders(client, nodes["big"])
                why = Counter(
                    (line.event, str(line.fields.get("error") or line.fields.get("detail"))[:120])
                    for line in lines if line.event in ("renew-failed", "term-ended", "redis-unavailable")
                )  # fmt: skip
                out["why"] = [f"{n} {e}: {d}" for (e, d), n in why.most_common(6)]
                out.update({
                    "rounds": rounds, "deliveries": len(latencies), "missing": missing,
                    "over_1s": len(late), "p50_ms": round(_p(latencies, 0.5), 1),
                    "p99_ms": round(_p(latencies, 0.99), 1), "max_ms": round(max(latencies, default=0), 1),
                    "lost_leases": sum(losses.values()), "losses": dict(losses),
                    "renew_failed": events["renew-failed"], "redis_unavailable": events["redis-unavailable"],
                    "term_ended": events["term-ended"], "duplicate_node_id": events["duplicate-node-id"],
                    "led_at_end": held["big"], "of": len(nodes["big"]),
                })  # fmt: skip
                nursery.cancel_scope.cancel()
    finally:
        for proc in procs.values():
            await trio.to_thread.run_sync(proc.stop)
        client.close()
        redis_server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.many_endpoints", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--every", type=float, default=20.0)
    parser.add_argument("--webhooks", type=int, default=150)
    parser.add_argument("--others", type=int, default=50)
    parser.add_argument("--burst", action="store_true", help="commit to every source at once")
    ns = parser.parse_args(argv)
    print(json.dumps(trio.run(run, ns.seconds, ns.every, ns.webhooks, ns.others, 300, ns.burst), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
