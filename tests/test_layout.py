"""The layout is the architecture, and these tests keep its one-way rules.

``actors/`` is the generic runtime and never imports ``ingestion``. Inside ``ingestion/`` the
dependencies run one way: runtime <- what both sources share <- each source <- the entry points
(CLI, node, config, ops tools). The two sources never import each other, and the simulator (a
stand-in for the network) never imports the node's sources, only the wire rules it shares with them.
docs/ARCHITECTURE.md draws the same picture and names every module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ACTORS = ROOT / "actors"

# Layer -> the module prefixes it consists of (longest prefix wins).
LAYERS: dict[str, tuple[str, ...]] = {
    "runtime": ("actors",),
    "shared": ("ingestion.common",),
    "horizon": ("ingestion.horizon",),
    "rpc": ("ingestion.rpc",),
    # the wire rules of Stellar RPC, which the node's RPC source and the simulator's RPC share
    "rpc-wire": ("ingestion.rpc.protocol",),
    # the data lake source: its events are RPC's, so it reads the RPC wire rules (ids, filters), and
    # nothing else of the RPC source
    "lake": ("ingestion.lake",),
    # the wire rules of a data lake (the SEP-54 layout: manifest and object keys), which the lake
    # source reads and the simulator's lake writer writes; like rpc-wire, the one piece of a source
    # the simulator may share, so the simulator still never imports how the node reads the lake
    "lake-wire": ("ingestion.lake.keys",),
    "simulator": ("ingestion.simulator",),
    # `simulate`'s command line is an entry point (it shares the CLI's one-line usage errors)
    "entry": ("ingestion", "ingestion.simulator.cli"),
}
# Layer -> the layers it may import.
ALLOWED: dict[str, set[str]] = {
    "runtime": {"runtime"},
    "shared": {"runtime", "shared"},
    "rpc-wire": {"runtime", "shared", "rpc-wire"},
    "horizon": {"runtime", "shared", "horizon"},
    "rpc": {"runtime", "shared", "rpc", "rpc-wire"},
    "lake-wire": {"lake-wire"},
    "lake": {"runtime", "shared", "lake", "lake-wire", "rpc-wire"},
    "simulator": {"shared", "rpc-wire", "lake-wire", "simulator"},
    "entry": {"runtime", "shared", "horizon", "rpc", "rpc-wire", "lake", "lake-wire", "simulator", "entry"},
}


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return best[1] if best else None


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def project_modules() -> list[Path]:
    return sorted([*ACTORS.rglob("*.py"), *(ROOT / "ingestion").rglob("*.py")])


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every project import in ``path``, function-level ones included."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return [(line, m) for line, m in found if m.split(".")[0] in ("actors", "ingestion")]


def test_every_project_module_belongs_to_a_layer() -> None:
    assert [module_name(p) for p in project_modules() if layer_of(module_name(p)) is None] == []


def test_imports_follow_the_one_way_rules() -> None:
    offenders = []
    for path in project_modules():
        layer = layer_of(module_name(path))
        assert layer is not None
        for line, target in imports_of(path):
            target_layer = layer_of(target)
            if target_layer not in ALLOWED[layer]:
                where = f"{path.relative_to(ROOT)}:{line}"
                offenders.append(f"{where} ({layer}) imports {target} ({target_layer})")
    assert offenders == []


@pytest.mark.parametrize(
    ("module", "target", "allowed"),
    [
        ("actors.elector", "ingestion.config", False),
        ("ingestion.rpc.source", "ingestion.horizon.core", False),
        ("ingestion.horizon.source", "ingestion.rpc.core", False),
        ("ingestion.horizon.core", "ingestion.node", False),
        ("ingestion.simulator.app", "ingestion.horizon.source", False),
        ("ingestion.common.retry", "ingestion.horizon.core", False),
        ("ingestion.simulator.rpc", "ingestion.rpc.protocol", True),
        ("ingestion.rpc.core", "ingestion.common.retry", True),
        ("ingestion.node", "ingestion.rpc.source", True),
        ("ingestion.lake.source", "ingestion.rpc.protocol", True),
        ("ingestion.lake.source", "ingestion.rpc.source", False),
        ("ingestion.rpc.core", "ingestion.lake.core", False),
        ("ingestion.simulator.lake", "ingestion.lake.keys", True),
        ("ingestion.simulator.lake", "ingestion.lake.events", False),
        ("ingestion.lake.keys", "ingestion.rpc.protocol", False),
    ],
)
def test_the_rules_refuse_what_they_should(module: str, target: str, allowed: bool) -> None:
    source, dest = layer_of(module), layer_of(target)
    assert source is not None and dest is not None
    assert (dest in ALLOWED[source]) is allowed


def test_importing_every_actors_module_loads_no_ingestion_module() -> None:
    modules = sorted(module_name(p) for p in ACTORS.rglob("*.py"))
    assert "actors.lease_store.store" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'ingestion' or m.startswith('ingestion.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_architecture_doc_names_every_module() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = [
        str(p.relative_to(ROOT))
        for p in project_modules()
        if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in text
    ]
    assert missing == [], "docs/ARCHITECTURE.md's layout does not name these modules"
