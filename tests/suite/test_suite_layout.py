"""The suite's own layout.

- Every test module lives in an area directory, one level below ``tests/`` (``tests/election/``,
  ``tests/redis/``, ``tests/rpc/``, ...; these tests in ``tests/suite/``): none directly under
  ``tests/``. A module drops its area's prefix (``tests/rpc/test_follower.py``, not ``test_rpc_core.py``);
  every directory has an ``__init__.py``, so same-named modules of two areas do not clash.
- What several test modules share, besides fixtures, lives in the one helper package
  ``tests/support/`` (``tests/support/nodes.py``, ..., ``tests/support/native/``) or in the testing
  kit (``ingestion/testing/cluster.py``, ``wait.py``, ...). No helper module anywhere else, and no
  test module in ``tests/support/``.
- Fixtures stay in ``conftest.py``.
- A test module never imports another test module: what they share moves to ``tests/support/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = TESTS / "support"
NOT_HELPERS = ("__init__.py", "conftest.py")


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [
                f"{path.relative_to(TESTS)}:{node.lineno} {n}"
                for n in names
                if n.rpartition(".")[2].startswith("test_")
            ]
    assert offenders == [], "move what they share into a helper module"


def test_every_test_module_lives_in_an_area_directory() -> None:
    tests = [p for p in _modules() if p.name.startswith("test_")]
    assert tests, "no test modules found"
    misplaced = [
        str(p.relative_to(TESTS))
        for p in tests
        if len(p.relative_to(TESTS).parts) != 2 or p.parent == SUPPORT
    ]
    assert misplaced == [], "a test module goes in tests/<area>/, never in tests/ or tests/support/"


def test_every_directory_is_a_package() -> None:
    below = (p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__" and p.name[0] != ".")
    directories = [TESTS, *below]
    missing = [str(d.relative_to(TESTS.parent)) for d in directories if not (d / "__init__.py").exists()]
    assert missing == [], "each directory needs an __init__.py (module names stay unique)"


def test_helper_modules_live_in_tests_support() -> None:
    helpers = [p for p in _modules() if not p.name.startswith("test_") and p.name not in NOT_HELPERS]
    assert helpers, "no helper modules found"
    elsewhere = [str(p.relative_to(TESTS)) for p in helpers if SUPPORT not in p.parents]
    assert elsewhere == [], "a helper module goes in tests/support/ (fixtures in conftest.py)"
