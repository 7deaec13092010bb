"""``ingestion simulate``: run the bundled Horizon (and Stellar RPC) simulator until SIGINT or SIGTERM.

Prints one JSON line on stdout once listening, ``{"event": "simulator-listening", "url": ...}``,
so that harnesses can read the URL (``--port 0`` picks a free port); with ``--rpc-port`` a Stellar
RPC server runs too and the line carries ``"rpc_url": ...`` (``--rpc-port 0``: a free port).
Exit status: 0 after a signal, 2 for a bad flag or an address it cannot listen on (one line
naming the flag), 130 on Ctrl-C while it starts.

The simulator (:mod:`ingestion.simulator`) is the stand-in network and imports nothing of the
command line; its command line is here, with the others.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import sys
from typing import Any

import trio

from ingestion.cli.usage import OneLineParser
from ingestion.simulator.server import SimulatorConfig, serve_simulator


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def parser() -> argparse.ArgumentParser:
    defaults = SimulatorConfig()
    p = OneLineParser(prog="ingestion simulate", description="Run the bundled Horizon simulator.")
    p.add_argument("--host", default=defaults.host)
    p.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    p.add_argument(
        "--ledger-interval",
        type=_non_negative_float,
        default=defaults.ledger_interval,
        help="seconds between ledger closes; 0: no live ledgers",
    )
    p.add_argument("--ops-per-ledger", type=int, default=defaults.ops_per_ledger)
    p.add_argument("--history-ledgers", type=int, default=defaults.history_ledgers)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--stream-timeout", type=_non_negative_float, default=defaults.stream_timeout)
    p.add_argument("--first-ledger", type=int, default=defaults.first_ledger)
    p.add_argument(
        "--cache-records",
        type=int,
        default=defaults.cache_records,
        help="about how many built records to keep in memory",
    )
    p.add_argument(
        "--response-delay-ms",
        type=int,
        default=defaults.response_delay_ms,
        help="delay every response (a page, a stream's first bytes) this long, sleeping: "
        "a real Horizon's query time",
    )
    p.add_argument(
        "--retention-ledgers",
        type=int,
        default=defaults.retention_ledgers,
        help="keep only the newest N ledgers, as Horizon's history retention; 0: everything",
    )
    p.add_argument(
        "--rate-limit",
        type=int,
        default=defaults.rate_limit,
        metavar="PER_HOUR",
        help="Horizon's per-client rate limit, requests an hour (the public one: 3600); 0: none",
    )
    p.add_argument(
        "--rate-burst",
        type=int,
        default=defaults.rate_burst,
        help="the rate limiter's burst (the public Horizon: 100)",
    )
    p.add_argument(
        "--sse-update-frequency",
        type=_non_negative_float,
        default=defaults.sse_update_frequency,
        help="seconds between a stream's polls for new ledgers (Horizon: 5); 0: at once",
    )
    p.add_argument(
        "--rpc-port",
        type=int,
        default=None,
        help="also run a Stellar RPC server (JSON-RPC: getEvents, getHealth, ...) on this port; "
        "0 picks a free port; absent: none",
    )
    p.add_argument(
        "--rpc-retention-ledgers",
        type=int,
        default=defaults.rpc_retention_ledgers,
        help="the RPC serves only the newest N ledgers (stellar-rpc's retention window, 7 days "
        "by default), whatever Horizon keeps; 0: every ledger the chain holds",
    )
    p.add_argument(
        "--rpc-max-healthy-latency",
        type=_non_negative_float,
        default=defaults.rpc_max_healthy_latency,
        help="getHealth fails once the latest ledger closed longer ago than this (seconds; "
        "stellar-rpc: 30); 0: always healthy",
    )
    p.add_argument(
        "--lake-dir",
        default=None,
        metavar="DIR",
        help="also write the chain into a data lake (SEP-54/Galexie layout) in DIR: every ledger "
        "from the first (RPC's and Horizon's retention do not apply), then each ledger as it closes",
    )
    p.add_argument(
        "--network-passphrase",
        default=defaults.network_passphrase,
        metavar="TEXT",
        help="the network's passphrase, as Horizon's root, RPC's getNetwork and the lake's manifest "
        "say it (a node's job pinned to another network holds off)",
    )
    return p


def config_from_args(argv: list[str]) -> SimulatorConfig:
    """Parse the flags into a config.

    Raises:
        UsageError: a bad flag (the CLI prints it as one line and exits 2).
    """
    args = parser().parse_args(argv)
    return SimulatorConfig(
        host=args.host,
        port=args.port,
        seed=args.seed,
        ledger_interval=args.ledger_interval or None,
        ops_per_ledger=args.ops_per_ledger,
        history_ledgers=args.history_ledgers,
        stream_timeout=args.stream_timeout,
        first_ledger=args.first_ledger,
        cache_records=args.cache_records,
        response_delay_ms=max(0, args.response_delay_ms),
        retention_ledgers=args.retention_ledgers,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        sse_update_frequency=args.sse_update_frequency,
        rpc_port=args.rpc_port,
        rpc_max_healthy_latency=args.rpc_max_healthy_latency,
        rpc_retention_ledgers=args.rpc_retention_ledgers,
        lake_dir=args.lake_dir,
        network_passphrase=args.network_passphrase,
    )


async def _run(config: SimulatorConfig) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            sim = await nursery.start(serve_simulator, config)
            listening = {"event": "simulator-listening", "url": sim.url}
            if sim.rpc_url:
                listening["rpc_url"] = sim.rpc_url
            print(json.dumps(listening), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel("signal received")
                break


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def listen_problem(exc: OSError, config: SimulatorConfig) -> str:
    """One line naming the flag that could not be listened on, and the fix."""
    text = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return f"--host: cannot listen on {config.host!r}: {text}: give an address of this machine"
    if exc.errno == errno.EADDRINUSE:
        given = [f"--port {config.port}"] if config.port else []
        given += [f"--rpc-port {config.rpc_port}"] if config.rpc_port else []
        port = " or ".join(given) or "--port"
        return f"{port}: already in use on {config.host} (another process listens there): choose another"
    return f"cannot listen on {config.host}: {text}"


def main(argv: list[str]) -> int:
    """Run the simulator with these flags (no ``simulate`` word); return the exit status:
    2 for a bad flag or an address it cannot listen on, 130 on Ctrl-C while starting."""
    try:
        config = config_from_args(argv)
    except SystemExit as exc:  # --help; a bad flag is a UsageError, one line from ingestion.cli
        return int(exc.code or 0)
    try:
        trio.run(_run, config)
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if all(isinstance(e, KeyboardInterrupt) for e in leaves):
            return 130
        listen = [e for e in leaves if isinstance(e, OSError)]
        if listen:
            print(f"ingestion: simulate: {listen_problem(listen[0], config)}", file=sys.stderr)
            return 2
        bad = [e for e in leaves if isinstance(e, ValueError)]
        if not bad:
            raise
        print(f"ingestion: simulate: {bad[0]}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ingestion: simulate: {listen_problem(exc, config)}", file=sys.stderr)
        return 2
    return 0
