"""What the node checks before it starts, beyond the settings' text: every job's source can be
built, the token memory is usable, each PostgreSQL sink's schema is there (or made), and what the Redis
URL reaches is what it should be. Each problem is a ``ConfigError`` naming the setting (exit 2)."""

from __future__ import annotations

from actors.lease_store import (
    diagnose_redis,
    is_sentinel_url,
    job_keys,
    parse_sentinel_url,
    sentinel_services,
)
from actors.lease_store.store import deployment_of_url
from actors.token_memory import TokenMemory
from ingestion.config import ConfigError, Settings, redact_url
from ingestion.node.build import build_source

PREFLIGHT_TIMEOUT = 2.0  # seconds, each start-up question to Redis (or PostgreSQL)


def check_sinks(settings: Settings, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """Create what is missing of each PostgreSQL sink's schema, or refuse to start.

    Raises:
        ConfigError: one line naming ``sink.url`` (credentials, privileges, no such database) or
            ``sink.schema`` (a table with other columns). A server that does not answer is an
            outage, not a configuration error: each term tries again.
    """
    # lazy: node start-up (~3 ms): PostgreSQL sinks only
    from ingestion.postgres.connection import sink_problem

    for url in sorted({j.sink for j in settings.jobs if j.sink}):
        problem = sink_problem(url, settings.sink.schema, timeout)
        if problem:
            raise ConfigError([problem])


def check_sources(settings: Settings) -> None:
    """Build every job's source once, to report what cannot be built as configuration errors.

    Raises:
        ConfigError: one line per job whose resource or action cannot be used.
    """
    problems = []
    for job in settings.jobs:
        if job.kind == "webhook":
            continue  # its settings were checked whole when they were read (ingestion/config/jobs.py)
        try:
            build_source(settings, job)
        except ValueError as exc:
            section = "rpc" if job.kind == "rpc" else "horizon"
            problems.append(f"jobs.{job.name}: {exc}" if len(settings.jobs) > 1 else f"{section}: {exc}")
    if problems:
        raise ConfigError(problems)


def preflight(settings: Settings) -> None:
    """Checks that need more than the settings' text, before the node starts.

    Raises:
        ConfigError: the token memory in node.state_dir is unusable; what the Redis URL reaches is
            wrong in a way retrying cannot fix (not a sentinel, not a cluster, not Redis, no such database,
            credentials refused, an ACL that denies the job's keys); or every sentinel that
            answered says it does not monitor the URL's service. Redis or sentinels that do not
            answer are an outage, not a configuration error: the node starts, logs
            ``redis-unavailable`` and waits for them
            (:func:`ingestion.node.worker.diagnose_after_outages` asks again).
    """
    # The files of the deployment the node will talk to (its name needs no network).
    deployment = deployment_of_url(settings.redis.url)
    for job in settings.node.jobs:
        try:
            TokenMemory(job, settings.node.state_dir or None, deployment=deployment)
        except (OSError, ValueError) as exc:
            problem = str(exc)  # (TokenMemory's own errors name the setting already)
            if not problem.startswith("node.state_dir"):
                problem = f"node.state_dir: {problem}"
            raise ConfigError([problem]) from exc
    check_sinks(settings)
    r = settings.redis
    url = r.url
    timeout = max(r.timeout_ms / 1000, PREFLIGHT_TIMEOUT)
    mistake = diagnose_redis(
        url, [job_keys(j)["cursor"] for j in settings.node.jobs], timeout=timeout,
        tls_ca_file=r.tls_ca_file or None, tls_cert_file=r.tls_cert_file or None,
        tls_key_file=r.tls_key_file or None,
    )  # fmt: skip
    if mistake:
        raise ConfigError([f"redis.url {redact_url(url)}: {mistake}"])
    if not is_sentinel_url(url):
        return
    target = parse_sentinel_url(url)
    _unreachable, known = sentinel_services(target, r.timeout_ms / 1000)
    if known and not any(target.service in services for services in known.values()):
        monitored = sorted({s for services in known.values() for s in services})
        raise ConfigError([
            f"redis.url: no sentinel at {','.join(known)} monitors a service named "
            f"{target.service!r} (they monitor: {', '.join(monitored) or 'nothing'})"
        ])

class StartupError(Exception):
    """The node cannot start: one line naming the setting (exit 2)."""
