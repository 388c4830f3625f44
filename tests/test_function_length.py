"""No function over 60 lines in ``workloads/`` or ``evaluate/`` (issue #38): a longer one holds
several jobs, each of which deserves a name. Counted from ``def`` to its last line, docstring
and nested functions included (a nested function is also counted on its own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cuco"
MAX_LINES = 60


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function under ``root`` longer than ``limit``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                               f"({lines} lines)")
    return out


@pytest.mark.parametrize("folder", ["workloads", "evaluate"])
def test_no_function_is_longer_than_60_lines(folder):
    found = long_functions(SRC / folder)
    assert found == [], f"split into named steps (at most {MAX_LINES} lines each):\n" + "\n".join(found)


def test_the_check_counts_from_def_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))
    (tmp_path / "fits.py").write_text(f"def fits():\n{body}\n")
    assert long_functions(tmp_path) == []
    (tmp_path / "long.py").write_text(f"class C:\n    def long(self):\n        def inner():\n"
                                      f"            pass\n{body.replace('    ', '        ')}\n")
    assert long_functions(tmp_path) == [f"{tmp_path.name}/long.py:2 long ({MAX_LINES + 2} lines)"]
