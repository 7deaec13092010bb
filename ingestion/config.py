"""Configuration: built-in defaults < ``config.toml`` < ``INGESTION_<SECTION>_<KEY>`` < flags.

Parsed into frozen attrs values. Every problem is reported as one line naming the setting
(``lease.ttl_ms: ...``) and all problems are reported together; the CLI exits with status 2.
Settings whose default is ``0`` marked *auto* are derived from the lease TTL, so that changing only
the TTL always gives a consistent configuration.

Relations checked between settings, and why:

- ``lease.renew_interval_ms < lease.ttl_ms * (1 - clock_drift) - safety_margin_ms``: a renewal must
  be possible before the ingest deadline, or every term ends at its first deadline.
- ``redis.timeout_ms < lease.safety_margin_ms``: the commit (the only write on the data path) is
  the one call that may still be in flight at the ingest deadline; bounding it by the margin means it
  is answered or abandoned before the lease could expire.
- Horizon HTTP timeouts are *not* bound by the margin, on purpose: every HTTP call runs inside the
  lease's cancel scope and is cancelled at the ingest deadline whatever its timeout, and nothing it
  does is visible outside the node until a fenced commit. Its timeouts only decide how fast a
  healthy leader gives up on a dead Horizon URL; the only check is ``retry_cap_ms >= retry_base_ms``.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import redis

from actors.lease import LeaseTiming
from actors.lease_store import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    BadRedisUrl,
    connect,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
)


class ConfigError(Exception):
    """One or more settings are wrong; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|pass|auth)=)[^&#]*")


def redact_url(url: str) -> str:
    """The URL with any password (``user:password@`` or ``?password=``) replaced by ``***``.

    Never raises, whatever the text: it is used on settings that failed validation too.
    """
    scheme, sep, rest = url.partition("://")
    if sep:
        netloc, slash, path = rest.partition("/")
        userinfo, at, hostport = netloc.rpartition("@")
        if at and ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostport}"
        url = f"{scheme}{sep}{netloc}{slash}{path}"
    return _SECRET_QUERY.sub(r"\1***", url)


# The schema: section -> key -> (type, default, help). Types: int, float, str, list[str], bool.
SCHEMA: dict[str, dict[str, tuple[type | str, Any, str]]] = {
    "node": {
        "id": (str, "", "this node's id in logs and in Redis; empty: <hostname>-<pid>"),
        "job": (
            "list[str]",
            [],
            "the singleton jobs this node hosts, each NAME or NAME=RESOURCE (--job repeated); "
            "empty: every [jobs.NAME] table, or one job named horizon when there is none",
        ),
        "state_dir": (
            str,
            "",
            "directory for the highest fencing token seen, kept across restarts (a file per job; "
            "nodes may share it); empty: memory only",
        ),
        "source": (
            str,
            "horizon",
            "what a job follows unless its [jobs.NAME] table says: horizon (a Horizon collection) "
            "or rpc (Stellar RPC getEvents: contract events)",
        ),
    },
    "redis": {
        "url": (
            str,
            "redis://127.0.0.1:6379/0",
            "redis:// or rediss:// (TLS) URL; user:password@ for an ACL user, :password@ for "
            "requirepass; redis+sentinel://[user:pass@]H:P[,H:P...]/SERVICE[/DB] (rediss+sentinel:// "
            "for TLS) to follow Sentinel's primary; redis+cluster://[user:pass@]H:P[,H:P...] "
            "(rediss+cluster://) for Redis Cluster",
        ),
        "min_replicas_acked": (
            int,
            -1,
            "replicas that must acknowledge (WAIT) each acquire and commit, else it counts as "
            "unknown and the term ends; -1: auto = 1 with Sentinel, 0 otherwise",
        ),
        "timeout_ms": (
            int,
            0,
            "ms, bound on every Redis call; 0: auto = min(500, safety_margin_ms / 2)",
        ),
        "tls_ca_file": (
            str,
            "",
            "CA bundle (PEM) to verify a rediss:// server; empty: system store",
        ),
        "tls_cert_file": (str, "", "client certificate (PEM) for a server with tls-auth-clients"),
        "tls_key_file": (str, "", "private key (PEM) of tls_cert_file"),
    },
    "lease": {
        "ttl_ms": (int, 5000, "ms, lease time-to-live in Redis (100 .. 3600000)"),
        "renew_interval_ms": (int, 0, "ms between renewals; 0: auto = ttl_ms / 5"),
        "safety_margin_ms": (
            int,
            0,
            "ms, ingestion stops this long before the lease could end; 0: auto = ttl_ms / 5",
        ),
        "clock_drift": (
            float,
            0.01,
            "fraction, allowed clock-rate difference between node and Redis (0 .. 0.5)",
        ),
        "standby_jitter_ms": (
            int,
            25,
            "ms, upper bound of the random delay added to a standby's wake-up",
        ),
    },
    "horizon": {
        "urls": ("list[str]", ["http://127.0.0.1:8000"], "Horizon base URLs, tried in order"),
        "resource": (
            str,
            "/operations",
            "collection to ingest, e.g. /payments, /trades, /accounts/G.../effects, "
            "/liquidity_pools/ID/trades; may end in ?include_failed=true and/or join=transactions",
        ),
        "start_cursor": (
            str,
            "now",
            "where a job starts when nothing is committed: now, 0 or a paging token",
        ),
        "connect_timeout_ms": (int, 2000, "ms, HTTP connect timeout"),
        "read_timeout_ms": (int, 30000, "ms, HTTP read timeout for a page request"),
        "stream_idle_timeout_ms": (
            int,
            65000,
            "ms, reconnect a stream silent this long (Horizon closes its own after 55 s)",
        ),
        "retry_base_ms": (int, 200, "ms, first retry delay after a connection error or 5xx"),
        "retry_cap_ms": (int, 10000, "ms, longest retry delay"),
        "failover_after": (int, 3, "count, consecutive failures before moving to the next URL"),
        "parallel_requests": (
            int,
            8,
            "count, page requests in flight at once while catching up a network-wide collection "
            "(ledger ranges paged side by side, committed in order); 1: strictly sequential",
        ),
        "handover_after_ms": (
            int,
            0,
            "ms every request to every Horizon URL may fail before a leader hands the lease to a "
            "node that reaches Horizon (at least lease.ttl_ms); 0: auto = 3 * lease.ttl_ms",
        ),
        "not_found_give_up_ms": (
            int,
            120000,
            "ms, an account-scoped resource answered 404 (an account not ingested yet) is retried "
            "and failed over until every URL has answered 404 this long; then the node exits 1",
        ),
        "stale_check_ms": (
            int,
            30000,
            "ms between reads of every Horizon URL's / to notice that the one in use is stale "
            "(only with several URLs); 0: never",
        ),
        "stale_after_ledgers": (
            int,
            10,
            "the Horizon in use is stale when its history is more than this many ledgers behind "
            "its stellar-core or another URL; the node then moves to the freshest (horizon-stale)",
        ),
        "on_history_gap": (
            str,
            "stop",
            "when the cursor is older than Horizon's retained history (history_elder_ledger): "
            "stop (log history-gap, write nothing, exit 1) or skip (record the gap in the audit "
            "stream and resume from the oldest retained ledger)",
        ),
    },
    "rpc": {
        "urls": (
            "list[str]",
            ["http://127.0.0.1:8001"],
            "Stellar RPC URLs (JSON-RPC), tried in order, for jobs whose source is rpc",
        ),
        "start_cursor": (
            str,
            "now",
            "where an rpc job starts when nothing is committed: now, 0 (the oldest retained "
            "ledger), a ledger number (events from that ledger on) or an event id (after it)",
        ),
        "event_type": (str, "", "getEvents filter: contract, system, or empty for both"),
        "contract_ids": (
            "list[str]",
            [],
            "getEvents filter: contract ids (C...), at most 5; empty: every contract",
        ),
        "topics": (
            "list[str]",
            [],
            "getEvents filter: at most 5 topics, each SEG[,SEG...] (1 to 4 segments, then an optional "
            "**): a base64 ScVal, * (any one segment), ** (any rest), or sym:NAME, str:TEXT, "
            "address:G...|C..., u32:N, i32:N, u64:N, i64:N, u128:N, i128:N, bool:true|false "
            "(INGESTION_RPC_TOPICS: topics separated by ;)",
        ),
        "page_limit": (
            int,
            10000,
            "events per getEvents request (1 .. 10000; halved after a -32001 processing-limit "
            "answer, then restored): pages follow one another, so this sets the catch-up pace",
        ),
        "connect_timeout_ms": (int, 2000, "ms, HTTP connect timeout"),
        "request_timeout_ms": (int, 30000, "ms, the longest one getEvents request may take"),
        "retry_base_ms": (int, 200, "ms, first retry delay after an error"),
        "retry_cap_ms": (int, 10000, "ms, longest retry delay"),
        "failover_after": (int, 3, "count, consecutive failures before moving to the next URL"),
        "on_history_gap": (
            str,
            "stop",
            "when the cursor is older than the RPC's oldest retained ledger: stop (log "
            "history-gap, write nothing, exit 1) or skip (record the gap in the audit stream and "
            "resume from the oldest ledger)",
        ),
        "reset_after_ms": (
            int,
            60000,
            "ms every RPC URL may report a latest ledger below the cursor (a lagging node, or a "
            "network reset) before rpc-network-reset-suspected is logged; the node never jumps",
        ),
    },
    "events": {
        "max_len": (
            int,
            0,
            "keep about this many entries in the events stream, never one a consumer group has "
            "not acknowledged (trimmed in each commit); 0: keep everything (the safe default: "
            "the stream then grows without bound, size Redis for it or set this)",
        ),
    },
    "observe": {
        "listen_host": (str, "127.0.0.1", "address the status and metrics endpoints listen on"),
        "metrics_port": (int, 0, "Prometheus /metrics and /healthz HTTP port; 0: off"),
        "status_port": (
            int,
            0,
            "WebSocket status port (python -m ingestion watch ws://host:port); 0: off",
        ),
    },
    "log": {
        "level": (str, "info", "debug, info, warning or error"),
        "format": (str, "auto", "json, console, or auto (console on a terminal, else json)"),
    },
}

LOG_LEVELS = ("debug", "info", "warning", "error")


@attrs.frozen
class NodeSettings:
    id: str
    jobs: tuple[str, ...]  # the job names this node hosts, in order (see Settings.jobs)
    state_dir: str
    source: str = "horizon"  # the kind of a job whose table does not say

    @property
    def job(self) -> str:
        """The first job: what single-job commands (``tail``) read by default."""
        return self.jobs[0]


JOB_KINDS = ("horizon", "rpc", "scheduled")
# A [jobs.NAME] table: key -> (type, help). Missing keys take the [horizon] (or [rpc]) settings.
JOB_SCHEMA: dict[str, tuple[type | str, str]] = {
    "kind": (
        str,
        "horizon (ingest a Horizon collection), rpc (Stellar RPC contract events) or scheduled "
        "(run an action periodically); default: node.source",
    ),
    "resource": (str, "the Horizon collection (default: horizon.resource)"),
    "start_cursor": (
        str,
        "where the job starts when nothing is committed (default: horizon.start_cursor, or "
        "rpc.start_cursor for an rpc job)",
    ),
    "horizon": ("list[str]", "Horizon base URLs for this job (default: horizon.urls)"),
    "rpc": ("list[str]", "rpc: Stellar RPC URLs for this job (default: rpc.urls)"),
    "event_type": (str, "rpc: contract, system or empty (default: rpc.event_type)"),
    "contract_ids": ("list[str]", "rpc: contract ids to follow (default: rpc.contract_ids)"),
    "topics": ("list[str]", "rpc: topics, each SEG[,SEG...] (default: rpc.topics)"),
    "action": (str, "scheduled: the action to run, module:function (async (run, term) -> dict)"),
    "period_ms": (int, "scheduled: ms between the end of a run and the start of the next"),
}


@attrs.frozen
class JobSettings:
    """One elected job hosted by the node."""

    name: str
    kind: str  # "horizon", "rpc" or "scheduled"
    resource: str
    start_cursor: str
    horizon_urls: tuple[str, ...]
    action: str = ""  # scheduled: "module:function"
    period_ms: int = 0
    rpc_urls: tuple[str, ...] = ()  # rpc: the URLs and the getEvents filter
    event_type: str = ""
    contract_ids: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()  # each "SEG[,SEG...]" as written

    def rpc_filters(self) -> tuple[Any, ...]:
        """The job's getEvents filters (:class:`ingestion.rpc.protocol.EventFilter`): one filter
        of the type, contract ids and topics given, or none (every event) when none is given.

        Raises:
            ValueError: a topic segment that is not a valid ScVal or wildcard.
        """
        from ingestion.rpc.protocol import EventFilter, topic_from_text

        if not (self.event_type or self.contract_ids or self.topics):
            return ()
        types = (self.event_type,) if self.event_type else ()
        return (EventFilter(types, self.contract_ids, tuple(topic_from_text(t) for t in self.topics)),)


@attrs.frozen
class RedisSettings:
    url: str
    timeout_ms: int
    min_replicas_acked: int
    tls_ca_file: str
    tls_cert_file: str
    tls_key_file: str

    def connect(self, timeout: float | None = None, connect_timeout: float | None = None) -> redis.Redis:
        """A client for ``url`` with the TLS files; every call bounded by ``timeout`` seconds
        (default ``timeout_ms``)."""
        return connect(
            self.url,
            timeout=self.timeout_ms / 1000 if timeout is None else timeout,
            connect_timeout=connect_timeout,
            tls_ca_file=self.tls_ca_file or None,
            tls_cert_file=self.tls_cert_file or None,
            tls_key_file=self.tls_key_file or None,
        )


@attrs.frozen
class LeaseSettings:
    ttl_ms: int
    renew_interval_ms: int
    safety_margin_ms: int
    clock_drift: float
    standby_jitter_ms: int

    @property
    def timing(self) -> LeaseTiming:
        return LeaseTiming(
            ttl=self.ttl_ms / 1000,
            renew_interval=self.renew_interval_ms / 1000,
            margin=self.safety_margin_ms / 1000,
            drift=self.clock_drift,
        )


@attrs.frozen
class HorizonSettings:
    urls: tuple[str, ...]
    resource: str
    start_cursor: str
    connect_timeout_ms: int
    read_timeout_ms: int
    stream_idle_timeout_ms: int
    retry_base_ms: int
    retry_cap_ms: int
    failover_after: int
    parallel_requests: int
    handover_after_ms: int
    not_found_give_up_ms: int
    stale_check_ms: int
    stale_after_ledgers: int
    on_history_gap: str


@attrs.frozen
class RpcSettings:
    urls: tuple[str, ...]
    start_cursor: str
    event_type: str
    contract_ids: tuple[str, ...]
    topics: tuple[str, ...]
    page_limit: int
    connect_timeout_ms: int
    request_timeout_ms: int
    retry_base_ms: int
    retry_cap_ms: int
    failover_after: int
    on_history_gap: str
    reset_after_ms: int


@attrs.frozen
class EventsSettings:
    max_len: int


@attrs.frozen
class ObserveSettings:
    listen_host: str
    metrics_port: int
    status_port: int


@attrs.frozen
class LogSettings:
    level: str
    format: str


@attrs.frozen
class Settings:
    node: NodeSettings
    redis: RedisSettings
    lease: LeaseSettings
    horizon: HorizonSettings
    rpc: RpcSettings
    events: EventsSettings
    observe: ObserveSettings
    log: LogSettings
    jobs: tuple[JobSettings, ...] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        """Validate a nested mapping (missing keys take defaults) into Settings.

        Raises:
            ConfigError: with one line per problem.
        """
        problems: list[str] = []
        values: dict[str, dict[str, Any]] = {}
        job_tables = raw.get("jobs", {})
        raw = {k: v for k, v in raw.items() if k != "jobs"}
        for section, value in raw.items():
            if section not in SCHEMA:
                problems.append(f"{section}: unknown section{_did_you_mean(section, SCHEMA)}")
            elif not isinstance(value, Mapping):
                problems.append(f"{section}: must be a table of settings")
        for section, keys in SCHEMA.items():
            given = raw.get(section, {})
            given = given if isinstance(given, Mapping) else {}
            values[section] = {}
            for key in given:
                if key not in keys:
                    problems.append(f"{section}.{key}: unknown setting{_did_you_mean(key, keys)}")
            for key, (kind, default, _help) in keys.items():
                value = given.get(key, default)
                checked = _check_type(f"{section}.{key}", kind, value, problems)
                values[section][key] = checked if checked is not None else default
        derived = _derive(values)
        _check_values(values, problems)
        jobs = _resolve_jobs(values, job_tables, problems)
        problems = _without_derived_noise(problems, derived)
        if problems:
            raise ConfigError(problems)
        v = values
        node = v["node"]
        return cls(
            node=NodeSettings(
                id=node["id"], jobs=tuple(j.name for j in jobs), state_dir=node["state_dir"],
                source=node["source"],
            ),
            jobs=jobs,
            redis=RedisSettings(**v["redis"]),
            lease=LeaseSettings(**v["lease"]),
            horizon=HorizonSettings(**{**v["horizon"], "urls": tuple(v["horizon"]["urls"])}),
            rpc=RpcSettings(**{
                **v["rpc"], **{k: tuple(v["rpc"][k]) for k in ("urls", "contract_ids", "topics")}
            }),
            events=EventsSettings(**v["events"]),
            observe=ObserveSettings(**v["observe"]),
            log=LogSettings(**v["log"]),
        )


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
    from ingestion.paging import InvalidPagingToken, token_key

    try:
        token_key(start)
    except InvalidPagingToken:
        problems.append(f"{where}: must be now, 0 or a paging token, got {start!r}")


def _resolve_jobs(
    v: dict[str, dict[str, Any]], tables: Any, problems: list[str]
) -> tuple[JobSettings, ...]:
    """The jobs this node hosts: ``node.job`` entries (NAME or NAME=RESOURCE) if any, else every
    ``[jobs.NAME]`` table, else one job named ``horizon``; each filled from its table, then from
    the [horizon] settings."""
    horizon = v["horizon"]
    if not isinstance(tables, Mapping):
        problems.append("jobs: must be tables, one per job: [jobs.NAME]")
        tables = {}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            problems.append(f"jobs.{name}: must be a table of settings")
    entries = list(v["node"]["job"]) or list(tables) or ["horizon"]
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
                problems.append(f"jobs.{name}.{key}: unknown setting{_did_you_mean(key, JOB_SCHEMA)}")
                continue
            checked = _check_type(f"jobs.{name}.{key}", JOB_SCHEMA[key][0], value, problems)
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
        if kind == "rpc":
            jobs.append(_rpc_job(name, entry if eq else "", given, v["rpc"], problems))
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
    return tuple(jobs)


def _rpc_job(
    name: str, entry: str, given: Mapping[str, Any], rpc: Mapping[str, Any], problems: list[str]
) -> JobSettings:
    """An rpc job from its table (``given``) and the [rpc] section; what the section gives was
    checked there."""
    if entry:
        problems.append(f"node.job: {entry!r}: an rpc job takes no resource (it follows getEvents)")
    start = given.get("start_cursor", rpc["start_cursor"])
    where = f"jobs.{name}.start_cursor" if "start_cursor" in given else "rpc.start_cursor"
    _check_rpc_start_cursor(start, where, problems)
    urls = tuple(given.get("rpc", rpc["urls"]))
    if "rpc" in given:
        _check_urls(urls, f"jobs.{name}.rpc", "Stellar RPC", problems)
    job = JobSettings(
        name, "rpc", "", start, (),
        rpc_urls=urls,
        event_type=given.get("event_type", rpc["event_type"]),
        contract_ids=tuple(given.get("contract_ids", rpc["contract_ids"])),
        topics=tuple(given.get("topics", rpc["topics"])),
    )  # fmt: skip
    if any(k in given for k in ("event_type", "contract_ids", "topics")):
        _check_rpc_filter(job, f"jobs.{name}", problems)
    return job


def _check_urls(urls: Sequence[str], where: str, what: str, problems: list[str]) -> None:
    if not urls:
        problems.append(f"{where}: at least one {what} URL is needed")
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            problems.append(f"{where}: not an http(s) URL: {url!r}")


def _check_rpc_start_cursor(start: str, where: str, problems: list[str]) -> None:
    from ingestion.rpc.protocol import is_event_id

    if start in ("now", "0") or (start.isdigit() and 0 < int(start) < 1 << 31) or is_event_id(start):
        return
    problem = (
        f"{where}: must be now, 0, a ledger number or an event id (<19 digits>-<10 digits>), "
        f"got {start!r}"
    )
    if problem not in problems:  # the [rpc] default is checked once, not once per job
        problems.append(problem)


def _check_rpc_filter(job: JobSettings, where: str, problems: list[str]) -> None:
    """The getEvents filter limits and segments, checked here as the server would (exit 2
    instead of a node that starts and is then refused with -32602)."""
    from ingestion.rpc.protocol import filters_problem

    if job.event_type not in ("", "contract", "system"):
        problems.append(f"{where}.event_type: must be contract, system or empty, got {job.event_type!r}")
        return
    try:
        filters = job.rpc_filters()
    except ValueError as exc:
        problems.append(f"{where}.topics: {exc}")
        return
    problem = filters_problem(filters)
    if problem:
        key = "contract_ids" if "contract" in problem else "topics"
        problems.append(f"{where}.{key}: {problem.removeprefix('filter 1 invalid: ')}")
    for i, topic in enumerate(job.topics, 1):
        if not topic.strip():
            problems.append(f"{where}.topics: topic {i} is empty")


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


def _did_you_mean(name: str, options: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_type(name: str, kind: type | str, value: Any, problems: list[str]) -> Any:
    if kind == "list[str]":
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
        problems.append(f"{name}: must be a list of strings, got {value!r}")
        return None
    if kind is int and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            pass
    if kind is float and isinstance(value, str | int) and not isinstance(value, bool):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(kind, type) and isinstance(value, kind) and not isinstance(value, bool):
        return value
    type_name = kind if isinstance(kind, str) else kind.__name__
    problems.append(f"{name}: must be {type_name}, got {value!r}")
    return None


def _derive(v: dict[str, dict[str, Any]]) -> set[str]:
    """Fill the settings left at 0 ("auto") from the ones they derive from; returns their names."""
    derived: set[str] = set()
    lease = v["lease"]
    ttl = lease["ttl_ms"]
    if not lease["renew_interval_ms"]:
        lease["renew_interval_ms"] = ttl // 5
        derived.add("lease.renew_interval_ms")
    if not lease["safety_margin_ms"]:
        lease["safety_margin_ms"] = ttl // 5
        derived.add("lease.safety_margin_ms")
    if not v["redis"]["timeout_ms"]:
        v["redis"]["timeout_ms"] = max(1, min(500, lease["safety_margin_ms"] // 2))
        derived.add("redis.timeout_ms")
    if not v["horizon"]["handover_after_ms"]:
        v["horizon"]["handover_after_ms"] = 3 * ttl
        derived.add("horizon.handover_after_ms")
    if v["redis"]["min_replicas_acked"] == -1:
        v["redis"]["min_replicas_acked"] = 1 if is_sentinel_url(v["redis"]["url"]) else 0
    if not v["node"]["id"]:
        v["node"]["id"] = default_node_id()
    return derived


# A derived setting's problems are only news when what it derives from is valid.
_DERIVED_FROM = {
    "horizon.handover_after_ms": ("lease.ttl_ms",),
    "lease.renew_interval_ms": ("lease.ttl_ms",),
    "lease.safety_margin_ms": ("lease.ttl_ms",),
    "redis.timeout_ms": ("lease.safety_margin_ms",),
}
# Checks that compare a setting with others: reported under the first, about all of them.
_RELATED = {
    "horizon.handover_after_ms": ("lease.ttl_ms",),
    "lease.renew_interval_ms": ("lease.ttl_ms", "lease.safety_margin_ms", "lease.clock_drift"),
    "redis.timeout_ms": ("lease.safety_margin_ms",),
}


def _without_derived_noise(problems: list[str], derived: set[str]) -> list[str]:
    """Drop the problems that only follow from another problem: ``--lease-ttl-ms -5`` is one
    mistake, not five. A setting is tainted when it was derived from a setting with a problem (or
    from a tainted one); a problem is dropped when it is about a tainted setting, or compares a
    setting with a tainted one."""
    bad = {p.split(":", 1)[0] for p in problems}
    tainted: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, sources in _DERIVED_FROM.items():
            if name in derived and name not in tainted and any(
                src in tainted or (src in bad and src not in derived) for src in sources
            ):
                tainted.add(name)
                changed = True
    kept = []
    for problem in problems:
        name, _, text = problem.partition(":")
        compares_tainted = any(
            other in tainted and other.split(".")[1] in text for other in _RELATED.get(name, ())
        )
        if name in tainted or compares_tainted:
            continue
        kept.append(problem)
    return kept


def _check_redis_url(redis_: dict[str, Any], problems: list[str]) -> None:
    url = redis_["url"]
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES):
        problems.append(
            "redis.url: must start with redis://, rediss://, unix://, redis+sentinel://, "
            f"rediss+sentinel://, redis+cluster:// or rediss+cluster://, got {redact_url(url)!r}"
        )
    elif scheme in SENTINEL_SCHEMES:
        try:
            parse_sentinel_url(url)
        except BadRedisUrl as exc:
            problems.append(f"redis.url: {redact_url(url)!r} {exc}")
    elif scheme in CLUSTER_SCHEMES:
        try:
            parse_cluster_url(url)
        except BadRedisUrl as exc:
            problems.append(f"redis.url: {redact_url(url)!r} {exc}")
    if not 0 <= redis_["min_replicas_acked"] <= 16:
        problems.append(
            "redis.min_replicas_acked: must be between 0 and 16 (-1: auto), "
            f"got {redis_['min_replicas_acked']}"
        )


def _check_values(v: dict[str, dict[str, Any]], problems: list[str]) -> None:
    lease, redis_, horizon, observe, log = v["lease"], v["redis"], v["horizon"], v["observe"], v["log"]
    if not 100 <= lease["ttl_ms"] <= 3_600_000:
        problems.append(f"lease.ttl_ms: must be between 100 and 3600000, got {lease['ttl_ms']}")
    for key in ("renew_interval_ms", "safety_margin_ms", "standby_jitter_ms"):
        if lease[key] < 0 or (key != "standby_jitter_ms" and lease[key] == 0):
            problems.append(f"lease.{key}: must be positive, got {lease[key]}")
    if not 0 <= lease["clock_drift"] < 0.5:
        problems.append(f"lease.clock_drift: must be in [0, 0.5), got {lease['clock_drift']}")
    usable = lease["ttl_ms"] * (1 - lease["clock_drift"]) - lease["safety_margin_ms"]
    if lease["renew_interval_ms"] >= usable:
        problems.append(
            f"lease.renew_interval_ms: {lease['renew_interval_ms']} leaves no room to renew inside "
            f"the lease: it must be below ttl_ms * (1 - clock_drift) - safety_margin_ms = {usable:.0f}"
        )
    if redis_["timeout_ms"] <= 0:
        problems.append(f"redis.timeout_ms: must be positive (0: auto), got {redis_['timeout_ms']}")
    elif redis_["timeout_ms"] >= lease["safety_margin_ms"]:
        problems.append(
            f"redis.timeout_ms: {redis_['timeout_ms']} must be below lease.safety_margin_ms "
            f"({lease['safety_margin_ms']}) so that no Redis call can outlive the lease"
        )
    scheme = urlsplit(redis_["url"]).scheme
    _check_redis_url(redis_, problems)
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        if not redis_[key]:
            continue
        if scheme not in ("rediss", "rediss+sentinel", "rediss+cluster"):
            problems.append(f"redis.{key}: only used with a rediss:// URL (redis.url is {scheme}://)")
        elif not Path(redis_[key]).is_file():
            problems.append(f"redis.{key}: no such file {redis_[key]!r}")
    if bool(redis_["tls_cert_file"]) != bool(redis_["tls_key_file"]):
        problems.append("redis.tls_cert_file: a client certificate needs both tls_cert_file and tls_key_file")
    if scheme in ("redis", "rediss") and not urlsplit(redis_["url"]).hostname:
        problems.append(f"redis.url: no host in {redact_url(redis_['url'])!r}")
    if not horizon["urls"]:
        problems.append("horizon.urls: at least one Horizon URL is needed")
    for url in horizon["urls"]:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            problems.append(f"horizon.urls: not an http(s) URL: {url!r}")
    if not horizon["resource"].startswith("/"):
        problems.append(f"horizon.resource: must be a path such as /operations, got {horizon['resource']!r}")
    start = horizon["start_cursor"]
    if start not in ("now", "0"):
        from ingestion.paging import InvalidPagingToken, token_key

        try:
            token_key(start)
        except InvalidPagingToken:
            problems.append(f"horizon.start_cursor: must be now, 0 or a paging token, got {start!r}")
    for key in (
        "connect_timeout_ms",
        "read_timeout_ms",
        "stream_idle_timeout_ms",
        "retry_base_ms",
        "retry_cap_ms",
        "failover_after",
    ):
        if horizon[key] <= 0:
            problems.append(f"horizon.{key}: must be positive, got {horizon[key]}")
    if not 1 <= horizon["parallel_requests"] <= 32:
        problems.append(
            f"horizon.parallel_requests: must be between 1 and 32, got {horizon['parallel_requests']}"
        )
    if horizon["handover_after_ms"] < lease["ttl_ms"]:
        problems.append(
            f"horizon.handover_after_ms: {horizon['handover_after_ms']} must be at least lease.ttl_ms "
            f"({lease['ttl_ms']}): the source is probed once per lease TTL"
        )
    if horizon["not_found_give_up_ms"] < 0:
        problems.append(
            f"horizon.not_found_give_up_ms: must be 0 or positive, got {horizon['not_found_give_up_ms']}"
        )
    for key in ("stale_check_ms", "stale_after_ledgers"):
        if horizon[key] < 0:
            problems.append(f"horizon.{key}: must be 0 or positive, got {horizon[key]}")
    if horizon["on_history_gap"] not in ("stop", "skip"):
        problems.append(
            f"horizon.on_history_gap: must be stop or skip, got {horizon['on_history_gap']!r}"
        )
    if horizon["retry_cap_ms"] < horizon["retry_base_ms"]:
        problems.append("horizon.retry_cap_ms: must not be below horizon.retry_base_ms")
    _check_rpc_section(v, problems)
    max_len = v["events"]["max_len"]
    if max_len < 0:
        problems.append(f"events.max_len: must be 0 (keep everything) or positive, got {max_len}")
    for key in ("metrics_port", "status_port"):
        if not 0 <= observe[key] <= 65535:
            problems.append(f"observe.{key}: must be a port number 0..65535 (0: off), got {observe[key]}")
    if observe["metrics_port"] and observe["metrics_port"] == observe["status_port"]:
        problems.append("observe.status_port: must differ from observe.metrics_port")
    if not observe["listen_host"]:
        problems.append("observe.listen_host: must be an address such as 127.0.0.1")
    if log["level"].lower() not in LOG_LEVELS:
        problems.append(f"log.level: must be one of {', '.join(LOG_LEVELS)}, got {log['level']!r}")
    else:
        log["level"] = log["level"].lower()
    if log["format"] not in ("json", "console", "auto"):
        problems.append(f"log.format: must be json, console or auto, got {log['format']!r}")
    if "|" in v["node"]["id"]:
        problems.append(f"node.id: must not contain '|', got {v['node']['id']!r}")


def _check_rpc_section(v: dict[str, dict[str, Any]], problems: list[str]) -> None:
    rpc = v["rpc"]
    if v["node"]["source"] not in ("horizon", "rpc"):
        problems.append(f"node.source: must be horizon or rpc, got {v['node']['source']!r}")
    _check_urls(rpc["urls"], "rpc.urls", "Stellar RPC", problems)
    if not 1 <= rpc["page_limit"] <= 10_000:
        problems.append(f"rpc.page_limit: must be between 1 and 10000, got {rpc['page_limit']}")
    for key in (
        "connect_timeout_ms", "request_timeout_ms", "retry_base_ms", "retry_cap_ms",
        "failover_after", "reset_after_ms",
    ):  # fmt: skip
        if rpc[key] <= 0:
            problems.append(f"rpc.{key}: must be positive, got {rpc[key]}")
    if rpc["retry_cap_ms"] < rpc["retry_base_ms"]:
        problems.append("rpc.retry_cap_ms: must not be below rpc.retry_base_ms")
    if rpc["on_history_gap"] not in ("stop", "skip"):
        problems.append(f"rpc.on_history_gap: must be stop or skip, got {rpc['on_history_gap']!r}")
    section_job = JobSettings(
        "rpc", "rpc", "", rpc["start_cursor"], (), rpc_urls=tuple(rpc["urls"]),
        event_type=rpc["event_type"], contract_ids=tuple(rpc["contract_ids"]),
        topics=tuple(rpc["topics"]),
    )  # fmt: skip
    _check_rpc_filter(section_job, "rpc", problems)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError([f"--config: cannot read {path}: {exc.strerror}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"--config: {path} is not valid TOML: {exc}"]) from exc


def from_environment(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``INGESTION_<SECTION>_<KEY>`` variables as a nested mapping (lists are comma-separated;
    ``INGESTION_RPC_TOPICS`` separates topics with ``;``, a topic's segments with ``,``)."""
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, value in environ.items():
        if not name.startswith("INGESTION_"):
            continue
        rest = name[len("INGESTION_") :].lower()
        section, _, key = rest.partition("_")
        if section not in SCHEMA or key not in SCHEMA[section]:
            hint = _did_you_mean(rest, {f"{s}_{k}": 1 for s in SCHEMA for k in SCHEMA[s]})
            problems.append(f"{name}: unknown setting{hint}")
            continue
        kind = SCHEMA[section][key][0]
        # A topic is itself comma-separated: INGESTION_RPC_TOPICS separates topics with ';'.
        sep = ";" if (section, key) == ("rpc", "topics") else ","
        parsed: Any = [u.strip() for u in value.split(sep) if u.strip()] if kind == "list[str]" else value
        out.setdefault(section, {})[key] = parsed
    if problems:
        raise ConfigError(problems)
    return out


def merge(*layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            if isinstance(values, Mapping):
                merged.setdefault(section, {}).update(values)
            else:
                merged[section] = values  # type: ignore[assignment]  # reported by from_mapping
    return merged


def load(
    config_path: Path | None,
    environ: Mapping[str, str],
    flags: Mapping[str, Mapping[str, Any]],
) -> Settings:
    """Defaults < config file < environment < flags. ``config_path`` None: ./config.toml if any.

    Raises:
        ConfigError: every problem found, one line each (a bad environment variable and a bad
            value in the file are reported together).
    """
    if config_path is None:
        candidate = Path("config.toml")
        file_layer = read_toml(candidate) if candidate.is_file() else {}
    else:
        file_layer = read_toml(config_path)
    problems: list[str] = []
    try:
        env_layer = from_environment(environ)
    except ConfigError as exc:
        problems.extend(exc.problems)
        env_layer = {}
    try:
        settings = Settings.from_mapping(merge(file_layer, env_layer, flags))
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return settings


# The command-line flag of a setting, where there is one (documentation; tests keep it true).
FLAGS = {
    ("node", "id"): "--node-id",
    ("node", "job"): "--job",
    ("redis", "url"): "--redis",
    ("lease", "ttl_ms"): "--lease-ttl-ms",
    ("horizon", "urls"): "--horizon",
    ("horizon", "resource"): "--resource",
    ("horizon", "start_cursor"): "--start-cursor",
    ("node", "source"): "--source",
    ("rpc", "urls"): "--rpc",
    ("rpc", "start_cursor"): "--start-cursor",
    ("rpc", "event_type"): "--event-type",
    ("rpc", "contract_ids"): "--contract-id",
    ("rpc", "topics"): "--topic",
    ("events", "max_len"): "--events-max-len",
    ("observe", "metrics_port"): "--metrics-port",
    ("observe", "status_port"): "--status-port",
    ("log", "level"): "--log-level",
    ("log", "format"): "--log-format",
}


def sample_toml() -> str:
    """The repo-root ``config.toml``: every setting with its default, unit, variable and flag."""
    lines = [
        "# Ingestion node configuration: every setting, with its default (generated by",
        "# ingestion.config.sample_toml(); tests/test_config.py keeps this file equal to it).",
        "#",
        "# Precedence, lowest to highest: built-in defaults, this file (./config.toml or --config),",
        "# environment variables INGESTION_<SECTION>_<KEY>, then command-line flags.",
        "# Settings whose default is 0 and marked auto are derived from lease.ttl_ms.",
        "",
    ]
    for section, keys in SCHEMA.items():
        lines.append(f"[{section}]")
        for key, (_kind, default, help_) in keys.items():
            lines.append(f"# {help_}")
            where = f"INGESTION_{section.upper()}_{key.upper()}"
            if (section, key) in FLAGS:
                where += f", {FLAGS[section, key]}"
            lines.append(f"# ({where})")
            if isinstance(default, str):
                rendered = f'"{default}"'
            elif isinstance(default, list):
                rendered = "[" + ", ".join(f'"{x}"' for x in default) + "]"
            else:
                rendered = str(default)
            lines.append(f"{key} = {rendered}")
        lines.append("")
    lines += [
        "# Jobs: one table per elected job this node hosts (used when node.job is empty). Each key",
        "# is optional and defaults to the [horizon] (for an rpc job: [rpc]) setting of the same",
        "# meaning:",
    ]
    for key, (_kind, help_) in JOB_SCHEMA.items():
        lines.append(f"#   {key}: {help_}")
    lines += [
        "#",
        "# [jobs.operations]",
        '# resource = "/operations"',
        "#",
        "# [jobs.payments]",
        '# resource = "/payments"',
        '# start_cursor = "now"',
        "#",
        "# [jobs.transfers]",
        '# kind = "rpc"',
        '# rpc = ["http://127.0.0.1:8001"]',
        '# event_type = "contract"',
        '# topics = ["sym:transfer,**"]',
        '# start_cursor = "0"',
        "#",
        "# [jobs.heartbeat]",
        '# kind = "scheduled"',
        '# action = "ingestion.jobs:heartbeat"',
        "# period_ms = 60000",
        "",
    ]
    return "\n".join(lines)
