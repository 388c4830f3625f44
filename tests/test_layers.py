"""The one-way rule of docs/architecture.md, checked on the source (no import runs).

Every ``import cuco...`` (at module level or inside a function) goes to a layer at or
below the importer's; no module imports another module's ``_private`` names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "cuco"

#: The diagram of docs/architecture.md as ranks: a module may import its own rank or lower.
RANK = {
    "errors": 0,
    "design": 1, "llm": 1, "dispatch": 1,
    "db": 2, "kernels": 2,
    "runtime": 3,
    "workloads": 4,
    "evaluate": 5, "fused_call": 5,
    "cluster": 6,
    "agents": 7,
    "export": 8, "torch_ops": 8, "report": 8, "benchmarks": 8, "doctor": 8, "results": 8,
    "dispatch_tune": 8,
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


#: Modules a layer may not import although they rank below it: the runtime runs any workload
#: and knows none (not the workloads, not the tensor-parallel templates' module; the
#: tensor-parallel arena takes its regions from the workload).
FORBIDDEN = {"runtime": ("cuco.workloads", "cuco.kernels.tp")}


def test_the_runtime_imports_no_workload_nor_the_tp_templates():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        me = _layer(".".join(rel.parts))
        for line, module, names in _imports(path):
            targets = [module, *(f"{module}.{n}" for n in names)]
            bad += [f"{rel}.py:{line} ({me}) imports {t}" for t in targets
                    for f in FORBIDDEN.get(me, ()) if t == f or t.startswith(f + ".")]
    assert not bad, "imports the runtime may not make:\n" + "\n".join(sorted(set(bad)))


def _module_strings(path: Path):
    """String constants of ``path`` that are a module path of ours (what
    ``importlib.import_module`` or a by-name reference takes), with their lines."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"cuco(\.\w+)+", node.value):
            yield node.lineno, node.value


def test_the_runtime_names_no_workload_module_in_a_string():
    """Nor by name: an ``importlib.import_module("cuco.workloads...")`` passes the import check."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        me = _layer(".".join(rel.parts))
        bad += [f"{rel}.py:{line} ({me}) names {s}" for line, s in _module_strings(path)
                for f in FORBIDDEN.get(me, ()) if s == f or s.startswith(f + ".")]
    assert not bad, "modules the runtime may not name:\n" + "\n".join(bad)


def test_the_name_check_sees_a_module_named_in_a_string(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('import importlib\nm = importlib.import_module("cuco.workloads.tp")\n'
                   '"""the workloads (cuco.workloads) run on it"""\n')
    assert list(_module_strings(mod)) == [(2, "cuco.workloads.tp")]


def test_the_forbidden_check_sees_an_import_of_the_tp_templates(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from cuco.kernels import tp\n    from cuco.kernels.tp import FLAG_STRIDE\n")
    found = [(m, names) for _, m, names in _imports(mod)]
    assert found == [("cuco.kernels", ["tp"]), ("cuco.kernels.tp", ["FLAG_STRIDE"])]
    assert any(f"{m}.{n}" == "cuco.kernels.tp" for m, names in found for n in names)


#: The op folders of ``workloads/`` (each op's workload, programs and launch code).
OPS = sorted(p.name for p in (SRC / "workloads").iterdir() if (p / "__init__.py").exists())


def test_an_op_folder_imports_no_other_op():
    """``workloads/tp/`` ... ``workloads/cp/`` share the protocol and the pipeline kind at the
    top of ``workloads/``, never each other's modules (the catalog above them lists all)."""
    assert OPS == ["cp", "kv", "moe", "tp"]
    bad = []
    for op in OPS:
        for path in sorted((SRC / "workloads" / op).rglob("*.py")):
            for line, module, names in _imports(path):
                targets = [module, *(f"{module}.{n}" for n in names)]
                bad += [f"{path.relative_to(SRC.parent)}:{line} imports {t}" for t in targets
                        for other in OPS if other != op
                        and (t == f"cuco.workloads.{other}" or t.startswith(f"cuco.workloads.{other}."))]
    assert not bad, "one op's folder imports another's:\n" + "\n".join(sorted(set(bad)))


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


# ---- no import cycle at any level (function-level imports included; ``if TYPE_CHECKING:``
# blocks left out, since they never run) ---------------------------------------------------
def _all_modules() -> dict[str, Path]:
    out = {}
    for p in SRC.parent.rglob("*.py"):
        name = ".".join(p.relative_to(SRC.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_targets(path: Path, known: set[str]) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cuco"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("cuco"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = _all_modules()
    known = set(mods)
    return {m: {d for d in _import_targets(p, known) if d != m and not m.startswith(d + ".")}
            for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


#: Cycles still there, each with why (issue #38 removes them; the list may only shrink):
#: ``Artifact.as_torch_op`` registers through torch_ops, whose tables load artifacts.
KNOWN_CYCLES = [["cuco.export", "cuco.torch_ops"]]


def test_no_import_cycle_at_any_level():
    found = cycles(graph())
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "a known cycle is gone: drop it"




def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
