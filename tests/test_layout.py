"""The layout is the architecture: ``actors/`` is the generic runtime and never imports ``ingestion``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ACTORS = Path(__file__).resolve().parent.parent / "actors"


def test_actors_source_never_names_ingestion() -> None:
    offenders = []
    for path in sorted(ACTORS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "ingestion"]
    assert offenders == []


def test_importing_every_actors_module_loads_no_ingestion_module() -> None:
    modules = sorted(
        ".".join(p.relative_to(ACTORS.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in ACTORS.rglob("*.py")
    )
    assert "actors.lease_store.store" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'ingestion' or m.startswith('ingestion.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
