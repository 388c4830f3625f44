"""The README example and every script under examples/ run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: Scripts that run under another launcher; the examples that start them run here.
LAUNCHED = {"torch_call.py": "runs under torchrun on 2 GPUs, started by search_report_export.py"}


#: Examples that compile a kernel with nvcc (tens of seconds on 2 cores): marked ``slow``, so
#: that CI runs them with the kernel builds (``pytest -m slow``), not the README's quick run.
COMPILING = {"search_report_export.py": "packs the winner: one nvcc build"}


@pytest.mark.parametrize("script", [pytest.param(p.name, marks=pytest.mark.slow) if p.name in COMPILING
                                    else p.name for p in sorted((ROOT / "examples").glob("*.py"))
                                    if p.name not in LAUNCHED])
def test_example_runs(script, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip()


@pytest.mark.parametrize("script", sorted(LAUNCHED))
def test_launched_examples_compile(script):
    compile((ROOT / "examples" / script).read_text(), script, "exec")


def test_readme_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 25
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "valid points" in r.stdout and "sync_scope=chunk" in r.stdout
    assert "\nmodel\n" in r.stdout  # the example's score is marked as the model's
    assert not (tmp_path / "cuco.db").exists()  # never the CLI's default database


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = 'python3 -m pytest -q -n 2 -m "not slow"'
    assert test_cmd in readme and test_cmd in ci.strip().splitlines()
    assert 'python3 -m pytest -q -n 2 -m slow' in ci.strip().splitlines()  # CI runs every test


def test_public_api_imports_without_torch_or_gpu():
    code = ("import sys, cuco\n"
            "from cuco import DesignSpace, Directives, CandidateDB, Evaluator, EvolutionAgent, "
            "FastPathAgent, Island, Workload, WorkerGroup, search, load, tune\n"
            "assert 'torch' not in sys.modules\n"
            "missing = [n for n in cuco.__all__ if not hasattr(cuco, n)]\n"
            "assert not missing, missing\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
