"""Dependencies point one way (DESIGN.md): design <- kernels <- runtime <- workloads <-
evaluate <- agents <- cli/report/export, with no import cycle at any level (function-level
imports included; ``if TYPE_CHECKING:`` blocks left out, since they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
#: Lower layers first; a module may import only its own layer and the ones before it.
LAYERS = ["cuco.errors", "cuco.design", "cuco.kernels", "cuco.runtime", "cuco.workloads",
          "cuco.evaluate", "cuco.agents"]


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(path: Path, known: set[str]) -> set[str]:
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
    mods = _modules()
    known = set(mods)
    return {m: {d for d in _imports(p, known) if d != m and not m.startswith(d + ".")}
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


def layer(module: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return None


def test_no_import_cycle_at_any_level():
    assert cycles(graph()) == []


def test_no_lower_layer_imports_a_higher_one():
    bad = [(m, d) for m, deps in graph().items() for d in deps
           if layer(m) is not None and layer(d) is not None and layer(d) > layer(m)]
    assert bad == []


def test_the_checks_can_fail():
    """The cycle finder and the layer order catch what they are for."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("cuco.runtime.arena") < layer("cuco.workloads.tp")
    with pytest.raises(AssertionError):
        assert cycles({"x": {"y"}, "y": {"x"}}) == []
