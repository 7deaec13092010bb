"""Backfill in parallel ranges (docs/BACKFILL.md): one node against two, side by side.

A lake of ``ledgers`` real pubnet ledgers: the four busy ones of ``../shared/data/lake`` (read where
:mod:`ingestion.testing.recorded` finds them, never copied), cycled, each written again under
consecutive ledger numbers (the header's sequence patched in the XDR bytes: its events then carry
those ledgers' ids), one ledger an object, as Galexie writes them. A lake job whose own start lies
past the lake's end (it waits at the tip) is backfilled over the whole lake in ``ranges`` ranges,
into the Redis stream, by one node and then by two, on a settled cluster (the nodes started two
TTLs before the plan, so each knows which others host the job). Each node is pinned to a core of
its own (``sched_setaffinity`` on its whole process tree: worker, decode workers, helpers): a node
stands for a machine with one core, so the run measures how the work spreads over nodes, not how
one node uses two cores. Timed from the plan's write until every range is done (the decode
pools' start included: each range's term pays it once), and from the first range's term. CPU
from ``/proc``: each node's tree, Redis's own (``INFO cpu``) and the machine's busy seconds, so
that the speed-up can be read against what the cores had to give: Redis and the harness share
the two cores with the nodes. Figures: ledgers/s and events/s of each run, the speed-up of two
nodes over one, ledgers per node CPU second (the per-core rate), and how many ranges each node led;
and, beside the one-node run, ``ingestion audit`` of what it wrote (:mod:`benchmarks.audit`).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from stellar_sdk import xdr

from actors.lease_store import job_keys
from benchmarks import audit
from benchmarks.lake import PUBNET
from benchmarks.procs import machine_cpu_seconds, pin_tree, tree_cpu_seconds
from ingestion.backfill.plan import Plan
from ingestion.common.keyspace import backfill_key
from ingestion.lake.events import ledger_events
from ingestion.testing import recorded
from ingestion.testing.lakes import resequencer, write_ledgers
from ingestion.testing.processes import NodeProcess

FIRST = 60_000_000  # the lake's first ledger
TTL_MS = 3000


def write_lake(root: Path, ledgers: int) -> int:
    """The lake (one ledger an object); its events."""
    raws = [gzip.decompress((recorded.LAKE / name).read_bytes()) for name in PUBNET]
    patch = [resequencer(raw) for raw in raws]
    per_template = [len(ledger_events(xdr.LedgerCloseMeta.from_xdr_bytes(raw)).events) for raw in raws]
    write_ledgers(root, ((FIRST + i, patch[i % len(raws)](FIRST + i)) for i in range(ledgers)))
    return sum(per_template[i % len(raws)] for i in range(ledgers))


def _config(path: Path, job: str, lake: Path, ledgers: int) -> Path:
    path.write_text(
        f'[node]\nsource = "lake"\n\n[lake]\nurl = "file://{lake}"\ndecode_processes = 1\n\n'
        f'[jobs.{job}]\nkind = "lake"\nstart_cursor = "{FIRST + ledgers + 1000}"\n'
    )
    return path


def _backfill(redis_url: str, lake: Path, tmp: Path, job: str, nodes: int, ledgers: int, ranges: int,
              limit: float) -> dict[str, Any]:  # fmt: skip
    cfg = _config(tmp / f"{job}.toml", job, lake, ledgers)
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for n in range(nodes):
            node = NodeProcess.start(f"{job}-n{n + 1}", redis_url=redis_url, horizon=None, ttl_ms=TTL_MS,
                                     job=job, extra=["--config", str(cfg)])  # fmt: skip
            procs.append(node)
            node.event("became-leader" if n == 0 else "standby", timeout=60)
        # A settled cluster, as a backfill meets it: every node's source watch has reported and
        # read the others' reports (once a TTL each), so each node knows which others host the job.
        time.sleep(2 * TTL_MS / 1000)
        for n, node in enumerate(procs):
            pin_tree(node.pid, {cores[n % len(cores)]})  # the worker, its decode workers, helpers
        plan = Plan(job, FIRST, FIRST + ledgers - 1, ranges)
        cpu_before = [tree_cpu_seconds(node.pid) for node in procs]
        redis_before = _redis_cpu(client)
        machine_before = machine_cpu_seconds()
        started = time.monotonic()
        client.hset(backfill_key(job), mapping=plan.to_hash())  # what `ingestion backfill` writes
        while not all(client.hexists(backfill_key(name), "done") for name in plan.names):
            if time.monotonic() - started > limit:
                raise TimeoutError(f"the backfill of {ledgers} ledgers took more than {limit:.0f} s")
            time.sleep(0.05)
        ended = time.monotonic()
        cpu = [tree_cpu_seconds(node.pid) - b for node, b in zip(procs, cpu_before, strict=True)]
        redis_cpu = _redis_cpu(client) - redis_before
        machine = machine_cpu_seconds() - machine_before
        records = sum(int(client.xlen(job_keys(name)["events"])) for name in plan.names)
        led: dict[str, int] = {}
        terms = []
        for node in procs:
            mine = [
                line for line in node.lines
                if line.event == "became-leader" and str(line.fields.get("job", "")).startswith(f"{job}~")
            ]  # fmt: skip
            led[node.node_id] = len(mine)
            terms += [line.at for line in mine]
    finally:
        for node in procs:
            node.stop()
        client.close()
    seconds = ended - started
    work = ended - min(terms)  # from the first range's term (the plan seen) to the last done
    return {
        "nodes": nodes, "ranges": ranges, "ledgers": ledgers, "records": records, "seconds": seconds,
        "ledgers_per_s": ledgers / seconds, "records_per_s": records / seconds, "terms_by_node": led,
        "start_s": min(terms) - started, "work_s": work, "work_ledgers_per_s": ledgers / work,
        "node_cpu_s": cpu, "redis_cpu_s": redis_cpu, "machine_cpu_s": machine,
        "ledgers_per_cpu_s": ledgers / sum(cpu),
    }  # fmt: skip


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(redis_url: str, *, quick: bool, log: Any = print) -> dict[str, Any]:
    ledgers = 80 if quick else 480
    if not recorded.LAKE.is_dir():
        log(f"  skipped: the recorded lake ledgers are not at {recorded.LAKE}")
        return {"skipped": True}
    tmp = Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    try:
        lake = tmp / "lake"
        events = write_lake(lake, ledgers)
        log(f"  a lake of {ledgers} pubnet ledgers, {events:,} events")
        limit = max(120.0, ledgers)
        one = _backfill(redis_url, lake, tmp, "bf-one", 1, ledgers, 4, limit)
        # the audit of what that backfill wrote, beside it (benchmarks/audit.py)
        checked = audit.measure(tmp / "bf-one.toml", redis_url, "bf-one", FIRST, FIRST + ledgers - 1)
        for name, a in checked.items():
            log(f"  audit ({name}: {a['cores']} core(s)): {a['seconds']:.1f} s, {a['ledgers_per_s']:.1f} "
                f"ledgers/s, {a['records']:,} records, CPU {a['cpu_s']:.1f} s: {a['ledgers_per_cpu_s']:.1f} "
                "ledgers per CPU second")  # fmt: skip
        two = _backfill(redis_url, lake, tmp, "bf-two", 2, ledgers, 4, limit)
        for r in (one, two):
            assert r["records"] == events, (r["records"], events)
            cpu = " + ".join(f"{c:.1f}" for c in r["node_cpu_s"])
            log(f"  {r['nodes']} node(s), {r['ranges']} ranges: {r['seconds']:.1f} s, "
                f"{r['ledgers_per_s']:.1f} ledgers/s, {r['records_per_s']:,.0f} events/s, "
                f"terms {r['terms_by_node']}; first term after {r['start_s']:.1f} s, then "
                f"{r['work_ledgers_per_s']:.1f} ledgers/s; CPU: nodes {cpu} s, Redis "
                f"{r['redis_cpu_s']:.1f} s, machine {r['machine_cpu_s']:.1f} s of "
                f"{r['seconds'] * (os.cpu_count() or 1):.1f}; {r['ledgers_per_cpu_s']:.1f} ledgers "
                "per node CPU second")  # fmt: skip
        speedup = two["ledgers_per_s"] / one["ledgers_per_s"]
        work_speedup = two["work_ledgers_per_s"] / one["work_ledgers_per_s"]
        log(f"  two nodes / one: {speedup:.2f} from the plan's write, {work_speedup:.2f} from the first term")
        return {"events": events, "one": one, "two": two, "speedup": speedup, "work_speedup": work_speedup,
                "audit": checked}  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
