"""The command line: ``ingestion COMMAND``, one of :data:`COMMANDS` (``run``, ``tail``, ...).

Installed as the ``ingestion`` console script and run by ``python -m ingestion``; with no
subcommand (``python -m ingestion --node-id n1 ...``) it means ``run``.

Exit status: 0 after a clean shutdown, 2 for a usage or configuration error (one line per problem on
stderr, naming the setting or flag), 1 for a fatal runtime error, 130 when interrupted (Ctrl-C)
before the node runs (143 for SIGTERM); ``run``'s worker process killed by signal N: 128 + N, once
its parent has released its leases (ingestion/node/parent.py).

The one command table, :data:`COMMANDS`, names each command's module; a command module has
``parser()`` (None: no flags) and ``main(argv)``, and is imported only when its command runs.
What the parsers share is in :mod:`ingestion.cli.usage`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any, NamedTuple

from ingestion.cli.usage import UsageError
from ingestion.node import stop_signals


class Command(NamedTuple):
    module: str  # exposes parser() and main(argv)
    summary: str  # its one line in ``ingestion --help``


COMMANDS: dict[str, Command] = {
    "run": Command(
        "ingestion.cli.run", "run one node: join the election and ingest while leader (the default)"
    ),
    "simulate": Command("ingestion.cli.simulate", "run the bundled Horizon (and Stellar RPC) simulator"),
    "inspect": Command("ingestion.cli.inspect", "show every job's state in Redis, or one job's (--job)"),
    "tail": Command("ingestion.cli.tail", "print a job's events stream, one record per line"),
    "watch": Command("ingestion.cli.watch", "show several nodes' status sockets live"),
    "demo": Command("ingestion.cli.demo", "a local cluster, a killed leader and the takeover, to watch"),
    "verify": Command(
        "ingestion.cli.verify",
        "check a job's events stream against its source (exit 0: exactly once, 1: not)",
    ),
    "audit": Command(
        "ingestion.cli.audit",
        "check an rpc or lake job's store against the data lake (exit 0: equal, 1: not)",
    ),
    "check-config": Command(
        "ingestion.cli.check_config",
        "print every setting, resolved and validated, with where it came from",
    ),
    "webhooks": Command(
        "ingestion.cli.webhooks",
        "the webhook jobs: status, replay, enable, pause, resume (the leaders carry them out)",
    ),
    "watchlist": Command(
        "ingestion.cli.watchlist", "edit a job's watch list in Redis (add, remove, count, show) while it runs"
    ),
    "backfill": Command(
        "ingestion.cli.backfill", "backfill a span of an rpc or lake job in parallel ranges across the nodes"
    ),
    "handover": Command(
        "ingestion.cli.handover", "ask a job's leader to hand it over gracefully to a standby (audited)"
    ),
    "api": Command(
        "ingestion.cli.api", "serve the events API (stellar-rpc's getEvents over all we hold), read-only"
    ),
    "cursor": Command(
        "ingestion.cli.cursor", "move a job on after a network reset: cursor reset JOB --to ... (audited)"
    ),
    "version": Command("ingestion.cli.version", "print the version"),
}


def parser_of(command: str) -> argparse.ArgumentParser | None:
    """The parser behind ``ingestion COMMAND`` (None: ``version``, which takes no flags), as used by
    the generated reference (``python -m ingestion.cli.reference``)."""
    parser: argparse.ArgumentParser | None = import_module(COMMANDS[command].module).parser()
    return parser


def top_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: ingestion [--version] [--help] COMMAND [FLAGS...]",
        "       python -m ingestion [run] [FLAGS...]",
        "",
        "Highly available Stellar Horizon / Stellar RPC ingestion into Redis, with fencing tokens.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()),
        "",
        "With no command, the flags are run's: `python -m ingestion --node-id n1 ...`.",
        "`ingestion COMMAND --help` shows a command's flags, with defaults and environment variables.",
    ]
    return "\n".join(lines)

def _only_interrupts(group: BaseExceptionGroup[Any]) -> bool:
    rest = group.split(KeyboardInterrupt)[1]
    return rest is None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(top_help())
        return 0
    if args and args[0] in ("-V", "--version"):
        args[0] = "version"
    command = "run"
    if args and args[0] in COMMANDS:
        command = args.pop(0)
    elif args and not args[0].startswith("-"):
        print(
            f"ingestion: unknown command {args[0]!r}: one of {', '.join(COMMANDS)} (see ingestion --help)",
            file=sys.stderr,
        )
        return 2
    from ingestion.config import ConfigError  # lazy: CLI start-up (ingestion.config, ~300 ms): not for --help

    try:
        if command != "run":
            stop_signals.release()  # (held since start-up: see ingestion/node/stop_signals.py)
        handler = import_module(COMMANDS[command].module).main
        return int(handler(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"ingestion: configuration error: {problem}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"ingestion: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        # Ctrl-C inside a nursery, before the node's own signal handling is in place.
        if _only_interrupts(group):
            return 130
        raise
