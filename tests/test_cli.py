"""The cuco command, run as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cuco import CandidateDB, Directives


def cuco(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, COLUMNS="400", **(env or {}))
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, env=full, timeout=300)


def test_help_lists_commands():
    r = cuco("--help")
    assert r.returncode == 0
    for cmd in ("doctor", "db", "bench", "kernels"):
        assert cmd in r.stdout


def test_doctor_reports_toolchain_and_keys():
    r = cuco("doctor", env={"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": "sk-test"})
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "nvcc" in out and "13." in out
    assert re.search(r"NCCL \(device API\)\s*│\s*ok\s*│\s*2\.\d+\.\d+", out), out
    assert "NVSHMEM" in out and "CUTLASS" in out
    assert "OPENAI_API_KEY not set" in out and "export OPENAI_API_KEY" in out
    assert "ANTHROPIC_API_KEY is set" in out
    assert '".[torch]"' in out or "torch (optional)" in out
    assert "pip install 'cuco" not in out  # the index's cuco is another project


def test_doctor_names_the_fix_for_missing_nvcc(tmp_path):
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        import pytest
        pytest.skip("a system CUDA at /usr/local/cuda is always found")
    env = {"PATH": str(tmp_path), "CUDA_HOME": "", "CUCO_NVCC": ""}
    r = cuco("doctor", env=env)
    assert r.returncode == 1
    assert "nvcc" in r.stdout and "missing" in r.stdout
    assert "CUDA_HOME" in r.stdout


def test_doctor_flags_a_bad_cuco_nvcc(tmp_path):
    r = cuco("doctor", env={"CUCO_NVCC": str(tmp_path / "nvcc")})
    assert r.returncode == 1
    assert "is not an executable nvcc" in r.stdout and "unset it" in r.stdout


def test_db_ls_and_show(tmp_path):
    path = tmp_path / "c.db"
    db = CandidateDB(path)
    run = db.create_run("demo", "gemm_allreduce")
    a = db.add_candidate("gemm_allreduce", directives=Directives(), source="__global__ void k(){}",
                         run_id=run)
    b = db.add_candidate("gemm_allreduce", directives=Directives(issuer="warp"), run_id=run,
                         parents=[a])
    db.add_evaluation(b, stage_reached="timing", status="ok", speedup=1.37, time_ms=0.9)
    db.close()
    r = cuco("db", "ls", "--db", str(path))
    assert r.returncode == 0, r.stderr
    assert "demo" in r.stdout and "1.370" in r.stdout
    r = cuco("db", "show", str(b), "--db", str(path))
    assert r.returncode == 0, r.stderr
    assert f"lineage: {b} <- {a}" in r.stdout
    assert '"issuer": "warp"' in r.stdout and "1.37" in r.stdout
    r = cuco("db", "show", str(a), "--db", str(path), "--source")
    assert "__global__ void k(){}" in r.stdout
    r = cuco("db", "show", "42", "--db", str(path))
    assert r.returncode == 2 and "no candidate 42" in r.stderr and not r.stdout  # errors on stderr


def test_db_commands_explain_a_missing_database(tmp_path):
    r = cuco("db", "ls", "--db", str(tmp_path / "nope.db"))
    assert r.returncode == 1
    assert "no candidate database" in r.stderr and "--db" in r.stderr
    assert not (tmp_path / "nope.db").exists()


def test_fastpath_says_what_it_needs(tmp_path):
    r = cuco("fastpath", "--llm", "openai:gpt-4o", "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2 and "error: --llm needs --host-program FILE" in r.stderr
    prog = tmp_path / "layer.cu"
    prog.write_text("ncclAllReduce(y, y, n, ncclBfloat16, ncclSum, comm, stream);\n")
    r = cuco("fastpath", "--host-program", str(prog), "--db", str(tmp_path / "c.db"),
             env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 1 and "GPU(s) visible but the fast path needs 2" in r.stderr
    assert "cuco search --dry-run" in r.stderr  # --emulate cannot help without a GPU
    r = cuco("fastpath", "--shape", "8192x8192", "--db", str(tmp_path / "c.db"))
    assert r.returncode == 2 and "is not MxKxN" in r.stderr


def test_search_placements_narrow_the_space_and_bad_ones_are_named(tmp_path):
    db = tmp_path / "c.db"
    r = cuco("search", "--dry-run", "--placements", "epilogue,bogus", "--db", str(db))
    assert r.returncode == 2 and "choose among side_stream, epilogue, dedicated_ctas" in r.stderr
    r = cuco("search", "--dry-run", "--placements", "side_stream", "--budget", "10", "--islands", "2",
             "--shape", "2048x4096x4096", "--db", str(db))
    assert r.returncode == 0, r.stdout + r.stderr
    got = {c.directives["placement"] for c in CandidateDB(db).candidates()}
    assert got == {"side_stream"}


@pytest.mark.slow
def test_a_compile_pass_into_a_log_prints_a_line_per_build():
    """Where the output is not a terminal (CI, a log file) the progress bar shows nothing until
    the end: each finished build prints its own line (the collectives' compile-only pass, into
    the session's cache: the catalog's builds of the same collectives and shims)."""
    from cuco.kernels.catalog import SHIMS
    from cuco.kernels.collectives import all_sources
    env = dict(os.environ, COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "bench", "collectives"], capture_output=True,
                       text=True, env=env, timeout=900)
    lines = [x for x in r.stdout.splitlines() if x.startswith("compiled ")]
    assert r.returncode == 0, r.stdout + r.stderr
    total = len(all_sources()) + len(SHIMS)
    assert len(lines) == total and lines[-1].startswith(f"compiled {total}/{total} in ")
    assert all(x.endswith(" ok") for x in lines), lines
