"""The one-way rule of docs/architecture.md, checked on the source (no import runs).

Every ``import cuco...`` (at module level or inside a function) goes to a layer at or
below the importer's; no module imports another module's ``_private`` names.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "cuco"

#: The diagram of docs/architecture.md as ranks: a module may import its own rank or lower.
RANK = {
    "errors": 0,
    "design": 1, "llm": 1,
    "db": 2, "kernels": 2,
    "runtime": 3,
    "workloads": 4,
    "evaluate": 5, "fused_call": 5,
    "cluster": 6,
    "agents": 7,
    "export": 8, "torch_ops": 8, "report": 8, "benchmarks": 8, "doctor": 8, "results": 8,
    "cli": 9,
    "__init__": 10,
}
#: Names of the package root that any layer may read (constants, no imports behind them).
ROOT_CONSTANTS = {"__version__"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "cuco":
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cuco":
                    yield node.lineno, a.name, []


def test_imports_point_down_the_layers():
    up = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        me = _layer(".".join(rel.parts))
        assert me in RANK, f"{rel}: add its layer to RANK and to docs/architecture.md"
        for line, module, names in _imports(path):
            targets = [module]
            if module == "cuco" and names:  # from cuco import results / __version__
                targets = [f"cuco.{n}" for n in names if n not in ROOT_CONSTANTS]
            for t in targets:
                if RANK.get(_layer(t), RANK["__init__"]) > RANK[me]:
                    up.append(f"{rel}.py:{line} ({me}) imports {t}")
    assert not up, "imports against the one-way rule:\n" + "\n".join(up)


def test_no_module_imports_private_names():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        me = ".".join(rel.parts).removesuffix(".__init__")
        for line, module, names in _imports(path):
            if module == me:
                continue
            bad += [f"{rel}.py:{line} imports {module}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__")]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)
