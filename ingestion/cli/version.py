"""``ingestion version``: print the version."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ingestion import __version__
from ingestion.cli.usage import UsageError


def parser() -> argparse.ArgumentParser | None:
    """None: ``version`` takes no flags."""
    return None


def main(argv: Sequence[str]) -> int:
    if argv:
        raise UsageError(f"ingestion version: takes no arguments, got {' '.join(argv)}")
    print(f"ingestion {__version__}")
    return 0
