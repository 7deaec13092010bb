"""What the tests of deploy/ share: the repository's deploy folder, and external tools that CI
must have (scripts/setup installs them) but a developer's machine may lack."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def require_tool(name: str, package: str) -> str:
    """The path of ``name``; skips the test when it is missing, except under CI (``CI=true``),
    where scripts/setup installs it and its absence is a failure."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package {package}; scripts/setup installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def unknown_metrics(expr_text: str) -> set[str]:
    """The ``ingestion_*`` names a PromQL text queries that no node serves (as the reference lists
    them: ``python -m ingestion.cli.reference``; a histogram's ``_bucket``, ``_sum``, ``_count``)."""
    from ingestion.cli.reference import metric_families

    known = set()
    for name, kind, _, _ in metric_families():
        known.add(name)
        if kind == "histogram":
            known |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return set(re.findall(r"\bingestion_[a-z_]+", expr_text)) - known - {"ingestion_job"}
