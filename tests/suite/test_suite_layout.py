"""The suite's own layout: test modules hold tests; what several of them share lives in helper
modules (tests/nodes.py, ...) or in the testing kit (ingestion/testing/cluster.py, wait.py, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.rpartition(".")[2].startswith("test_")
            ]
    assert offenders == [], "move what they share into a helper module"
