"""The ``ingestion`` command run as an operator runs it: a real process, its status and stderr."""

from __future__ import annotations

import os
import subprocess
import sys


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INGESTION_")}


def run(
    *args: str, timeout: float = 30, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingestion", *args],
        capture_output=True, text=True, timeout=timeout, env={**env(), **(extra_env or {})},
    )  # fmt: skip


def one_line(done: subprocess.CompletedProcess[str], status: int = 2) -> str:
    """The one line on stderr of a command that failed with ``status`` (never a traceback)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return lines[0]
