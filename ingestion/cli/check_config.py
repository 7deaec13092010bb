"""``ingestion check-config``: every setting resolved and validated as ``run`` would, no network."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from ingestion.cli import run
from ingestion.cli.usage import settings_of_flags
from ingestion.common.keyspace import watch_keys
from ingestion.config import from_environment, redact_url
from ingestion.config.layers import file_layer, resolved_with_sources


def parser() -> argparse.ArgumentParser:
    parser = run.parser()
    parser.prog = "ingestion check-config"
    parser.description = (
        "Resolve and validate every setting as `ingestion run` would with the same flags (no "
        "network): each printed with its value and source (default, auto, file, env or flag). "
        "Exit 0, or 2 with one line per problem."
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def main(argv: Sequence[str]) -> int:
    """Resolve and validate every setting exactly as ``run`` would with the same flags, touching no
    network; print each with its value and where it came from. Exit 0, or 2 with one line per
    problem."""
    ns = parser().parse_args(argv)
    settings = run.load_settings(ns)
    run.check_source_flags(ns, settings)
    from ingestion.node.identity import source_identity  # lazy: CLI start-up (~200 ms)
    from ingestion.node.preflight import check_sources  # lazy: CLI start-up (~200 ms)

    check_sources(settings)
    rows = resolved_with_sources(
        settings, file_layer(ns.config), from_environment(os.environ), settings_of_flags(ns)
    )
    rows = [(name, _shown(name, v, redact_url), src) for name, v, src in rows]
    jobs = [
        {"job": j.name, "kind": j.kind, "follows": source_identity(j), "watch": watch_list(j)}
        for j in settings.jobs
    ]
    if ns.json:
        print(json.dumps({
            "settings": {name: {"value": value, "source": src} for name, value, src in rows},
            "jobs": jobs,
        }))  # fmt: skip
        return 0
    width = max(len(name) for name, _, _ in rows)
    for name, value, src in rows:
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        print(f"{name:<{width}}  {src:<7}  {shown}")
    for job in jobs:
        watching = f"; keeps only records naming an address of {job['watch']}" if job["watch"] else ""
        print(f"job {job['job']}: {job['follows']}{watching}")
    print("configuration OK")
    return 0


def watch_list(job: Any) -> str | None:
    """Where a job's watch list comes from, in words (None: it keeps every record)."""
    if job.watch:
        return f"its watch setting ({len(job.watch)} address{'es' if len(job.watch) != 1 else ''})"
    if job.watch_file:
        return f"the watch file {job.watch_file} (reloaded when it changes)"
    if job.watch_set:
        return f"the Redis set {watch_keys(job.name)['watch']} (edited with ingestion watchlist)"
    return None


def _shown(name: str, value: Any, redact_url: Callable[[str], str]) -> Any:
    """A setting as check-config prints it: URLs without their passwords, a token as set or not."""
    if name in ("redis.url", "sink.url") and isinstance(value, str) and value:
        return redact_url(value)
    if name == "observe.console_token":
        return "(set)" if value else ""
    return value
