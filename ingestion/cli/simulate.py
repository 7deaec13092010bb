"""``ingestion simulate``: the bundled Horizon (and Stellar RPC) simulator, whose command line
lives with it (:mod:`ingestion.simulator.cli`)."""

from __future__ import annotations

import argparse

from ingestion.simulator import cli


def parser() -> argparse.ArgumentParser:
    return cli._parser()


def main(argv: list[str]) -> int:
    return cli.main(argv)
