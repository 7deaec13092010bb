"""``ingestion backfill``: a span of a job's history in parallel ranges across the cluster.

``ingestion backfill JOB --from A [--to B] [--ranges K]`` checks the span, writes the plan to
Redis (``ingestion:{JOB}:backfill``) and shows its progress until every range is done. The work
is the cluster's, not this command's: every node that hosts JOB runs the ranges as elected,
fenced jobs (``JOB~FIRST-LAST``), balanced over the nodes, each resumable from its committed
cursor. Ctrl-C leaves the backfill running; ``--status`` shows it, ``--cancel`` stops it (the
same command again resumes it where it stood). ``--to`` defaults to the ledger before the job's
own first committed record: the backfill and the live job meet without a gap or a duplicate.

Exit 0; 2 for a bad flag or span (one line, nothing written); 1 when Redis, PostgreSQL or the
source cannot be reached.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import getpass
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import trio

from actors.lease_store import NODE_REGISTRY_KEY
from ingestion.backfill.plan import Plan, Progress
from ingestion.cli.usage import OneLineParser, UsageError, setting_help
from ingestion.common.redact import redact
from ingestion.config import load

REFRESH = 1.0  # seconds between progress reads
PLAIN_EVERY = 10.0  # seconds between progress lines when not on a terminal


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion backfill",
        description="Backfill a span of an rpc or lake job's history in parallel ranges, each an "
        "elected, fenced job run by the nodes that host the job; show its progress.",
    )
    p.add_argument("job", help="the job (an rpc or lake job of the configuration)")
    p.add_argument("--from", dest="first", type=int, metavar="LEDGER", help="the first ledger")
    p.add_argument(
        "--to", dest="last", type=int, metavar="LEDGER",
        help="the last ledger (default: the one before the job's first committed record)",
    )  # fmt: skip
    p.add_argument("--ranges", type=int, default=0, metavar="K",
                   help="ranges run in parallel across the nodes (default: 4 per live node)")  # fmt: skip
    p.add_argument("--status", action="store_true", help="show the job's backfill and exit")
    p.add_argument("--cancel", action="store_true",
                   help="stop the job's running backfill (the same span again resumes it)")  # fmt: skip
    p.add_argument("--detach", action="store_true", help="write the plan and exit at once")
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    return p


def main(argv: Sequence[str]) -> int:
    ns = parser().parse_args(list(argv))
    flags: dict[str, dict[str, Any]] = {"redis": {"url": ns.redis}} if ns.redis else {}
    settings = load(ns.config, os.environ, flags)
    jobs = {j.name: j for j in settings.jobs}
    job = jobs.get(ns.job)
    if job is None:
        raise UsageError(f"backfill: no job named {ns.job!r} in this configuration (jobs: {', '.join(jobs)})")
    if job.kind not in ("rpc", "lake"):
        raise UsageError(f"backfill: job {ns.job!r} is a {job.kind} job: only rpc and lake jobs backfill")
    if ns.status and ns.cancel:
        raise UsageError("backfill: give --status or --cancel, not both")
    client = settings.redis.connect()
    try:
        if ns.status:
            return _status(client, job, settings.sink.schema)
        if ns.cancel:
            return _cancel(client, job, settings.sink.schema)
        plan = _plan(ns, client, job, settings)
        if ns.detach:
            return 0
        return _follow(client, plan, job, settings.sink.schema)
    except redis.RedisError as exc:
        print(f"ingestion: backfill: Redis: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the source's (its own words name it), not Redis's
        print(f"ingestion: backfill: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _plan(ns: argparse.Namespace, client: redis.Redis, job: Any, settings: Any) -> Plan:
    """Check the span and write the plan (or find the same one: it resumes)."""
    from ingestion.backfill import checks  # lazy: CLI start-up (~2 ms)
    from ingestion.backfill.status import committed_span, write_plan  # lazy: CLI start-up (~5 ms)

    if ns.first is None:
        raise UsageError("backfill: give --from LEDGER (and --to LEDGER), or --status / --cancel")
    span = committed_span(client, job.name, job.sink, settings.sink.schema)
    last = ns.last
    if last is None:
        if span is None:
            raise UsageError(f"backfill: job {job.name} has committed nothing yet: give --to LEDGER")
        last = span[0] - 1
    if ns.first < 1:
        raise UsageError(f"backfill: --from must be a ledger number (1 or more), got {ns.first}")
    if last < ns.first:
        raise UsageError(f"backfill: --to {last} is below --from {ns.first}")
    problem = checks.overlap_problem(job.name, ns.first, last, span)
    if problem:
        raise UsageError(f"backfill: {problem}")
    problem = _reach_problem(job, settings, ns.first, last)
    if problem:
        raise UsageError(f"backfill: {problem}")
    if ns.ranges < 0:
        raise UsageError(f"backfill: --ranges must be at least 1, got {ns.ranges}")
    span_ledgers = last - ns.first + 1
    asked = min(ns.ranges, span_ledgers)
    plan = Plan(
        job.name, ns.first, last, min(4 * max(1, _live_nodes(client)), span_ledgers), "running",
        _now(), f"{getpass.getuser()}@{socket.gethostname()}",
    )  # fmt: skip
    written = write_plan(client, plan, asked)
    other = written.plan
    if written.outcome == "busy" and _settled(client, other, job, settings.sink.schema) == "done":
        written = write_plan(client, plan, asked)  # the one before had just finished
        other = written.plan
    if written.outcome == "busy":
        raise UsageError(
            f"backfill: job {job.name} has a backfill running (ledgers {other.first}..{other.last} "
            f"in {other.ranges} ranges): wait for it, or stop it with --cancel first"
        )
    if written.outcome == "split":
        raise UsageError(
            f"backfill: ledgers {other.first}..{other.last} of {job.name} were planned in {other.ranges} "
            f"ranges ({other.state}): the same span runs in the same ranges, whose names carry their "
            f"bounds and whose records are kept, so that no ledger is committed twice; give "
            f"--ranges {other.ranges}, or no --ranges"
        )
    plan = written.plan
    print(
        f"backfill of {job.name} {written.outcome}: ledgers {plan.first}..{plan.last} in {plan.ranges} "
        f"ranges, run by the nodes that host {job.name}"
    )
    return plan


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _settled(client: redis.Redis, plan: Plan, job: Any, schema: str) -> str:
    """``plan``'s state, settled ``done`` in Redis first when every range is done (as the nodes do
    within a quarter of a lease TTL): what the operator sees is what the cluster holds."""
    from ingestion.backfill.status import read_progress, settle  # lazy: CLI start-up (~5 ms)

    if plan.state != "running":
        return plan.state
    if not read_progress(client, plan, job.sink, schema).progress.finished:
        return plan.state
    return settle(client, plan, "done", _now())[1] or plan.state


def _live_nodes(client: redis.Redis) -> int:
    now_ms = int(client.time()[0]) * 1000  # type: ignore[index]
    return int(client.zcount(NODE_REGISTRY_KEY, now_ms - 10_000, "+inf"))  # type: ignore[arg-type]


def _reach_problem(job: Any, settings: Any, first: int, last: int) -> str | None:
    """Whether the source holds the span: a lake's objects, or Stellar RPC's retention window."""
    if job.kind == "lake":
        return trio.run(_lake_problem, job, settings, first, last)
    return trio.run(_rpc_problem, job, first, last)


async def _lake_problem(job: Any, settings: Any, first: int, last: int) -> str | None:
    from ingestion.backfill import checks  # lazy: CLI start-up (~2 ms)
    from ingestion.lake.store import LocalLake, open_lake  # lazy: CLI start-up (lake.store, ~8 ms)

    lake = open_lake(job.lake_url, settings.lake.endpoint_url)
    schema = await lake.schema()
    if schema is None:
        return f"the lake {redact(job.lake_url)} has no .config.json: nothing to backfill from"
    edges = await lake.edges()
    if edges is None:
        return f"the lake {redact(job.lake_url)} holds no ledger"
    oldest, newest = edges
    if first < oldest or last > newest:
        return f"ledgers {first}..{last} are beyond the lake's reach (it holds ledgers {oldest}..{newest})"
    if isinstance(lake, LocalLake):
        root = lake.root

        def names_in(partition: str) -> list[str]:
            try:
                return os.listdir(root / partition) if partition else os.listdir(root)
            except FileNotFoundError:
                return []
    else:

        def names_in(partition: str) -> list[str]:
            return [n.rstrip("/") for n in lake._names(partition)]

    missing = await trio.to_thread.run_sync(
        functools.partial(checks.missing_objects, schema, first, last, names_in)
    )
    return checks.describe_missing(job.lake_url, missing) if missing else None


async def _rpc_problem(job: Any, first: int, last: int) -> str | None:
    from ingestion.common.http import SourceUnreadable  # lazy: CLI start-up (httpx, ~20 ms)
    from ingestion.rpc.source import RpcReader  # lazy: CLI start-up (httpx, ~20 ms)

    url = job.rpc_urls[0]
    try:
        reader = RpcReader(url, request_timeout=10)
        async with reader.client() as http:
            result = await reader.call(http, "getHealth")
        oldest, newest = int(result["oldestLedger"]), int(result["latestLedger"])
    except (SourceUnreadable, LookupError, TypeError, ValueError) as exc:
        raise OSError(redact(f"Stellar RPC {url}: getHealth: {exc}")) from exc
    if first < oldest or last > newest:
        return (
            f"ledgers {first}..{last} are beyond Stellar RPC's reach (it keeps ledgers "
            f"{oldest}..{newest}): backfill older ledgers from a lake job"
        )
    return None


def _cancel(client: redis.Redis, job: Any, schema: str) -> int:
    """Stop the job's running backfill (atomically: only a plan still running is cancelled) and
    say what that did."""
    from ingestion.backfill.status import read_plan, read_progress, settle  # lazy: CLI start-up (~5 ms)

    plan = read_plan(client, job.name)
    if plan is None:
        print(f"job {job.name} has no backfill: nothing to cancel")
        return 0
    span = f"ledgers {plan.first}..{plan.last} in {plan.ranges} ranges"
    state = _settled(client, plan, job, schema)
    if state == "running":
        moved, state = settle(client, plan, "cancelled", _now())
        if moved:
            p = read_progress(client, plan, job.sink, schema).progress
            done = sum(1 for r in p.ranges if r.done)
            print(
                f"backfill of {job.name} ({span}) cancelled: {done} of {plan.ranges} ranges were done, "
                f"the others stop where they stand ({p.ledgers_done}/{p.total} ledgers committed, kept); "
                f"the same command (--from {plan.first} --to {plan.last}) resumes it"
            )
            return 0
    if state == "done":
        print(f"backfill of {job.name} ({span}) is done: nothing to cancel")
    elif state == "cancelled":
        print(f"backfill of {job.name} ({span}) was already cancelled: nothing changed")
    else:
        print(f"the backfill of {job.name} changed meanwhile: nothing cancelled (see --status)")
    return 0


def _status(client: redis.Redis, job: Any, schema: str) -> int:
    from ingestion.backfill.status import read_plan, read_progress  # lazy: CLI start-up (~5 ms)

    plan = read_plan(client, job.name)
    if plan is None:
        print(f"job {job.name} has no backfill")
        return 0
    state = _settled(client, plan, job, schema)
    progress = read_progress(client, plan, job.sink, schema).progress
    print(f"backfill of {job.name}: ledgers {plan.first}..{plan.last} in {plan.ranges} ranges, {state}"
          f" (since {plan.created_at or '?'} by {plan.created_by or '?'})")  # fmt: skip
    print(_summary(progress))
    for r in progress.ranges:
        shown = "done" if r.done else (f"led by {r.leader}" if r.leader else "waiting")
        print(f"  {r.name}: {r.ledgers_done}/{r.ledgers} ledgers, {shown}")
    return 0


def _summary(p: Progress) -> str:
    done = sum(1 for r in p.ranges if r.done)
    if p.complete_through < p.plan.first:
        complete = "no ledger complete yet"
    else:
        complete = f"complete through ledger {p.complete_through}"
    nodes = ", ".join(f"{n}={k}" for n, k in sorted(p.by_node().items()))
    if not nodes:
        nodes = (
            "no range led"
            if p.finished
            else "no range led yet (the nodes take a new plan up within a lease TTL)"
        )
    else:
        nodes = f"leading: {nodes}"
    return (
        f"{p.ledgers_done}/{p.total} ledgers, ranges {p.running} running / {done} done of "
        f"{len(p.ranges)}, {complete}; {nodes}"
    )


def _follow(client: redis.Redis, plan: Plan, job: Any, schema: str) -> int:
    """Progress until every range is done (then the plan is settled ``done``): a bar on a
    terminal, a line every few seconds otherwise. Ctrl-C leaves the backfill running."""
    from tqdm import tqdm  # lazy: CLI start-up (tqdm, ~10 ms): only the progress bar

    from ingestion.backfill.status import read_plan, read_progress, settle  # lazy: CLI start-up (~5 ms)

    tty = sys.stderr.isatty()
    bar = tqdm(total=plan.last - plan.first + 1, unit="ledger", disable=not tty, dynamic_ncols=True,
               desc=f"backfill {plan.job}")  # fmt: skip
    shown = 0
    started, last_line = time.monotonic(), 0.0
    try:
        while True:
            snapshot = read_progress(client, plan, job.sink, schema)
            p = snapshot.progress
            bar.update(p.ledgers_done - shown)
            shown = p.ledgers_done
            done = sum(1 for r in p.ranges if r.done)
            bar.set_postfix_str(
                f"records={snapshot.records:,} ranges={p.running} running/{done} done "
                + " ".join(f"{n}={k}" for n, k in sorted(p.by_node().items())),
                refresh=False,
            )
            now = time.monotonic()
            if not tty and (now - last_line >= PLAIN_EVERY or p.finished):
                rate = p.ledgers_done / max(1e-9, now - started)
                left = (p.total - p.ledgers_done) / rate if rate > 0 else float("inf")
                print(f"backfill {plan.job}: {_summary(p)}; {snapshot.records:,} records; "
                      f"{rate:,.1f} ledgers/s, {_duration(left)} left", flush=True)  # fmt: skip
                last_line = now
            if p.finished:
                bar.close()
                settle(client, plan, "done", _now())
                print(f"backfill of {plan.job} done: ledgers {plan.first}..{plan.last}, "
                      f"{snapshot.records:,} records")  # fmt: skip
                return 0
            now_plan = read_plan(client, plan.job)
            if now_plan is not None and now_plan.same_work(plan) and now_plan.state == "done":
                snapshot = read_progress(client, plan, job.sink, schema)  # (settled meanwhile: final)
                bar.close()
                print(f"backfill of {plan.job} done: ledgers {plan.first}..{plan.last}, "
                      f"{snapshot.records:,} records")  # fmt: skip
                return 0
            if now_plan is None or not now_plan.same_work(plan) or now_plan.state != "running":
                bar.close()
                why = (
                    "removed"
                    if now_plan is None
                    else (now_plan.state if now_plan.same_work(plan) else "replaced by another plan")
                )
                print(f"backfill of {plan.job} {why}: ledgers {plan.first}..{plan.last}, "
                      f"{p.ledgers_done}/{p.total} done, {snapshot.records:,} records")  # fmt: skip
                return 0
            time.sleep(REFRESH)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"\nthe backfill goes on in the cluster (it is the nodes' jobs, not this command's): "
            f"watch it with `ingestion backfill {plan.job} --status`, stop it with "
            f"`ingestion backfill {plan.job} --cancel`", file=sys.stderr,
        )  # fmt: skip
        return 0


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown time"
    return (
        time.strftime("%H:%M:%S", time.gmtime(seconds)) if seconds < 86400 else f"{seconds / 86400:.1f} days"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
