"""The jobs a node hosts: ``node.job`` entries and ``[jobs.NAME]`` tables resolved into
:class:`~ingestion.config.sections.JobSettings`, each filled from the [horizon] or [rpc] section."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

import attrs

from ingestion.common.http import is_http_url
from ingestion.common.paging import InvalidPagingToken, token_key
from ingestion.config.checks import (
    check_rpc_filter,
    check_rpc_start_cursor,
    check_sink,
    check_type,
    check_urls,
    did_you_mean,
)
from ingestion.config.schema import JOB_KINDS, JOB_SCHEMA
from ingestion.config.sections import JobSettings, WebhookSettings


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

    try:
        token_key(start)
    except InvalidPagingToken:
        problems.append(f"{where}: must be now, 0 or a paging token, got {start!r}")


def resolve_jobs(
    v: dict[str, dict[str, Any]], tables: Any, problems: list[str], secrets: Mapping[str, str] | None = None
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
                check_urls(urls, f"jobs.{name}.horizon", "Horizon", problems)
            job = _with_events(JobSettings(name, kind, resource, start, urls), given, problems)
            jobs.append(_with_network(job, given, v["network"]))
            continue
        if kind in ("rpc", "lake"):
            job = _rpc_job(name, entry if eq else "", given, v["rpc"], problems, kind)
            if kind == "lake":
                job = _lake_job(job, given, v["lake"], problems)
            jobs.append(_with_network(_with_events(job, given, problems), given, v["network"]))
            continue
        events_only = sorted(k for k in given if k in EVENTS_KEYS)
        if events_only:
            problems.append(f"jobs.{name}: {', '.join(events_only)} apply to horizon, rpc and lake jobs only")
        if kind == "webhook":
            if eq:
                problems.append(f"node.job: {entry!r}: a webhook job takes no resource")
            secret = (secrets or {}).get(name.upper().replace("-", "_"))
            jobs.append(_webhook_job(name, given, tables, v, secret, problems))
            continue
        if kind == "audit":
            if eq:
                problems.append(f"node.job: {entry!r}: an audit job takes no resource")
            jobs.append(_audit_job(name, given, problems))
            continue
        audit_only = sorted(k for k in given if k in AUDIT_KEYS)
        if audit_only:
            problems.append(f"jobs.{name}: {', '.join(audit_only)} apply to audit jobs only")
        webhook_only = sorted(k for k in given if k in WEBHOOK_KEYS)
        if webhook_only:
            problems.append(f"jobs.{name}: {', '.join(webhook_only)} apply to webhook jobs only")
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
    resolved = [
        j if j.kind in ("webhook", "audit") else _with_sink(j, tables, v["sink"]["url"], problems)
        for j in jobs
    ]
    _check_audits(resolved, v["rpc"]["lake"], problems)
    return tuple(_with_api_projector(resolved, v, seen, problems))


AUDIT_KEYS = ("audits", "every_ms", "window")


def _audit_job(name: str, given: Mapping[str, Any], problems: list[str]) -> JobSettings:
    """An audit job from its table (its audited job is checked once every job is resolved)."""
    where = f"jobs.{name}"
    for key in sorted(given):
        if key not in ("kind", "audits", "lake", "every_ms", "window"):
            problems.append(f"{where}.{key}: does not apply to an audit job")
    every, window = given.get("every_ms", 10_000), given.get("window", 64)
    for key, value in (("every_ms", every), ("window", window)):
        if value < 1:
            problems.append(f"{where}.{key}: must be at least 1, got {value}")
    lake = given.get("lake", "")
    if lake:
        from ingestion.lake.store import check_lake_url  # lazy: CLI start-up (lake.store, ~8 ms)

        problem = check_lake_url(lake)
        if problem:
            problems.append(f"{where}.lake: {problem}")
    return JobSettings(
        name, "audit", "", "0", (), period_ms=every, lake_url=lake, audits=given.get("audits", ""),
        audit_window=window,
    )  # fmt: skip


def _check_audits(jobs: list[JobSettings], rpc_lake: str, problems: list[str]) -> None:
    """Each audit job names an rpc or lake job of these jobs, and has a lake to read."""
    by_name = {j.name: j for j in jobs}
    for job in jobs:
        if job.kind != "audit":
            continue
        audited = by_name.get(job.audits)
        if audited is None or audited.kind not in ("rpc", "lake"):
            what = "no job of this configuration" if audited is None else f"a {audited.kind} job"
            problems.append(
                f"jobs.{job.name}.audits: must name an rpc or lake job of this configuration, "
                f"got {job.audits!r} ({what})"
            )
        elif not (job.lake_url or (audited.lake_url if audited.kind == "lake" else rpc_lake)):
            problems.append(
                f"jobs.{job.name}.lake: {job.audits} is an rpc job: give the lake to audit against"
            )


API_PROJECTOR_ACTION = "ingestion.api.projector:project"  # (built from the settings by the node)


def _with_api_projector(
    jobs: list[JobSettings], v: dict[str, dict[str, Any]], seen: set[str], problems: list[str]
) -> list[JobSettings]:
    """The jobs, and with ``[api] job = VIEW`` the projector job ``api.VIEW`` that keeps the
    events API's store (a scheduled job on the view's PostgreSQL sink: docs/API.md)."""
    view = v["api"]["job"]
    if not view:
        return jobs
    name = f"api.{view}"
    if not _check_job_name(view, "api.job", problems):
        return jobs
    if name in seen:
        problems.append(f"api.job: the events API's projector job {name!r} is configured already")
        return jobs
    sink = next((j.sink for j in jobs if j.name == view), v["sink"]["url"])
    if not sink.startswith(("postgres://", "postgresql://")):
        problems.append(
            f"api.job: the events API serves a job whose sink is PostgreSQL; {view!r} commits to "
            'the Redis events stream (give it a sink = "postgresql://...", or sink.url)'
        )
        return jobs
    return [*jobs, JobSettings(name, "scheduled", "", "0", (), API_PROJECTOR_ACTION, 1, sink=sink)]


EVENTS_KEYS = ("decode", "watch", "watch_file", "watch_set", "network")


def _with_network(job: JobSettings, given: Mapping[str, Any], network: Mapping[str, Any]) -> JobSettings:
    """The job with its network's passphrase (its table's ``network``, else ``network.passphrase``;
    pubnet, testnet and futurenet by name)."""
    from ingestion.common.network import passphrase_of  # lazy: CLI start-up (~2 ms)

    return attrs.evolve(job, network=passphrase_of(str(given.get("network", network["passphrase"]))))


def _with_events(job: JobSettings, given: Mapping[str, Any], problems: list[str]) -> JobSettings:
    """The job with its decoding and watch-list settings, the inline list's addresses checked (a
    file's are checked when the node loads it: it may change while the node runs)."""
    from ingestion.watchlist.addresses import address_problem  # lazy: CLI start-up (structlog, ~30 ms)

    where = f"jobs.{job.name}"
    watch = tuple(a.strip() for a in given.get("watch", ()))
    for address in watch:
        problem = address_problem(address)
        if problem:
            problems.append(f"{where}.watch: {problem}")
    sources = [k for k in ("watch", "watch_file", "watch_set") if given.get(k)]
    if len(sources) > 1:
        problems.append(f"{where}: {' and '.join(sources)} both name the watch list: keep one")
    return attrs.evolve(
        job, decode=given.get("decode", True), watch=watch, watch_file=given.get("watch_file", ""),
        watch_set=given.get("watch_set", False),
    )  # fmt: skip


WEBHOOK_KEYS = (
    "from", "url", "secret", "secret_file", "start", "batch", "concurrency", "retry_schedule",
    "retry_probe_max_ms", "max_age_ms", "on_exhausted", "max_dead_letters", "connect_timeout_ms",
    "timeout_ms", "ca_file",
)  # fmt: skip


def _webhook_job(
    name: str, given: Mapping[str, Any], tables: Mapping[str, Any], v: dict[str, dict[str, Any]],
    env_secret: str | None, problems: list[str],
) -> JobSettings:  # fmt: skip
    """A webhook job from its table: the source job (``from``, a job of this configuration), the
    endpoint, the secret (``secret``, ``secret_file`` or the environment) and the delivery rules."""
    from ingestion.webhook.core import (  # lazy: CLI start-up (~3 ms)
        DEFAULT_SCHEDULE,
        ON_EXHAUSTED,
        PROBE_MAX,
        parse_duration,
        parse_secrets,
    )

    where = f"jobs.{name}"
    for key in ("resource", "horizon", "rpc", "lake", "event_type", "contract_ids", "topics", "action",
                "period_ms", "start_cursor", "sink"):  # fmt: skip
        if key in given:
            problems.append(f"{where}.{key}: does not apply to a webhook job")
    source = given.get("from", "")
    source_kind, source_sink = "", v["sink"]["url"]
    table = tables.get(source) if source else None
    if not source:
        problems.append(f"{where}.from: names the job whose records are delivered (from = \"JOB\")")
    elif source == name:
        problems.append(f"{where}.from: a webhook job cannot deliver its own records")
    elif isinstance(table, Mapping):
        source_kind = str(table.get("kind", v["node"]["source"]))
        source_sink = str(table.get("sink", source_sink))
    elif not tables and source == v["node"]["source"]:
        source_kind = source
    else:
        problems.append(f"{where}.from: no job named {source!r} in this configuration ([jobs.{source}])")
    if source_kind == "webhook":
        problems.append(f"{where}.from: {source!r} is a webhook job; deliver the job it delivers instead")
    url = given.get("url", "")
    if not is_http_url(url):
        problems.append(f"{where}.url: must be an http(s) URL, got {url!r}")
    secret = env_secret if env_secret is not None else given.get("secret", "")
    if "secret_file" in given and env_secret is None:
        if "secret" in given:
            problems.append(f"{where}: give secret or secret_file, not both")
        try:
            with open(given["secret_file"], encoding="utf-8") as f:
                secret = f.readline().strip()
        except OSError as exc:
            problems.append(f"{where}.secret_file: cannot read {given['secret_file']}: {exc.strerror}")
            secret = None
    if secret is not None:
        try:
            parse_secrets(secret)
        except ValueError as exc:
            problems.append(f"{where}.secret: {exc}")
    schedule = tuple(given.get("retry_schedule", DEFAULT_SCHEDULE))
    for text in schedule:
        try:
            parse_duration(text)
        except ValueError as exc:
            problems.append(f"{where}.retry_schedule: {exc}")
    start = given.get("start", "now")
    start_cursor = {"first": "0", "now": "now"}.get(start)
    if start_cursor is None:
        try:
            token_key(start)
            start_cursor = start
        except InvalidPagingToken:
            problems.append(f"{where}.start: must be first, now or a record id, got {start!r}")
            start_cursor = "now"
    on_exhausted = given.get("on_exhausted", "dead-letter")
    if on_exhausted not in ON_EXHAUSTED:
        choices = ", ".join(ON_EXHAUSTED)
        problems.append(f"{where}.on_exhausted: must be one of {choices}, got {on_exhausted!r}")
    for key, low in (("batch", 1), ("concurrency", 1), ("connect_timeout_ms", 1), ("timeout_ms", 1),
                     ("max_age_ms", 0), ("retry_probe_max_ms", 0), ("max_dead_letters", 0)):  # fmt: skip
        if key in given and given[key] < low:
            problems.append(f"{where}.{key}: must be at least {low}, got {given[key]}")
    ca_file = given.get("ca_file", "")
    if ca_file:
        if not os.path.isfile(ca_file):
            problems.append(f"{where}.ca_file: no such file: {ca_file}")
    hook = WebhookSettings(
        source_job=source, source_kind=source_kind, url=url, secret=secret or "", batch=given.get("batch", 1),
        concurrency=given.get("concurrency", 1), retry_schedule=schedule,
        retry_probe_max_ms=given.get("retry_probe_max_ms", int(PROBE_MAX * 1000)),
        max_age_ms=given.get("max_age_ms", 0), on_exhausted=on_exhausted,
        max_dead_letters=given.get("max_dead_letters", 0),
        connect_timeout_ms=given.get("connect_timeout_ms", 2000), timeout_ms=given.get("timeout_ms", 15000),
        ca_file=ca_file,
    )  # fmt: skip
    return JobSettings(
        name, "webhook", "", start_cursor, (), sink="", webhook=hook, source_sink=source_sink
    )


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
    from ingestion.lake.store import check_lake_url  # lazy: CLI start-up (lake.store, ~8 ms)

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
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    fn = getattr(module, attr, None)
    return fn if callable(fn) else None
