"""Which jobs a command may name: those the configuration defines or this Redis knows (elected or
committed: any of the job's own keys, ``actors.lease_store.job_keys``). A mistyped name is
refused before anything is written, so a mistaken command leaves no key behind that would later
show as a job; the refusal is one line with the known names (exit 2).

Blocking redis-py calls: the CLI's. Shared by the commands that name a job (``watchlist``,
``handover``, ``inspect --job``; ``backfill`` needs the job's configuration itself).
"""

from __future__ import annotations

from typing import Any

from actors.lease_store import job_keys
from ingestion.cli.usage import UsageError

NAMED = 20  # known names a refusal lists (then "and N more")


def in_redis(client: Any, job: str) -> bool:
    """Whether this Redis holds any of ``job``'s own keys (it was elected or committed)."""
    return bool(client.exists(*job_keys(job).values()))


def known_jobs(configured: list[str], client: Any) -> list[str]:
    """The configured jobs and those this Redis knows (finished backfill ranges left out: done
    work), sorted.

    Raises:
        redis.RedisError: Redis cannot be read.
    """
    from ingestion.backfill.status import listed_jobs  # lazy: CLI start-up (~5 ms)

    found = listed_jobs(client)
    pipe = client.pipeline(transaction=False)
    for name in found:
        pipe.exists(*job_keys(name).values())
    elected = [name for name, n in zip(found, pipe.execute() if found else [], strict=True) if n]
    return sorted(set(configured) | set(elected))


def unknown_job(command: str, job: str, configured: list[str], client: Any) -> UsageError:
    """The one-line refusal of ``job``, naming the known jobs."""
    names = known_jobs(configured, client)
    shown = ", ".join(names[:NAMED]) + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")
    return UsageError(
        f"{command}: no job {job!r} in this configuration or this Redis (known: {shown or 'none'}); "
        "check the name, --config and --redis"
    )


def require_job(command: str, job: str, configured: list[str], client: Any) -> None:
    """Return when ``job`` is configured or in this Redis.

    Raises:
        UsageError: it is neither (the known jobs named); nothing was written.
        redis.RedisError: Redis cannot be read.
    """
    if job in configured or in_redis(client, job):
        return
    raise unknown_job(command, job, configured, client)
