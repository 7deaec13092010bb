"""``ingestion cursor reset JOB --to CURSOR|start``: move a job on after a network reset.

A job that detected a reset of its network (``network-reset``: the hash of its last committed
ledger differs from its source's, or its source stayed below it; ingestion/node/network.py)
commits nothing and every node holds it off until an operator says where it resumes. This command
does, in one Lua script (``actors/lease_store/lua/cursor_reset.lua``): refused while a node holds
the job's lease (then nothing was detected: the job runs) or, with ``--from``, when the cursor is
not the one named; else the token counter moves on (a term from before is fenced: its writes are
refused as stale), the cursor is set (``--to start``: removed, the job starts again at its
``start_cursor``), the reset mark cleared and the job's audit stream records who asked, when,
from and to (``cursor-reset``). Nodes holding the job off see the mark gone at their next look
(within a lease TTL) and campaign.

A job whose sink keeps its cursor (PostgreSQL) is refused: its cursor is in PostgreSQL, which
this command does not move.

Exit 0: moved; 1: refused (led, moved meanwhile, a PostgreSQL job) or Redis unreadable; 2: usage,
or a job neither the configuration nor Redis knows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from actors.lease_store import job_keys
from actors.lease_store.keys import AUDIT_MAXLEN
from actors.lease_store.scripts import CURSOR_RESERVE, CURSOR_RESET, CURSOR_RESET_SINK
from ingestion.cli.known import in_redis, unknown_job
from ingestion.cli.usage import OneLineParser, UsageError, setting_help


def parser() -> Any:
    p = OneLineParser(
        prog="ingestion cursor",
        description="Move a job's cursor after a network reset (the job logs network-reset and "
        "every node holds it off): fenced (a term from before can no longer write) and audited "
        "(who, when, from, to in the job's audit stream).",
    )
    p.add_argument("action", choices=["reset"], help="reset: set the job's cursor and clear its reset mark")
    p.add_argument("job", help="the job")
    p.add_argument("--to", required=True, metavar="CURSOR",
                   help="where the job resumes: a paging token or event id, or start "
                   "(its start_cursor)")  # fmt: skip
    p.add_argument("--from", dest="expected", default="", metavar="CURSOR",
                   help="refuse unless the job's cursor is this one (default: whatever it is)")  # fmt: skip
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    p.add_argument(
        "--sink", metavar="URL", help=setting_help("a PostgreSQL sink: the job's cursor", ("sink", "url"))
    )
    return p


def main(argv: Sequence[str]) -> int:
    from ingestion.common.paging import InvalidPagingToken, token_key  # lazy: CLI start-up
    from ingestion.config import load  # lazy: CLI start-up
    from ingestion.webhook.admin import default_asker  # lazy: CLI start-up

    ns = parser().parse_args(list(argv))
    to = "" if ns.to == "start" else ns.to
    for flag, value in (("--to", to), ("--from", ns.expected)):
        try:
            if value:
                token_key(value)
        except InvalidPagingToken as exc:
            raise UsageError(f"cursor: {flag}: not a paging token or event id: {value!r}") from exc
    flags: dict[str, dict[str, Any]] = {"redis": {"url": ns.redis}} if ns.redis else {}
    if ns.sink:
        flags["sink"] = {"url": ns.sink}
    settings = load(ns.config, os.environ, flags)
    client = settings.redis.connect()
    keys = job_keys(ns.job)
    try:
        if not in_redis(client, ns.job):
            raise unknown_job("cursor", ns.job, [j.name for j in settings.jobs], client)
        fields: Any = client.hmget(keys["cursor"], ["sink", "network_reset"])
        sink, mark = (v.decode() if isinstance(v, bytes) else v for v in fields)
        by = default_asker()
        if sink and sink != "redis":
            return _reset_in_sink(client, settings, ns, sink, to, by, mark or "")
        script = client.register_script(CURSOR_RESET)
        answer = script(
            keys=[keys["token"], keys["lease"], keys["cursor"], keys["audit"], keys["events"]],
            args=[by, to, ns.expected, AUDIT_MAXLEN, mark or ""],
        )
        ok, before, detail = (v.decode() if isinstance(v, bytes) else v for v in answer)
        if not int(ok):
            why = {
                "job-led": f"a node leads it (lease {detail}): no reset was detected; stop its nodes first",
                "cursor-moved": f"its cursor is {detail or 'none'}, not {ns.expected}",
            }.get(before, before)
            print(f"ingestion: cursor: {ns.job}: refused: {why}", file=sys.stderr)
            return 1
        print(f"moved {ns.job} from {before or 'none'} to {to or 'its start_cursor'} (token {detail}); "
              f"the audit records {by!r}")  # fmt: skip
        return 0
    except redis.RedisError as exc:
        print(f"ingestion: cursor: Redis: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _reset_in_sink(client: Any, settings: Any, ns: Any, sink: str, to: str, by: str, mark: str) -> int:
    """The move of a job whose cursor a PostgreSQL sink keeps (see the module docstring)."""
    import psycopg  # lazy: CLI start-up

    from ingestion.common.redact import redact  # lazy: CLI start-up
    from ingestion.postgres.reset import reset_cursor  # lazy: CLI start-up

    job = next((j for j in settings.jobs if j.name == ns.job), None)
    url = (job.sink if job is not None else "") or settings.sink.url
    if not url:
        raise UsageError(f"cursor: {ns.job} commits to {sink}: give --sink URL (or the job's sink setting)")
    keys = job_keys(ns.job)
    ok, *rest = (v.decode() if isinstance(v, bytes) else v for v in client.register_script(CURSOR_RESERVE)(
        keys=[keys["token"], keys["lease"]], args=[]
    ))  # fmt: skip
    if not int(ok):
        print(f"ingestion: cursor: {ns.job}: refused: a node leads it (lease {rest[1]}): no reset was "
              "detected; stop its nodes first", file=sys.stderr)  # fmt: skip
        return 1
    token = int(rest[0])
    try:
        done = reset_cursor(url, settings.sink.schema, ns.job, token, by, to, ns.expected)
    except psycopg.Error as exc:
        print(redact(f"ingestion: cursor: the sink {url} cannot be read: {exc}"), file=sys.stderr)
        return 1
    if not done.moved:
        why = {
            "stale-token": f"a term began since (the sink's fence is at token {done.detail})",
            "cursor-moved": f"its cursor is {done.detail or 'none'}, not {ns.expected}",
        }.get(done.refused, done.refused)
        print(f"ingestion: cursor: {ns.job}: refused: {why}", file=sys.stderr)
        return 1
    seam = f"seq {done.last_seq}" if done.last_seq else ""
    client.register_script(CURSOR_RESET_SINK)(
        keys=[keys["cursor"], keys["audit"]],
        args=[by, done.before or "", to, token, AUDIT_MAXLEN, mark, seam],
    )
    print(f"moved {ns.job} from {done.before or 'none'} to {to or 'its start_cursor'} in {sink} (token "
          f"{token}); the audit records {by!r}")  # fmt: skip
    return 0
