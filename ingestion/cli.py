"""The command line: ``python -m ingestion [run|simulate|inspect|tail|watch|demo] ...`` (CONTRACT.md).

Exit status: 0 after a clean shutdown, 2 for a usage or configuration error (one line per problem on
stderr, naming the setting), 1 for a fatal runtime error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from actors.clock import BootClock
from ingestion.config import ConfigError, Settings, load

COMMANDS = ("run", "simulate", "inspect", "tail", "watch", "demo")


class UsageError(Exception):
    pass


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ingestion [run]",
        description="Run one ingestion node: join the election and ingest Horizon (or Stellar RPC "
        "contract events) while leader.",
    )
    p.add_argument("--config", type=Path, help="TOML file (default: ./config.toml if present)")
    p.add_argument("--node-id", help="this node's id (default: <hostname>-<pid>)")
    p.add_argument(
        "--job", action="append", metavar="NAME[=RESOURCE]",
        help="a singleton job to host (repeatable; RESOURCE defaults to --resource; default: "
        "every [jobs.NAME] table, or one job named horizon)",
    )
    p.add_argument("--horizon", action="append", metavar="URL", help="Horizon base URL (repeatable)")
    p.add_argument("--resource", help="Horizon collection path, e.g. /operations (default)")
    p.add_argument(
        "--start-cursor",
        help="now (default), 0 or a paging token; for --source rpc: now, 0, a ledger number or an "
        "event id",
    )
    p.add_argument(
        "--source", choices=("horizon", "rpc"),
        help="what the jobs follow: a Horizon collection (default) or Stellar RPC contract events",
    )  # fmt: skip
    p.add_argument("--rpc", action="append", metavar="URL", help="Stellar RPC URL (repeatable)")
    p.add_argument(
        "--contract-id", action="append", metavar="C",
        help="getEvents filter: a contract id (repeatable, at most 5)",
    )  # fmt: skip
    p.add_argument(
        "--event-type", choices=("contract", "system"), help="getEvents filter: the event type"
    )
    p.add_argument(
        "--topic", action="append", metavar="SEG[,SEG...]",
        help="getEvents filter: a topic (repeatable, at most 5): 1 to 4 segments, each a base64 "
        "ScVal, *, sym:NAME, str:TEXT, address:G...|C..., u32:N, i128:N, ..., then optionally **",
    )  # fmt: skip
    p.add_argument("--redis", metavar="URL", help="redis:// or rediss:// URL")
    p.add_argument("--lease-ttl-ms", type=int, metavar="N", help="lease TTL in milliseconds")
    p.add_argument(
        "--events-max-len", type=int, metavar="N",
        help="keep about N events-stream entries, never unacknowledged ones (0: all)",
    )
    p.add_argument("--metrics-port", type=int, metavar="N", help="Prometheus /metrics port")
    p.add_argument("--status-port", type=int, metavar="N", help="WebSocket status port")
    p.add_argument("--log-level", help="debug, info, warning or error")
    p.add_argument("--log-format", choices=("json", "console", "auto"), help="log rendering")
    return p


def _flags_layer(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    pairs = {
        ("node", "id"): ns.node_id,
        ("node", "job"): ns.job,
        ("horizon", "urls"): ns.horizon,
        ("horizon", "resource"): ns.resource,
        ("horizon", "start_cursor"): ns.start_cursor,
        ("rpc", "start_cursor"): ns.start_cursor,
        ("node", "source"): getattr(ns, "source", None),
        ("rpc", "urls"): getattr(ns, "rpc", None),
        ("rpc", "contract_ids"): getattr(ns, "contract_id", None),
        ("rpc", "event_type"): getattr(ns, "event_type", None),
        ("rpc", "topics"): getattr(ns, "topic", None),
        ("redis", "url"): ns.redis,
        ("lease", "ttl_ms"): ns.lease_ttl_ms,
        ("events", "max_len"): getattr(ns, "events_max_len", None),
        ("observe", "metrics_port"): getattr(ns, "metrics_port", None),
        ("observe", "status_port"): getattr(ns, "status_port", None),
        ("log", "level"): getattr(ns, "log_level", None),
        ("log", "format"): getattr(ns, "log_format", None),
    }
    layer: dict[str, dict[str, Any]] = {}
    for (section, key), value in pairs.items():
        if value is not None:
            layer.setdefault(section, {})[key] = value
    return layer


def load_settings(ns: argparse.Namespace) -> Settings:
    return load(ns.config, os.environ, _flags_layer(ns))


def cmd_run(argv: Sequence[str]) -> int:
    ns = _run_parser().parse_args(argv)
    settings = load_settings(ns)
    from ingestion.node import build_source, preflight, run_node_process

    problems = []
    for job in settings.jobs:
        try:
            build_source(settings, job)
        except ValueError as exc:
            section = "rpc" if job.kind == "rpc" else "horizon"
            problems.append(f"jobs.{job.name}: {exc}" if len(settings.jobs) > 1 else f"{section}: {exc}")
    if problems:
        raise ConfigError(problems)
    preflight(settings)
    return trio.run(run_node_process, settings, clock=BootClock())


def cmd_inspect(argv: Sequence[str]) -> int:
    from ingestion.inspect import main

    return main(list(argv))


def cmd_tail(argv: Sequence[str]) -> int:
    from ingestion.tail import main

    return main(list(argv))


def cmd_simulate(argv: Sequence[str]) -> int:
    from ingestion.simulator.cli import main

    return main(list(argv))


def cmd_watch(argv: Sequence[str]) -> int:
    from ingestion.watch import main

    return main(list(argv))


def cmd_demo(argv: Sequence[str]) -> int:
    from ingestion.demo import main

    return main(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = "run"
    if args and args[0] in COMMANDS:
        command = args.pop(0)
    handlers = {
        "run": cmd_run,
        "simulate": cmd_simulate,
        "inspect": cmd_inspect,
        "tail": cmd_tail,
        "watch": cmd_watch,
        "demo": cmd_demo,
    }
    try:
        return handlers[command](args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"ingestion: configuration error: {problem}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"ingestion: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

