"""``ingestion audit``: a job's store checked against the data lake, read again (:mod:`ingestion.audit`).

``ingestion audit JOB --from A --to B [--lake URL]`` recomputes from the lake what the store of
JOB (an rpc or lake job of the configuration) must hold for ledgers ``A..B``, its filters and
watch list applied, and compares it by id and content with what the store holds there: the job's
rows and its backfill ranges' (``JOB~FIRST-LAST``), in PostgreSQL (its ``sink``) or in Redis
streams. Every missing, extra, duplicated and differing record is named. After an operator's
``ingestion cursor reset`` (a network reset) the job's rows before the move are of the chain
before: the move's ``cursor-reset`` entry in the job's audit stream names the seam, and the
report names it too instead of counting those rows as findings (:mod:`ingestion.audit.seams`).

Exit 0: equal; 1: not equal (the findings listed), or the lake or the store could not be read
(one line); 2: usage (one line, nothing read).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ingestion.cli.usage import OneLineParser, UsageError, flags_layer, setting_help
from ingestion.common.redact import redact


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion audit",
        description="Check an rpc or lake job's store against the data lake: what the job must "
        "hold for ledgers FROM..TO (its filters and watch list applied), recomputed from the lake, "
        "against what its store holds there (the job's rows and its backfill ranges'), by id and "
        "content; every missing, extra, duplicated and differing record named. Exit 0: equal; 1: "
        "not equal, or the lake or the store could not be read; 2: usage.",
    )
    p.add_argument("job", help="the job (an rpc or lake job of the configuration)")
    p.add_argument("--from", dest="first", type=int, metavar="LEDGER", required=True, help="the first ledger")
    p.add_argument("--to", dest="last", type=int, metavar="LEDGER", required=True, help="the last ledger")
    p.add_argument(
        "--lake", metavar="URL",
        help="the lake to read (a directory, file://PATH or s3://BUCKET/PREFIX) (default: a lake "
        "job's own lake; an rpc job's rpc.lake)",
    )  # fmt: skip
    p.add_argument(
        "--rpc", metavar="URL",
        help="recompute from this Stellar RPC instead of the lake (ledgers inside its window only)",
    )  # fmt: skip
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    p.add_argument(
        "--sink",
        metavar="URL",
        help=setting_help("a PostgreSQL sink: audit the job's rows there", ("sink", "url")),
    )
    p.add_argument(
        "--processes", type=int, metavar="N",
        help="worker processes decoding the lake in parallel (0: a thread of this process) (default: "
        "the cores this command may use)",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=64, metavar="LEDGERS",
                   help="ledgers compared at a time (bounds the memory) (default: 64)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p


def main(argv: Sequence[str]) -> int:
    """Run ``audit`` with these flags; returns the exit status.

    Raises:
        ConfigError, UsageError: a bad setting or flag (the CLI prints it and exits 2).
    """
    from ingestion.config import load  # lazy: CLI start-up

    ns = parser().parse_args(list(argv))
    flags = flags_layer({("redis", "url"): ns.redis, ("sink", "url"): ns.sink})
    settings = load(ns.config, os.environ, flags)
    jobs = {j.name: j for j in settings.jobs}
    job = jobs.get(ns.job)
    if job is None:
        raise UsageError(f"audit: no job named {ns.job!r} in this configuration (jobs: {', '.join(jobs)})")
    if job.kind not in ("rpc", "lake"):
        raise UsageError(
            f"audit: job {ns.job!r} is a {job.kind} job: only rpc and lake jobs are audited against a lake"
        )
    if ns.first < 1 or ns.last < ns.first:
        raise UsageError(f"audit: --from {ns.first} --to {ns.last} is no span of ledgers (1 <= FROM <= TO)")
    processes = ns.processes if ns.processes is not None else len(os.sched_getaffinity(0))
    if processes < 0 or ns.window < 1:
        raise UsageError("audit: --processes must be at least 0 and --window at least 1")
    if ns.rpc:
        if ns.lake:
            raise UsageError("audit: give --lake or --rpc, not both")
        return _audit(ns, settings, job, None, processes)
    lake_url = ns.lake or (job.lake_url if job.kind == "lake" else settings.rpc.lake)
    if not lake_url:
        raise UsageError(
            f"audit: job {job.name} is an rpc job: give --lake URL (or set rpc.lake), or --rpc URL"
        )
    from ingestion.lake.store import check_lake_url, open_lake  # lazy: CLI start-up

    problem = check_lake_url(lake_url)
    if problem:
        raise UsageError(f"audit: --lake {problem}")
    lake = open_lake(lake_url, settings.lake.endpoint_url)
    return _audit(ns, settings, job, lake, processes)


def _audit(ns: argparse.Namespace, settings: Any, job: Any, lake: Any, processes: int) -> int:
    import psycopg  # lazy: CLI start-up
    import redis  # lazy: CLI start-up
    import trio  # lazy: CLI start-up

    from ingestion.audit.expect import Rules  # lazy: CLI start-up
    from ingestion.audit.from_rpc import rpc_expectation  # lazy: CLI start-up
    from ingestion.audit.runner import AuditError, audit_lake, audit_windows  # lazy: CLI start-up
    from ingestion.audit.store import PostgresRows, RedisRows  # lazy: CLI start-up
    from ingestion.decode.stage import rule_for  # lazy: CLI start-up
    from ingestion.node.build import watch_source  # lazy: CLI start-up
    from ingestion.watchlist.lists import WatchUnavailable  # lazy: CLI start-up

    client = None
    store: PostgresRows | RedisRows
    if job.sink:
        store, where = (
            PostgresRows(job.sink, settings.sink.schema, job.name, ns.last),
            f"PostgreSQL {redact(job.sink)}",
        )
    else:
        client = settings.redis.connect()
        store, where = RedisRows(client, job.name, ns.first, ns.last), f"Redis {redact(settings.redis.url)}"
    try:
        found = store.find_jobs()
    except (psycopg.Error, redis.RedisError, OSError) as exc:
        print(redact(f"ingestion: audit: {where} cannot be read: {exc}"), file=sys.stderr)
        return 1
    if not found:
        raise UsageError(
            f"audit: no job {job.name!r} in {where}: nothing was ever committed for it or its "
            "backfills (check the job, --sink, --redis and sink.schema)"
        )
    seam = _seam(client, settings, job.name)
    watch = watch_source(settings, job)
    _rule, changes = rule_for(job.kind, job.resource, names=watch is not None)
    rules = Rules(job.rpc_filters(), decode=job.decode and changes, names=watch is not None)

    errors = (psycopg.Error, redis.RedisError, OSError)

    async def run() -> Any:
        watched = None if watch is None else await watch.current()
        if lake is None:
            expect = functools.partial(rpc_expectation, ns.rpc, rules)
            return await audit_windows(
                expect, store, job.name, ns.first, ns.last, watched=watched, window=ns.window,
                store_errors=errors, source=f"the RPC {redact(ns.rpc)}", seam=seam, start=job.start_cursor,
            )  # fmt: skip
        return await audit_lake(
            lake, rules, store, job.name, ns.first, ns.last, watched=watched, processes=processes,
            window=ns.window, store_errors=errors, seam=seam, start=job.start_cursor,
        )  # fmt: skip

    started = time.monotonic()
    try:
        report = trio.run(run)
    except (AuditError, WatchUnavailable) as exc:
        print(redact(f"ingestion: audit: {exc}"), file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
        if isinstance(store, PostgresRows):
            store.close()
    seconds = time.monotonic() - started
    ledgers = ns.last - ns.first + 1
    if ns.json:
        out = report.to_json() | {"seconds": round(seconds, 3), "ledgers_per_s": round(ledgers / seconds, 1)}
        print(json.dumps(out))
    else:
        print(report.summary())
        rate = f"{ledgers / seconds:.1f} ledgers/s" + (f", {processes} decode processes" if lake else "")
        of = redact(str(lake) if lake is not None else ns.rpc)
        print(f"{ledgers} ledgers of {of} in {seconds:.1f} s ({rate}) against {where}")
    return 0 if report.equal else 1


def _seam(client: Any, settings: Any, job: str) -> Any:
    """The job's last cursor reset, from its audit stream in Redis (None: none, or Redis cannot be
    read: then said on stderr, and the rows of a chain before a reset, if any, count as findings)."""
    import redis  # lazy: CLI start-up

    from actors.lease_store import job_keys  # lazy: CLI start-up
    from ingestion.audit.seams import latest_seam  # lazy: CLI start-up

    own = client is None
    try:
        client = client or settings.redis.connect()
        entries: Any = client.xrange(job_keys(job)["audit"])
        text = [(_str(i), {_str(k): _str(v) for k, v in f.items()}) for i, f in entries]
        return latest_seam(text)
    except (redis.RedisError, OSError) as exc:
        print(redact(f"ingestion: audit: the job's audit stream in Redis cannot be read ({exc}): "
                     "a cursor reset's seam, if any, is not known"), file=sys.stderr)  # fmt: skip
        return None
    finally:
        if own and client is not None:
            client.close()


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
