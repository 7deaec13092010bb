"""Checks of the settings' values and of the relations between them, and the *auto* settings.

Every problem is reported as one line naming the setting (``lease.ttl_ms: ...``), appended to the
caller's list, so that all problems are reported together. Settings whose default is ``0`` marked
*auto* are derived from the lease TTL (:func:`derive`), so that changing only the TTL always gives
a consistent configuration; a problem that only follows from another one is dropped
(:func:`without_derived_noise`).

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from actors.lease_store import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    BadRedisUrl,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
)
from ingestion.common.http import is_http_url
from ingestion.common.paging import InvalidPagingToken, token_key
from ingestion.common.redact import redact
from ingestion.config.schema import LOG_LEVELS
from ingestion.config.sections import JobSettings


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def redact_url(url: str) -> str:
    """The URL with any password or token (``user:***@``, ``***@``, ``?password=***``,
    ``?token=***``, ...) masked (:func:`ingestion.common.redact.redact`).

    Never raises, whatever the text: it is used on settings that failed validation too.
    """
    return redact(url)


def check_urls(urls: Sequence[str], where: str, what: str, problems: list[str]) -> None:
    if not urls:
        problems.append(f"{where}: at least one {what} URL is needed")
    for url in urls:
        if not is_http_url(url):  # (the sources' own check: what passes here, they take)
            problems.append(f"{where}: not an http(s) URL: {url!r}")


def check_rpc_start_cursor(start: str, where: str, problems: list[str]) -> None:
    from ingestion.rpc.protocol import parse_start  # lazy: CLI start-up (rpc.protocol, ~5 ms)

    try:
        parse_start(start, "an RPC")  # the followers' own reading: 0, a ledger or an event id
        return
    except ValueError:
        if start == "now":
            return
    problem = (
        f"{where}: must be now, 0, a ledger number or an event id (<19 digits>-<10 digits>), "
        f"got {start!r}"
    )
    if problem not in problems:  # the [rpc] default is checked once, not once per job
        problems.append(problem)


def check_rpc_filter(job: JobSettings, where: str, problems: list[str]) -> None:
    """The getEvents filter limits and segments, checked here as the server would (exit 2
    instead of a node that starts and is then refused with -32602)."""
    from ingestion.rpc.protocol import filters_problem  # lazy: CLI start-up (rpc.protocol, ~5 ms)

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


def did_you_mean(name: str, options: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_type(name: str, kind: type | str, value: Any, problems: list[str]) -> Any:
    if kind == "list[str]":
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and all(isinstance(x, str) for x in value):
            return value
        problems.append(f"{name}: must be a list of strings, got {value!r}")
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{name}: must be true or false, got {value!r}")
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


def derive(v: dict[str, dict[str, Any]]) -> set[str]:
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


def without_derived_noise(problems: list[str], derived: set[str]) -> list[str]:
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
    elif scheme in ("redis", "rediss", "unix"):
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018  (urllib checks the port when it is read)
        except ValueError:
            port = parts.netloc.rpartition("@")[2].rpartition(":")[2]
            problems.append(
                f"redis.url: the port must be a number from 1 to 65535, got {port!r} in {redact_url(url)!r}"
            )
        dbs = [] if scheme == "unix" else [parts.path.strip("/")]
        dbs += [value for name, value in parse_qsl(parts.query) if name == "db"]
        for db in dbs:
            if db and not db.isdigit():
                problems.append(
                    f"redis.url: the database must be a number such as /0, got {db!r} in "
                    f"{redact_url(url)!r}"
                )
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


def _check_sink(url: str, where: str, problems: list[str]) -> None:
    if url and not url.startswith(("postgres://", "postgresql://")):
        problems.append(
            f"{where}: must be empty (the Redis events stream) or a postgresql:// or postgres:// "
            f"URL, got {redact_url(url)!r}"
        )


def check_sink(url: str, where: str, problems: list[str]) -> None:
    """A job's ``sink`` (``jobs.NAME.sink``): empty or a PostgreSQL URL."""
    _check_sink(url, where, problems)


def check_api(api: dict[str, Any], problems: list[str]) -> None:
    """The events API's settings: caps at stellar-rpc's defaults or higher, bounds positive."""
    for key, floor in (("max_filters", 5), ("max_contract_ids", 5), ("max_topics", 5), ("max_limit", 10000)):
        if api[key] < floor:
            problems.append(f"api.{key}: must be at least stellar-rpc's {floor}, got {api[key]}")
    if not 1 <= api["default_limit"] <= max(api["max_limit"], 1):
        problems.append(f"api.default_limit: must be between 1 and api.max_limit, got {api['default_limit']}")
    positive = ("statement_timeout_ms", "max_body_bytes", "connections", "max_subscribers",
                "stream_max_lag_ms")  # fmt: skip
    for key in positive:
        if api[key] <= 0:
            problems.append(f"api.{key}: must be positive, got {api[key]}")
    if api["stream_outbox"] < 1000:
        outbox = api["stream_outbox"]
        problems.append(f"api.stream_outbox: must be at least 1000 (five pages of 200), got {outbox}")
    if not 0 <= api["port"] <= 65535:
        problems.append(f"api.port: must be between 0 and 65535, got {api['port']}")
    if api["port"] and not api["job"]:
        problems.append("api.port: the events API needs api.job, the job whose events it serves")
    if api["read_url"] and not api["read_url"].startswith(("postgres://", "postgresql://")):
        problems.append(f"api.read_url: must be a postgresql:// URL, got {redact_url(api['read_url'])!r}")


def check_values(v: dict[str, dict[str, Any]], problems: list[str]) -> None:
    check_api(v["api"], problems)
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
    check_urls(horizon["urls"], "horizon.urls", "Horizon", problems)
    if not horizon["resource"].startswith("/"):
        problems.append(f"horizon.resource: must be a path such as /operations, got {horizon['resource']!r}")
    start = horizon["start_cursor"]
    if start not in ("now", "0"):
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
    for key in ("stale_check_ms", "stale_after_ledgers", "complete_check_ms"):
        if horizon[key] < 0:
            problems.append(f"horizon.{key}: must be 0 or positive, got {horizon[key]}")
    if horizon["on_history_gap"] not in ("stop", "skip"):
        problems.append(
            f"horizon.on_history_gap: must be stop or skip, got {horizon['on_history_gap']!r}"
        )
    if horizon["retry_cap_ms"] < horizon["retry_base_ms"]:
        problems.append("horizon.retry_cap_ms: must not be below horizon.retry_base_ms")
    _check_rpc_section(v, problems)
    _check_sink(v["sink"]["url"], "sink.url", problems)
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", v["sink"]["schema"]):
        problems.append(
            f"sink.schema: must be a plain lower-case SQL identifier, got {v['sink']['schema']!r}"
        )
    max_len = v["events"]["max_len"]
    if max_len < 0:
        problems.append(f"events.max_len: must be 0 (keep everything) or positive, got {max_len}")
    for key in ("metrics_port", "status_port"):
        if not 0 <= observe[key] <= 65535:
            problems.append(f"observe.{key}: must be a port number 0..65535 (0: off), got {observe[key]}")
    if observe["metrics_port"] and observe["metrics_port"] == observe["status_port"]:
        problems.append("observe.status_port: must differ from observe.metrics_port")
    if observe["console_streams"] < 1:
        problems.append(f"observe.console_streams: must be 1 or more, got {observe['console_streams']}")
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
    if str(v["node"]["id"]).startswith("failing:"):
        # (the job's health hash marks a failing source with a field "failing:<node>")
        problems.append(f"node.id: must not start with 'failing:', got {v['node']['id']!r}")


def _check_rpc_section(v: dict[str, dict[str, Any]], problems: list[str]) -> None:
    rpc = v["rpc"]
    if v["node"]["source"] not in ("horizon", "rpc", "lake"):
        problems.append(f"node.source: must be horizon, rpc or lake, got {v['node']['source']!r}")
    lake = v["lake"]
    for key in ("poll_interval_ms", "read_ahead"):
        if lake[key] <= 0:
            problems.append(f"lake.{key}: must be positive, got {lake[key]}")
    if lake["decode_processes"] < 0:
        problems.append(f"lake.decode_processes: must be 0 or more, got {lake['decode_processes']}")
    network = v["network"]
    if network["check_ms"] <= 0:
        problems.append(f"network.check_ms: must be positive, got {network['check_ms']}")
    if network["reset_after_ms"] < 0:
        problems.append(f"network.reset_after_ms: must be 0 or more, got {network['reset_after_ms']}")
    check_urls(rpc["urls"], "rpc.urls", "Stellar RPC", problems)
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
    if rpc["on_history_gap"] not in ("stop", "skip", "lake"):
        problems.append(f"rpc.on_history_gap: must be stop, skip or lake, got {rpc['on_history_gap']!r}")
    elif rpc["on_history_gap"] == "lake":
        from ingestion.lake.store import check_lake_url  # lazy: CLI start-up (lake.store, ~8 ms)

        problem = check_lake_url(rpc["lake"])
        if problem:
            problems.append(f"rpc.lake: {problem} (on_history_gap = lake reads history from it)")
    section_job = JobSettings(
        "rpc", "rpc", "", rpc["start_cursor"], (), rpc_urls=tuple(rpc["urls"]),
        event_type=rpc["event_type"], contract_ids=tuple(rpc["contract_ids"]),
        topics=tuple(rpc["topics"]),
    )  # fmt: skip
    check_rpc_filter(section_job, "rpc", problems)
