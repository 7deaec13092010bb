"""``ingestion watchlist``: edit a job's watch list in Redis (``watch_set = true``) while it runs.

The list is the Redis set ``ingestion:{JOB}:watch``; an edit that changes it then increments
``ingestion:{JOB}:watch:version``, and the job's leader reads the version before each batch and
reloads the set when it moved: an edit applies from the next batch on, with no restart.
Addresses are checked (strkey, checksum) before anything is written: a bad one is named and
nothing of that command is written. Large lists go in from a file (``--file``, one address a
line, ``#`` comments), in short commands (Redis goes on serving the nodes' leases between them),
and the version moves once, after the last (:func:`ingestion.watchlist.edits.add`). An edit cut off
midway (Redis lost, Ctrl-C) has told no node: run it again, which completes it.

A job that neither the configuration nor Redis knows is refused (one line naming the known
jobs), before anything is written: a mistyped name leaves no set behind to show as a job.

Exit 0; 2 for a bad flag, address or job; 1 when Redis cannot be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from ingestion.cli.known import require_job
from ingestion.cli.usage import OneLineParser, UsageError, setting_help
from ingestion.common.keyspace import watch_keys
from ingestion.config import load


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion watchlist",
        description=f"Edit a job's watch list, the Redis set {watch_keys('JOB')['watch']} (a job with "
        "watch_set = true): applied from the job's next batch, without a restart.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--redis", metavar="URL", help=setting_help("the nodes' Redis", ("redis", "url")))
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    for name, text in (("add", "watch these addresses too"), ("remove", "stop watching these addresses")):
        action = sub.add_parser(name, help=text)
        action.add_argument("job", help="the job")
        action.add_argument("addresses", nargs="*", metavar="ADDRESS", help="G..., M..., C..., B..., L...")
        action.add_argument(
            "--file", type=Path, metavar="F", help="also the addresses in F, one a line (- for stdin)"
        )
    count = sub.add_parser("count", help="how many addresses the list holds")
    count.add_argument("job", help="the job")
    show = sub.add_parser("show", help="print the list, one address a line")
    show.add_argument("job", help="the job")
    return p


def _addresses(ns: argparse.Namespace) -> list[str]:
    from ingestion.watchlist.addresses import address_problem  # lazy: CLI start-up (structlog, ~30 ms)

    given = [(a, "argument") for a in ns.addresses]
    if ns.file is not None:
        try:
            text = sys.stdin.read() if str(ns.file) == "-" else ns.file.read_text()
        except OSError as exc:
            raise UsageError(f"watchlist {ns.action}: --file: {exc.strerror}: {ns.file}") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                given.append((line, f"{ns.file} line {n}"))
    if not given:
        raise UsageError(f"watchlist {ns.action}: name addresses, or --file")
    for address, where in given:
        problem = address_problem(address)
        if problem:
            raise UsageError(f"watchlist {ns.action}: {where}: {problem}")
    return [a for a, _ in given]


def main(argv: Sequence[str]) -> int:
    from ingestion.watchlist import edits as watch_redis  # lazy: CLI start-up (~60 ms)

    ns = parser().parse_args(list(argv))
    if ns.action is None:
        raise UsageError("watchlist: name an action: add, remove, count or show")
    addresses = _addresses(ns) if ns.action in ("add", "remove") else []
    flags: dict[str, dict[str, Any]] = {"redis": {"url": ns.redis}} if ns.redis else {}
    settings = load(ns.config, os.environ, flags)
    jobs = {j.name: j for j in settings.jobs}
    job = jobs.get(ns.job)
    if job is not None and not job.watch_set:
        print(
            f"ingestion: watchlist: note: job {ns.job!r} is not configured with watch_set = true here: "
            "its nodes do not read this set",
            file=sys.stderr,
        )
    client = settings.redis.connect()
    try:
        require_job(f"watchlist {ns.action}", ns.job, list(jobs), client)
        if ns.action in ("add", "remove"):
            edit = watch_redis.add if ns.action == "add" else watch_redis.remove
            changed = edit(client, ns.job, addresses)
            verb = "added" if ns.action == "add" else "removed"
            total = watch_redis.members_count(client, ns.job)
            print(f"{changed} {verb} ({len(addresses) - changed} unchanged); {ns.job} watches {total}")
        elif ns.action == "count":
            print(watch_redis.members_count(client, ns.job))
        else:
            for member in sorted(client.sscan_iter(watch_keys(ns.job)["watch"], count=10_000)):
                print(member.decode() if isinstance(member, bytes) else member)
    except (redis.RedisError, OSError) as exc:
        part = "; the edit may be part done, and no node was told: run it again" if addresses else ""
        print(f"ingestion: watchlist: Redis: {exc}{part}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
