"""Under ``CI=true`` a skip is a failure, except a recorded-data skip while that data (outside the
repository) is absent, which is counted in a closing line. Runs pytest on small test files with
the suite's conftest as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SKIPS = '''
import pytest
from pathlib import Path
from ingestion.testing import recorded

if not recorded.os.environ.get(recorded.ENV):
    recorded.HORIZON = Path(__file__).parent / "absent"  # as on a clone without ../shared

def test_no_compiler():
    pytest.skip("no C compiler for the clock shim")

@pytest.mark.skipif(True, reason="libfaketime is not installed")
def test_no_faketime():
    pass

def test_needs_recordings():
    recorded.require(recorded.HORIZON / "x.json")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
'''


def run_pytest(tmp_path: Path, ci: str, **env: str) -> str:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    (tmp_path / "test_missing_dependency.py").write_text(
        "import pytest\npytest.importorskip('no_such_module_here')\ndef test_x(): pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-q", "-rA", "--continue-on-collection-errors", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "CI": ci, **env},
    )  # fmt: skip
    return done.stdout


def test_under_ci_only_a_recorded_data_skip_is_a_skip(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "true", INGESTION_RECORDED_DATA="")
    assert "FAILED test_skips.py::test_no_compiler" in out
    assert "ERROR test_skips.py::test_no_faketime" in out  # a skipif fails at setup
    assert "ERROR test_missing_dependency.py" in out
    assert "SKIPPED [1]" in out and "outside the repository and is absent" in out
    assert "XFAIL test_skips.py::test_expected_failure" in out
    assert "1 tests did not run: they read recorded Horizon responses or lake objects" in out


def test_under_ci_recordings_asked_for_must_be_there(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "true", INGESTION_RECORDED_DATA=str(tmp_path / "nowhere"))
    assert "FAILED test_skips.py::test_needs_recordings" in out
    assert "SKIPPED" not in out


def test_outside_ci_skips_stay_skips(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "", INGESTION_RECORDED_DATA="")
    assert "FAILED test_skips.py::test_no_compiler" not in out
    assert "no C compiler" in out and "SKIPPED" in out
    assert "ERROR" not in out
