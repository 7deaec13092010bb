"""``ingestion run``: one node (the default command): flags, settings, then the node's processes.

Exit status: 0 after a clean shutdown, 2 for a usage or configuration error, 1 for a fatal runtime
error; the worker process killed by signal N: 128 + N, once its parent has released its leases
(ingestion/node/parent.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ingestion.cli.usage import OneLineParser, UsageError, setting_help, settings_of_flags
from ingestion.config import load
from ingestion.node.stop_signals import asked, hold, run_unless_asked


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="ingestion run",
        description="Run one ingestion node: join the election and ingest Horizon (or Stellar RPC "
        "contract events) while leader. Settings: defaults < config.toml < INGESTION_<SECTION>_<KEY> "
        "< flags.",
    )
    h = setting_help
    p.add_argument(
        "--config", type=Path, metavar="PATH",
        help="TOML file (default: ./config.toml if present; no environment variable)",
    )  # fmt: skip
    p.add_argument(
        "--node-id", metavar="ID", help=h("this node's id; none: <hostname>-<pid>", ("node", "id"))
    )
    p.add_argument(
        "--job", action="append", metavar="NAME[=RESOURCE]",
        help=h("a singleton job to host (repeatable; RESOURCE defaults to --resource); none: every "
               "[jobs.NAME] table, or one job named after --source (horizon or rpc)", ("node", "job")),
    )  # fmt: skip
    p.add_argument(
        "--horizon", action="append", metavar="URL",
        help=h("Horizon base URL (repeatable)", ("horizon", "urls")),
    )  # fmt: skip
    p.add_argument(
        "--resource", metavar="PATH",
        help=h("Horizon collection path, e.g. /payments (Horizon jobs only)", ("horizon", "resource")),
    )  # fmt: skip
    p.add_argument(
        "--start-cursor", metavar="CURSOR",
        help=h("where a job starts when nothing is committed: now, 0 or a paging token; for "
               "--source rpc: now, 0, a ledger number or an event id",
               ("horizon", "start_cursor"), ("rpc", "start_cursor")),
    )  # fmt: skip
    p.add_argument(
        "--source", choices=("horizon", "rpc", "lake"),
        help=h("what the jobs follow: a Horizon collection, Stellar RPC contract events, or the same "
               "events from a ledger-metadata data lake (--lake)",
               ("node", "source")),
    )  # fmt: skip
    p.add_argument(
        "--rpc", action="append", metavar="URL", help=h("Stellar RPC URL (repeatable)", ("rpc", "urls"))
    )
    p.add_argument(
        "--lake", metavar="URL",
        help=h("the data lake of lake jobs: a directory or file://PATH", ("lake", "url")),
    )  # fmt: skip
    p.add_argument(
        "--contract-id", action="append", metavar="C",
        help=h("getEvents filter: a contract id (repeatable, at most 5; RPC jobs only)",
               ("rpc", "contract_ids")),
    )  # fmt: skip
    p.add_argument(
        "--event-type", choices=("contract", "system"),
        help=h("getEvents filter: the event type (RPC jobs only); none: both", ("rpc", "event_type")),
    )  # fmt: skip
    p.add_argument(
        "--topic", action="append", metavar="SEG[,SEG...]",
        help=h("getEvents filter: a topic (repeatable, at most 5; RPC jobs only): 1 to 4 segments, "
               "each a base64 ScVal, *, sym:NAME, str:TEXT, address:G...|C..., u32:N, i128:N, ..., "
               "then optionally **", ("rpc", "topics")),
    )  # fmt: skip
    p.add_argument(
        "--redis", metavar="URL",
        help=h("redis://, rediss://, unix://, redis+sentinel://H:P[,H:P...]/SERVICE[/DB] or "
               "redis+cluster://H:P[,H:P...]", ("redis", "url")),
    )  # fmt: skip
    p.add_argument(
        "--lease-ttl-ms", type=int, metavar="N",
        help=h("lease TTL in milliseconds", ("lease", "ttl_ms")),
    )  # fmt: skip
    p.add_argument(
        "--events-max-len", type=int, metavar="N",
        help=h("keep about N events-stream entries, never unacknowledged ones; 0: all",
               ("events", "max_len")),
    )  # fmt: skip
    p.add_argument(
        "--sink", metavar="URL",
        help=h("postgresql://USER:PASSWORD@HOST:PORT/DB: the jobs' records and cursors in "
               "PostgreSQL (the election stays in Redis); default: the Redis events stream",
               ("sink", "url")),
    )  # fmt: skip
    p.add_argument(
        "--metrics-port", type=int, metavar="N",
        help=h("Prometheus /metrics port; 0: off", ("observe", "metrics_port")),
    )  # fmt: skip
    p.add_argument(
        "--status-port", type=int, metavar="N",
        help=h("WebSocket status port; 0: off", ("observe", "status_port")),
    )  # fmt: skip
    p.add_argument("--log-level", metavar="LEVEL", help=h("debug, info, warning or error", ("log", "level")))
    p.add_argument(
        "--log-format", choices=("json", "console", "auto"),
        help=h("log rendering; auto: console on a terminal, else json", ("log", "format")),
    )  # fmt: skip
    return p


def load_settings(ns: argparse.Namespace) -> Any:
    return load(ns.config, os.environ, settings_of_flags(ns))


# Flags that only mean something for one kind of job: given while no hosted job is of that kind,
# they would be silently ignored.
_SOURCE_FLAGS = {
    "--resource": ("resource", "horizon"),
    "--contract-id": ("contract_id", "rpc"),
    "--event-type": ("event_type", "rpc"),
    "--topic": ("topic", "rpc"),
    "--lake": ("lake", "lake"),
}
_SAME_FILTERS = {"rpc": {"rpc", "lake"}}  # a lake job takes the RPC filter flags too
# The source URLs: used by a job of that kind that takes them from its section (a [jobs.NAME]
# table may name its own, and a lake job reads no RPC).
_URL_FLAGS = {"--horizon": ("horizon", "horizon", "horizon_urls"), "--rpc": ("rpc", "rpc", "rpc_urls")}
_KIND_NAMES = {"horizon": "a Horizon", "rpc": "an RPC", "lake": "a lake"}


def check_source_flags(ns: argparse.Namespace, settings: Any) -> None:
    """Raises UsageError for a flag that applies to no hosted job (``--topic`` or ``--horizon``
    with RPC jobs only, ``--rpc`` with Horizon jobs only)."""
    kinds = {job.kind for job in settings.jobs}
    hosted = ", ".join(sorted(f"{j.name} ({j.kind})" for j in settings.jobs))
    for flag, (attr, kind) in _SOURCE_FLAGS.items():
        if getattr(ns, attr, None) is not None and not (_SAME_FILTERS.get(kind, {kind}) & kinds):
            raise UsageError(
                f"{flag}: only for {_KIND_NAMES[kind]} job, and this node hosts {hosted}: drop "
                f"{flag}, or follow {kind} with --source {kind}"
            )
    for flag, (attr, kind, field) in _URL_FLAGS.items():
        given = getattr(ns, attr, None)
        if given is None or any(j.kind == kind and getattr(j, field) == tuple(given) for j in settings.jobs):
            continue
        if kind in kinds:
            raise UsageError(
                f"{flag}: every {kind} job here names its own URLs (jobs.NAME.{kind}): drop {flag}"
            )
        raise UsageError(
            f"{flag}: only for {_KIND_NAMES[kind]} job, and this node hosts {hosted}: drop {flag}, "
            f"or follow {kind} with --source {kind}"
        )

def main(argv: Sequence[str]) -> int:
    # SIGINT and SIGTERM are held (ingestion/node/stop_signals.py): one that came during a step ends
    # start-up after it, with 128 + N; the node (and its parent) take them once they can.
    hold()  # (already, under python -m ingestion; not when main() is called from Python)
    ns = parser().parse_args(argv)
    settings = load_settings(ns)
    check_source_flags(ns, settings)
    from ingestion.node.preflight import check_sources, preflight  # lazy: CLI start-up (~200 ms)

    check_sources(settings)
    if (status := asked()) is not None:
        return status
    # The questions to Redis (and PostgreSQL) may each wait 2 s on a server that does not answer:
    # a stop signal meanwhile ends start-up at once (docs/OPERATIONS.md: within 2 s).
    if (status := run_unless_asked(lambda: preflight(settings))) is not None:
        return status
    from ingestion.node import parent  # lazy: CLI start-up (it imports the node's build)
    from ingestion.node.worker import start_node  # lazy: CLI start-up (~500 ms)

    if (status := asked()) is not None:
        return status
    if parent.supported():
        forked = parent.fork_worker()
        if forked is not None:  # this is the parent: it outlives the worker, nothing more
            return parent.run_parent(settings, *forked)
    return start_node(settings, lease_pipe=parent.worker_pipe())
