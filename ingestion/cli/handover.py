"""``ingestion handover JOB``: ask a job's leader to hand it over gracefully (the console's button
does the same): its next renewal takes the request, it writes who asked to the job's audit, ends
its term (``lost-leadership reason=handed-over``) and stands aside one lease TTL, so a standby
takes over at once. The request names the leader's term: one for a term that has ended meanwhile
is dropped. ``--wait`` waits (bounded) for another node to lead.

Exit 0: asked (and, with ``--wait``, another node leads); 1: no leader, Redis unreadable, or
nobody else took the job within the wait; 2: usage, or a job this Redis does not know (one line
naming the known jobs).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from actors.lease_store import job_keys, read_states
from actors.lease_store.store import handover_request
from ingestion.cli.known import in_redis, unknown_job
from ingestion.cli.usage import OneLineParser, UsageError, setting_help
from ingestion.config import load


def parser() -> Any:
    p = OneLineParser(
        prog="ingestion handover",
        description="Ask a job's leader to hand the job over gracefully to a standby (it finishes "
        "its commit, releases, stands aside one lease TTL); the job's audit records who asked.",
    )
    p.add_argument("job", help="the job")
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for another node to lead (default: do not wait)")  # fmt: skip
    return p


def main(argv: Sequence[str]) -> int:
    from ingestion.webhook.admin import default_asker  # lazy: CLI start-up (~150 ms)

    ns = parser().parse_args(list(argv))
    if ns.wait < 0:
        raise UsageError("handover: --wait must be 0 or more seconds")
    flags: dict[str, dict[str, Any]] = {"redis": {"url": ns.redis}} if ns.redis else {}
    settings = load(ns.config, os.environ, flags)
    client = settings.redis.connect()
    keys = job_keys(ns.job)
    try:
        held = read_states(client, [ns.job])[0]
        if held.lease_token is None:
            if not in_redis(client, ns.job):
                raise unknown_job("handover", ns.job, [j.name for j in settings.jobs], client)
            print(f"ingestion: handover: {ns.job} has no leader to hand over", file=sys.stderr)
            return 1
        token, leader = held.lease_token, held.leader
        by = default_asker()
        asked: dict[Any, Any] = handover_request(token, by)
        client.hset(keys["leader"], mapping=asked)
        print(f"asked {leader} to hand {ns.job} over (term {token}); the audit records {by!r}")
        if not ns.wait:
            return 0
        end = time.monotonic() + ns.wait
        while time.monotonic() < end:
            now = read_states(client, [ns.job])[0]
            if now.lease_token is not None and now.lease_token > token and now.leader != leader:
                print(f"{now.leader} leads {ns.job} (term {now.lease_token})")
                return 0
            time.sleep(0.05)
        print(f"ingestion: handover: no other node led {ns.job} within {ns.wait:g} s", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"ingestion: handover: Redis: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
