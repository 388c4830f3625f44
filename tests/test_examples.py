"""The README example and every script under examples/ run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuco import Directives

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


def test_torch_call_outside_torchrun_says_how_to_run_it(tmp_path):
    """Run as a plain script (no torchrun, no GPU): one line saying how, exit 2, no traceback."""
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "torch_call.py")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")})
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out and "torchrun --standalone" in out, out


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


def test_public_api_docstring_examples_run():
    """Every ``>>>`` example in the docstring of a name ``cuco`` exports runs as written (those
    that need GPUs or write files say ``doctest: +SKIP``)."""
    import doctest

    import cuco
    finder, ran = doctest.DocTestFinder(recurse=False), 0
    for name in cuco.__all__:
        obj = getattr(cuco, name)
        for test in finder.find(obj, name, globs={n: getattr(cuco, n) for n in cuco.__all__}):
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test, out=lambda text: None)
            assert runner.failures == 0, f"cuco.{name}'s docstring example fails: {test.filename}"
            ran += runner.tries
    assert ran >= 6  # CandidateDB, DesignSpace, Directives, make_problem


# ---- examples/custom_op.py: a new op from outside the package (issue #38) -------------------
def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_custom_op_dry_run_searches_it_by_name_and_stores_model_verdicts(tmp_path):
    from cuco.db import CandidateDB
    r = _run(str(ROOT / "examples" / "custom_op.py"), "--dry-run", "--shape", "m=2048,k=1024,n=512",
             "--budget", "8", "--db", "c.db", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    head = re.search(r"^gemm_allgather/M2048K1024N512/bf16: (\d+) valid points", r.stdout, re.M)
    assert head and int(head.group(1)) > 0, r.stdout  # its problem by name, its space non-empty
    with CandidateDB(tmp_path / "c.db") as store:
        (run,) = store.runs()
        assert run.workload == "gemm_allgather" and run.problem["m"] == 2048
        verdicts = store.evaluations()
        assert len(verdicts) == 8 and {v.evidence for v in verdicts} == {"model"}
        cand, best = store.best("gemm_allgather", run_id=run.id)
        assert best.status == "ok" and best.speedup > 0 and cand.directives["placement"] == "side_stream"
    assert f"best {Directives(**cand.directives).full_name}: ok" in r.stdout


def test_custom_op_refuses_a_bad_shape_in_one_line_naming_the_field(tmp_path):
    r = _run(str(ROOT / "examples" / "custom_op.py"), "--dry-run", "--shape", "1001x1024x512",
             "--db", "c.db", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["error: gemm_allgather: M=1001 rows are split over 2 "
                                             "ranks; choose M a multiple of 2; use m=1000"]
    assert not (tmp_path / "c.db").exists()  # refused before anything was opened


def test_custom_op_goes_through_the_cli_as_a_plugin(tmp_path):
    plugin = ("--plugin", str(ROOT / "examples" / "custom_op.py"))
    r = _run("-m", "cuco.cli", *plugin, "search", "--workload", "gemm_allgather", "--shape",
             "1024x512x256", "--dry-run", "--budget", "6", "--islands", "1", "--db", "c.db",
             cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gemm_allgather 1024x512x256 w=2" in r.stdout
    bad = _run("-m", "cuco.cli", *plugin, "search", "--workload", "gemm_allgather", "--shape",
               "1024x512x250", "--dry-run", "--db", "c.db", cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "N=250 makes rows of 500 bytes" in bad.stderr and "use --shape 1024x512x248" in bad.stderr
    unknown = _run("-m", "cuco.cli", "search", "--workload", "gemm_allgather", "--dry-run",
                   "--db", "c.db", cwd=tmp_path)  # without the plugin: not a known name
    assert unknown.returncode == 2 and "unknown workload 'gemm_allgather'" in unknown.stderr
    assert "cuco --plugin FILE" in unknown.stderr  # the way to make it known



def test_the_package_docstrings_first_look_runs_and_dir_lists_the_lazy_names(tmp_path):
    """``help(cuco)`` opens with an example: it runs as written (in a folder of its own, so a
    database it might write lands there) and leaves no file; ``dir(cuco)`` shows Evaluator and
    WorkerGroup, which are imported on first use."""
    import textwrap
    import cuco
    code = textwrap.dedent(cuco.__doc__.split("::", 1)[1].split("\n\nThe names", 1)[0])
    r = _run("-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "valid points; the most conservative: lsa." in r.stdout
    assert list(tmp_path.iterdir()) == []
    assert {"Evaluator", "WorkerGroup", "search", "make_problem"} <= set(dir(cuco))


def test_the_entry_points_show_their_real_signatures_and_stay_lazy():
    """help(cuco.search) showed (*args, **kwargs) from a wrapper; the entry points are now
    the functions themselves, imported on first use, so `import cuco` stays light."""
    import inspect
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import sys, cuco; print('cuco.agents.api' in sys.modules, "
                        "'cuco.export' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "False"], r.stdout + r.stderr
    import cuco
    for name, first in (("search", "workload"), ("fastpath", "workload"), ("tune", "workload"), ("load", "path")):
        params = inspect.signature(getattr(cuco, name)).parameters
        assert next(iter(params)) == first and "args" not in params, (name, params)
