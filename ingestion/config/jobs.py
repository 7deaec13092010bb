"""The jobs a node hosts: ``node.job`` entries and ``[jobs.NAME]`` tables resolved into
:class:`~ingestion.config.sections.JobSettings`, each filled from the [horizon] or [rpc] section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from ingestion.config.checks import (
    check_rpc_filter,
    check_rpc_start_cursor,
    check_sink,
    check_type,
    check_urls,
    did_you_mean,
)
from ingestion.config.schema import JOB_KINDS, JOB_SCHEMA
from ingestion.config.sections import JobSettings


def _check_job_name(name: str, where: str, problems: list[str]) -> bool:
    if not name or any(c in name for c in "{}=,| \t"):
        problems.append(
            f"{where}: a job name must be non-empty, without braces, '=', ',', '|' or spaces, "
            f"got {name!r}"
        )
        return False
    return True


def _check_start_cursor(start: str, where: str, problems: list[str]) -> None:
    if start in ("now", "0"):
        return
    from ingestion.common.paging import InvalidPagingToken, token_key

    try:
        token_key(start)
    except InvalidPagingToken:
        problems.append(f"{where}: must be now, 0 or a paging token, got {start!r}")


def resolve_jobs(
    v: dict[str, dict[str, Any]], tables: Any, problems: list[str]
) -> tuple[JobSettings, ...]:
    """The jobs this node hosts: ``node.job`` entries (NAME or NAME=RESOURCE) if any, else every
    ``[jobs.NAME]`` table, else one job named after ``node.source`` (``horizon`` or ``rpc``); each
    filled from its table, then from the [horizon] (or [rpc]) settings."""
    horizon = v["horizon"]
    if not isinstance(tables, Mapping):
        problems.append("jobs: must be tables, one per job: [jobs.NAME]")
        tables = {}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            problems.append(f"jobs.{name}: must be a table of settings")
    # The default job is named after its source, so that a Horizon and an RPC node never share one.
    entries = list(v["node"]["job"]) or list(tables) or [v["node"]["source"]]
    jobs: list[JobSettings] = []
    seen: set[str] = set()
    for entry in entries:
        name, eq, flag_resource = entry.partition("=")
        name = name.strip()
        if not _check_job_name(name, "node.job", problems):
            continue
        if name in seen:
            problems.append(f"node.job: job {name!r} is given twice")
            continue
        seen.add(name)
        table = tables.get(name, {})
        table = table if isinstance(table, Mapping) else {}
        given: dict[str, Any] = {}
        for key, value in table.items():
            if key not in JOB_SCHEMA:
                problems.append(f"jobs.{name}.{key}: unknown setting{did_you_mean(key, JOB_SCHEMA)}")
                continue
            checked = check_type(f"jobs.{name}.{key}", JOB_SCHEMA[key][0], value, problems)
            if checked is not None:
                given[key] = checked
        kind = given.get("kind", v["node"]["source"])
        resource = flag_resource.strip() if eq else given.get("resource", horizon["resource"])
        start = given.get("start_cursor", horizon["start_cursor"])
        urls = tuple(given.get("horizon", horizon["urls"]))
        if kind not in JOB_KINDS:
            problems.append(f"jobs.{name}.kind: must be one of {', '.join(JOB_KINDS)}, got {kind!r}")
            continue
        if kind == "horizon":
            # What comes from the [horizon] section was checked there.
            if eq and not resource:
                problems.append(f"node.job: {entry!r} names no resource after '='")
            elif (eq or "resource" in given) and not resource.startswith("/"):
                where = "node.job" if eq else f"jobs.{name}.resource"
                problems.append(f"{where}: must be a path such as /operations, got {resource!r}")
            if "start_cursor" in given:
                _check_start_cursor(start, f"jobs.{name}.start_cursor", problems)
            if "horizon" in given:
                for url in urls:
                    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                        problems.append(f"jobs.{name}.horizon: not an http(s) URL: {url!r}")
                if not urls:
                    problems.append(f"jobs.{name}.horizon: at least one Horizon URL is needed")
            jobs.append(JobSettings(name, kind, resource, start, urls))
            continue
        if kind in ("rpc", "lake"):
            job = _rpc_job(name, entry if eq else "", given, v["rpc"], problems, kind)
            if kind == "lake":
                job = _lake_job(job, given, v["lake"], problems)
            jobs.append(job)
            continue
        action, period = given.get("action", ""), given.get("period_ms", 0)
        if eq:
            problems.append(f"node.job: {entry!r}: a scheduled job takes no resource")
        if not _importable(action):
            problems.append(
                f"jobs.{name}.action: must name an importable async function as module:function, "
                f"got {action!r}"
            )
        if period <= 0:
            problems.append(f"jobs.{name}.period_ms: must be positive, got {period}")
        jobs.append(JobSettings(name, kind, "", "0", (), action, period))
    return tuple(_with_sink(j, tables, v["sink"]["url"], problems) for j in jobs)


def _with_sink(job: JobSettings, tables: Mapping[str, Any], default: str, problems: list[str]) -> JobSettings:
    """The job with its sink: its table's ``sink``, else ``sink.url``."""
    table = tables.get(job.name, {})
    sink = table.get("sink", default) if isinstance(table, Mapping) else default
    if not isinstance(sink, str):
        return job  # reported by the type check
    if isinstance(table, Mapping) and "sink" in table:
        check_sink(sink, f"jobs.{job.name}.sink", problems)
    return attrs.evolve(job, sink=sink)


def _lake_job(
    job: JobSettings, given: Mapping[str, Any], lake: Mapping[str, Any], problems: list[str]
) -> JobSettings:
    """A lake job: an rpc job's filter and start cursor, and a lake URL (its table's ``lake``, else
    ``lake.url``)."""
    from ingestion.lake.store import check_lake_url

    url = given.get("lake", lake["url"])
    problem = check_lake_url(url)
    if problem:
        problems.append(f"{f'jobs.{job.name}.lake' if 'lake' in given else 'lake.url'}: {problem}")
    return attrs.evolve(job, rpc_urls=(), lake_url=url)


def _rpc_job(
    name: str, entry: str, given: Mapping[str, Any], rpc: Mapping[str, Any], problems: list[str],
    kind: str = "rpc",
) -> JobSettings:  # fmt: skip
    """An rpc job (or a lake job: the same events) from its table (``given``) and the [rpc]
    section; what the section gives was checked there."""
    if entry:
        problems.append(f"node.job: {entry!r}: an {kind} job takes no resource (it follows getEvents)")
    start = given.get("start_cursor", rpc["start_cursor"])
    where = f"jobs.{name}.start_cursor" if "start_cursor" in given else "rpc.start_cursor"
    check_rpc_start_cursor(start, where, problems)
    urls = tuple(given.get("rpc", rpc["urls"]))
    if "rpc" in given:
        check_urls(urls, f"jobs.{name}.rpc", "Stellar RPC", problems)
    job = JobSettings(
        name, kind, "", start, (),
        rpc_urls=urls,
        event_type=given.get("event_type", rpc["event_type"]),
        contract_ids=tuple(given.get("contract_ids", rpc["contract_ids"])),
        topics=tuple(given.get("topics", rpc["topics"])),
    )  # fmt: skip
    if any(k in given for k in ("event_type", "contract_ids", "topics")):
        check_rpc_filter(job, f"jobs.{name}", problems)
    return job


def _importable(spec: str) -> bool:
    return load_action(spec) is not None


def load_action(spec: str) -> Any:
    """The callable named ``module:function``, or None when it cannot be imported."""
    import importlib

    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    fn = getattr(module, attr, None)
    return fn if callable(fn) else None
