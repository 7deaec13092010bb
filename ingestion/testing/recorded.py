"""Recorded real Horizon responses and real lake objects, which live outside the repository.

They sit in ``../shared/data/horizon`` (and ``../shared/data/lake``: real ledger metadata from
Stellar's data lake, see its README.md) beside the checkout (see its PROVENANCE.md) and are not
copied in, so a clean clone elsewhere (CI's) has none. ``INGESTION_RECORDED_DATA`` points at them
explicitly; then they must be there.

Tests that read them skip, when they are absent, through :func:`require` / :data:`needed` only,
with :data:`SKIP_REASON`: under ``CI=true`` the conftest lets through no other skip and reports
how many of these did not run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENV = "INGESTION_RECORDED_DATA"
HORIZON = Path(os.environ.get(ENV) or Path(__file__).resolve().parents[3] / "shared" / "data" / "horizon")
LAKE = HORIZON.parent / "lake"
SKIP_REASON = "recorded Horizon data lies outside the repository and is absent"


def present() -> bool:
    return HORIZON.is_dir()


def absence_excused() -> bool:
    """Whether a test may skip for want of the recordings under ``CI=true``: only when they are
    absent from the default place, not when ``INGESTION_RECORDED_DATA`` named a place."""
    return not os.environ.get(ENV) and not (present() and LAKE.is_dir())


excused: set[str] = set()
"""Node ids of the tests that skipped here: an async test's skip reaches pytest through trio
without its message, so the conftest recognises these by id, not by reason."""


def _skip(where: Path) -> None:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    if current:
        excused.add(current.rsplit(" (", 1)[0])
    import pytest  # lazy: optional dependency (pytest: only when a test skips)

    pytest.skip(f"{SKIP_REASON}: {where}")


def require(path: Path) -> Path:
    """``path`` under :data:`HORIZON`; the test skips (with :data:`SKIP_REASON`) without the
    recordings, and fails when they are there but ``path`` is not."""
    if not present():
        _skip(HORIZON)
    assert path.exists(), f"{path} is missing from the recordings"
    return path


def __getattr__(name: str) -> Any:
    """``needed``: the mark for tests (or ``pytestmark`` of modules) that read the recordings (made
    when first asked for, so that importing the kit does not import pytest)."""
    if name == "needed":
        import pytest  # lazy: optional dependency (pytest: only when a test skips)

        return pytest.mark.skipif(not present(), reason=f"{SKIP_REASON}: {HORIZON}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_lake(name: str) -> Path:
    """The real lake file ``name`` under :data:`LAKE`; skips (with :data:`SKIP_REASON`) when the
    recordings are absent, fails when they are there but the file is not."""
    if not LAKE.is_dir():
        _skip(LAKE)
    path = LAKE / name
    assert path.exists(), f"{path} is missing from the recordings"
    return path
