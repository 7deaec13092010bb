"""``ingestion verify``: check a configured job's events stream (or its PostgreSQL rows) against its
source, with :mod:`ingestion.verify`. Exit 0: exactly once; 1: a problem (listed) or the source,
Redis or PostgreSQL could not be read; 2: usage."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import trio

from actors.lease_store import connect, describe_redis_error, job_keys
from ingestion.cli.usage import OneLineParser, UsageError, quiet_logs, setting_help, settings_of_flags
from ingestion.common.http import SourceUnreadable
from ingestion.common.redact import redact
from ingestion.config import load, redact_url
from ingestion.verify import verify_configured_job


def parser() -> Any:
    p = OneLineParser(
        prog="ingestion verify",
        description="Check a job's events stream against its source: every source record exactly "
        "once, in order, as the source serves it, each written under the fencing token then current "
        "(a job whose sink is PostgreSQL: its rows there, judged by the fence history). Exit 0: OK; "
        "1: a problem (listed) or the source, Redis or PostgreSQL could not be read; 2: usage.",
    )
    p.add_argument("--config", metavar="PATH", help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    p.add_argument("--sink", metavar="URL", help=setting_help(
        "a PostgreSQL sink: check the job's rows there, judged by its fence history", ("sink", "url")
    ))
    p.add_argument(
        "--job", metavar="NAME",
        help="the job to check, as configured (kind, resource or filter, start cursor) (default: "
        "the first configured job)",
    )  # fmt: skip
    p.add_argument("--source", choices=("horizon", "rpc"), help=setting_help(
        "the job's kind, when no [jobs.NAME] table says", ("node", "source")
    ))
    p.add_argument("--horizon", metavar="URL", help="the Horizon to compare with (default: the job's first)")
    p.add_argument("--rpc", metavar="URL", help="the Stellar RPC to compare with (default: the job's first)")
    p.add_argument("--resource", metavar="PATH", help=setting_help(
        "a Horizon job's collection", ("horizon", "resource")
    ))
    p.add_argument("--start-cursor", metavar="CURSOR", help=setting_help(
        "where the job started", ("horizon", "start_cursor"), ("rpc", "start_cursor")
    ))
    p.add_argument("--topic", action="append", metavar="SEG[,SEG...]", help=setting_help(
        "an RPC job's topic filter (repeatable)", ("rpc", "topics")
    ))
    p.add_argument("--contract-id", action="append", metavar="C", help=setting_help(
        "an RPC job's contract filter (repeatable)", ("rpc", "contract_ids")
    ))
    p.add_argument("--event-type", choices=("contract", "system"), help=setting_help(
        "an RPC job's event type filter", ("rpc", "event_type")
    ))
    return p


def main(argv: Sequence[str]) -> int:
    """Run ``verify`` with these flags; returns the exit status.

    Raises:
        ConfigError, UsageError: a bad setting or flag (the CLI prints it and exits 2).
    """
    ns = parser().parse_args(list(argv))
    quiet_logs()
    # --horizon and --rpc: the source to compare with, not the jobs' URLs
    flags = settings_of_flags(ns, besides={("horizon", "urls"), ("rpc", "urls")})
    settings = load(Path(ns.config) if ns.config else None, os.environ, flags)
    job: Any = settings.jobs[0]
    asked_horizon = ns.source or ns.horizon or ns.resource
    recorded = None if asked_horizon or job.kind != "horizon" else _recorded_rpc_filters(settings, job.name)
    if recorded is not None:
        # A job run with --source rpc and its filters on the command line: Redis recorded what it
        # follows (its first term did), so verify needs no more than the RPC's URL again.
        flags = {**flags, "node": {**flags.get("node", {}), "source": "rpc"}}
        settings = load(Path(ns.config) if ns.config else None, os.environ, flags)
        job = settings.jobs[0]
        if not job.rpc_filters():
            job = _WithFilters(job, recorded)
    if job.kind not in ("horizon", "rpc"):
        raise UsageError(f"verify: job {job.name!r} is {job.kind}: only Horizon and RPC jobs have a source")
    url = (ns.rpc or job.rpc_urls[0]) if job.kind == "rpc" else (ns.horizon or job.horizon_urls[0])
    if job.sink:
        return _verify_postgres_job(settings, job, url)

    where = redact_url(settings.redis.url)

    def known() -> None:
        client = connect(settings.redis.url, timeout=5.0)
        try:
            exists = client.exists(*job_keys(job.name).values())
        finally:
            client.close()
        if not exists:
            raise UsageError(
                f"verify: no job {job.name!r} at {where}: nothing was ever elected or committed "
                "for it (check --job and --redis)"
            )

    return _verify_and_say(
        settings, job, url, known, redis.RedisError, lambda exc: describe_redis_error(exc, where=where)
    )


class _WithFilters:
    """A job as configured, with the getEvents filters its first term recorded in Redis."""

    def __init__(self, job: Any, filters: tuple[Any, ...]) -> None:
        self._job, self._filters = job, filters

    def rpc_filters(self) -> tuple[Any, ...]:
        return self._filters

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)


def _recorded_rpc_filters(settings: Any, job: str) -> tuple[Any, ...] | None:
    """The filters of ``job`` when Redis records that it follows Stellar RPC (``rpc [...]`` or
    ``rpc (every event)``), else None (not recorded, another source, Redis unreadable: the
    configuration stands, and verify says what it finds)."""
    from ingestion.rpc.protocol import EventFilter, RpcError  # lazy: CLI start-up (rpc.protocol, ~5 ms)

    try:
        client = connect(settings.redis.url, timeout=5.0)
        try:
            source = client.hget(job_keys(job)["cursor"], "source")
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return None
    text = source.decode() if isinstance(source, bytes) else source
    if not isinstance(text, str) or not text.startswith("rpc "):
        return None
    rest = text[len("rpc "):]
    if rest == "(every event)":
        return ()
    try:
        return tuple(EventFilter.from_json(f) for f in json.loads(rest))
    except (ValueError, TypeError, AttributeError, KeyError, RpcError):
        return None


def _verify_and_say(
    settings: Any,
    job: Any,
    url: str,
    known: Callable[[], None],
    store_error: type[Exception],
    describe_store: Callable[[Any], str],
) -> int:
    """``verify`` of a job whose store ``known()`` has checked knows it (else it raises
    UsageError): the summary, exit 0 or 1; the store (``store_error``, said by
    ``describe_store``) or the source unreadable: one line, exit 1."""
    from ingestion.node.build import watch_source  # lazy: CLI start-up (~170 ms)

    try:
        known()
        # the job's watch list as it stands now: the records it keeps are the ones to find
        result = trio.run(verify_configured_job, settings, job, url, watch_source(settings, job))
    except store_error as exc:
        print(f"ingestion: verify: {describe_store(exc)}", file=sys.stderr)
        return 1
    except SourceUnreadable as exc:  # (what went wrong, said by the source's package)
        print(redact(f"ingestion: verify: cannot read {url}: {exc}"), file=sys.stderr)
        return 1
    except (RuntimeError, KeyError, ValueError) as exc:
        print(redact(f"ingestion: verify: cannot read {url}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    print(f"job {job.name} ({job.kind}, {redact(url)}): {result.summary()}")
    return 0 if result.ok else 1


def _verify_postgres_job(settings: Any, job: Any, url: str) -> int:
    """``verify`` of a job whose sink is PostgreSQL: its rows there against the source, judged
    by the fence history. Exit 0, 1 (a problem, or PostgreSQL or the source unreadable), or
    :class:`~ingestion.cli.usage.UsageError` (2) for a job PostgreSQL knows nothing of."""
    import psycopg  # lazy: CLI start-up (~140 ms)

    from ingestion.postgres.connection import describe, redact  # lazy: CLI start-up (psycopg, ~140 ms)
    from ingestion.postgres.readers import job_known, job_state  # lazy: CLI start-up (psycopg, ~140 ms)

    schema = settings.sink.schema

    def known() -> None:
        if not job_known(job_state(job.sink, schema, job.name)):
            raise UsageError(
                f"verify: no job {job.name!r} in schema {schema} at {redact(job.sink)}: nothing was "
                "ever committed for it (check --job, --sink and sink.schema)"
            )

    return _verify_and_say(settings, job, url, known, psycopg.Error, lambda exc: describe(exc, job.sink))
