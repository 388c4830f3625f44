"""Result files and the collectives benchmark's CPU-side helpers."""

from __future__ import annotations

import json
import sys

import pytest

from cuco import results
from cuco.benchmarks.collectives import CollectivesBench, bus_factor, parse_size, size_label
from cuco.evaluate.collective_job import CollectiveCase
from cuco.runtime.records import FailedCall, ProgramRecord, RankResult, merge_ranks


def test_result_file_has_the_shared_schema(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--out-dir", str(tmp_path), "--iters", "5"])
    rows = [{"case": "allreduce/1MiB", "variant": "lsa_oneshot", "ms": 1.0, "baseline": "host_nccl",
             "baseline_ms": 1.5, "speedup": 1.5, "bound_ms": None, "overlap_eff": None,
             "correct": True}]
    path = results.write("x", rows, device="2 x NVIDIA H200", world_size=2, emulated=False,
                         commit="abc1234", out_dir=tmp_path,
                         extra={"runtime": {"rpc_launches_per_s": 1.0}})
    doc = json.loads(path.read_text())
    assert list(doc)[:8] == ["bench", "created", "command", "commit", "device", "world_size",
                             "emulated", "versions"]
    assert doc["commit"] == "abc1234" and doc["emulated"] is False
    assert doc["command"] == "python bench/x.py --iters 5"
    assert doc["versions"]["cuco"] and doc["versions"]["nccl"].startswith("2.")
    assert doc["rows"] == rows and doc["runtime"]["rpc_launches_per_s"] == 1.0


def test_the_commit_defaults_to_cuco_rev_then_git(tmp_path, monkeypatch):
    import subprocess
    monkeypatch.setenv("CUCO_REV", "feed123")
    assert results.current_commit(tmp_path) == "feed123"
    monkeypatch.delenv("CUCO_REV")
    assert results.current_commit(tmp_path) is None  # not a git checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert results.current_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("2")  # a tracked file differs from the commit
    assert results.current_commit(tmp_path) == head + "-dirty"


@pytest.mark.parametrize("kwargs, missing", [
    ({"commit": "", "device": "1 x NVIDIA H200", "world_size": 1, "emulated": False}, "commit:"),
    ({"commit": "unknown", "device": "1 x NVIDIA H200", "world_size": 1, "emulated": False},
     "provenance_note"),
    ({"commit": "abc1234", "device": "", "world_size": 1, "emulated": False}, "device:"),
    ({"commit": "abc1234", "device": "1 x NVIDIA H200", "world_size": 0, "emulated": False},
     "world_size:"),
    ({"commit": "abc1234", "device": "1 x NVIDIA H200", "world_size": 1, "emulated": None},
     "emulated:"),
])
def test_a_file_that_would_not_name_its_source_is_not_written(tmp_path, monkeypatch, kwargs, missing):
    monkeypatch.delenv("CUCO_REV", raising=False)
    monkeypatch.setattr(results, "SOURCE_TREE", tmp_path)  # no git checkout: an empty commit stays empty
    with pytest.raises(results.ResultsError, match=missing):
        results.write("x", [], out_dir=tmp_path, **kwargs)
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(results.ResultsError, match="pass it as commit="):
        results.write("y", [], device="d", world_size=1, emulated=False, commit="abc1234",
                      out_dir=tmp_path, extra={"commit": "other"})
    assert not (tmp_path / "y.json").exists()
    results.write("z", [], device="d", world_size=1, emulated=False, commit="unknown",
                  out_dir=tmp_path, extra={"provenance_note": "written by hand"})
    assert results.provenance_problems(results.load(tmp_path / "z.json")) == []


def test_sizes_and_bus_factors():
    assert parse_size("64KiB") == 65536 and parse_size("256MiB") == 256 << 20
    assert parse_size("4096") == 4096
    assert size_label(1 << 20) == "1MiB" and size_label(1000) == "1000B"
    with pytest.raises(ValueError, match="not like 64KiB"):
        parse_size("1 megabyte")
    assert bus_factor("allreduce", 2) == 1.0 and bus_factor("allgather", 4) == 3
    assert bus_factor("reducescatter", 8) == pytest.approx(7 / 8)


def test_merge_takes_max_time_and_worst_error():
    late = FailedCall(iteration=9, input_set=1, checked=False, bad_elements=3, rank=1)
    early = FailedCall(iteration=2, input_set=0, checked=True, bad_elements=1, rank=2)
    per_rank = [
        RankResult(0, {"v": ProgramRecord(median_ms=1.0, rel_l2_error=1e-3, floor_ms=0.5, calls_verified=30)}),
        RankResult(1, {"v": ProgramRecord(correct=False, bad_elements=3, rel_l2_error=0.5, median_ms=1.2,
                                          failed_call=late, floor_ms=0.4, calls_verified=30)}),
        RankResult(2, {"v": ProgramRecord(correct=False, bad_elements=1, median_ms=1.1, failed_call=early,
                                          guards_intact=False, floor_ms=0.6, calls_verified=29)}),
    ]
    m = merge_ranks(per_rank)["v"]
    assert m.ms == 1.2 and m.rank_ms == [1.0, 1.2, 1.1] and m.timed
    assert m.correct is False and m.bad_elements == 4 and m.rel_l2_error == 0.5
    assert m.failed_call == early  # the earliest failing call of any rank
    assert m.guards_intact is False and m.inputs_intact is True
    assert m.floor_ms == 0.4 and m.calls_verified == 29  # the most generous floor, the fewest calls
    assert "iteration 2 on input set 0, rank 2: 1 elements" in early.describe()


def test_a_program_only_timed_merges_without_a_verdict():
    per_rank = [RankResult(r, {"comm_only": ProgramRecord(verified=False, median_ms=0.4 + r)}) for r in range(2)]
    m = merge_ranks(per_rank)["comm_only"]
    assert m.ms == 1.4 and not m.verified
    assert m.verdict() == {"correct": None, "bad_elements": None, "rel_l2_error": None}
    untimed = merge_ranks([RankResult(0, {"v": ProgramRecord()})])["v"]
    assert untimed.ms is None and not untimed.timed and untimed.verdict()["correct"] is True


def test_best_marking_ignores_wrong_variants():
    rows = [{"case": "c", "variant": "lsa_x", "ms": 1.0, "correct": False},
            {"case": "c", "variant": "lsa_x", "ms": 2.0, "correct": True},
            {"case": "c", "variant": "lsa_x", "ms": 3.0, "correct": True},
            {"case": "c", "variant": "host_nccl", "ms": 0.5, "correct": True}]
    CollectivesBench._mark_best(rows)
    assert [r["best_ctas"] for r in rows] == [False, True, False, False]


def test_collective_case_validates_and_picks_variants():
    with pytest.raises(ValueError, match="op 'alltoall' is not one of"):
        CollectiveCase("alltoall", 1024)
    small = CollectiveCase("allreduce", 1 << 20)
    big = CollectiveCase("allreduce", 64 << 20)
    assert "lsa_staged" in small.variants and "lsa_staged" not in big.variants
    assert small.variants[0] == "host_nccl"


def test_a_case_without_torch_peers_rows_say_why():
    from cuco.benchmarks.tp_workloads import TPBench, case_keys
    from cuco.design import GemmProblem
    per_rank = [RankResult(r, {
        "host_nccl": ProgramRecord(median_ms=1.0 + r / 10,
                                   notes={"gemm": "cublaslt.heuristic2", "collective": "nccl_plain",
                                          "peers_skipped": {"torch_fused": "torch is not installed"}}),
        "host_nccl_default": ProgramRecord(median_ms=1.3),
        "compute_only": ProgramRecord(verified=False, median_ms=0.7),
        "comm_only": ProgramRecord(verified=False, median_ms=0.5),
        "lsa.x": ProgramRecord(median_ms=0.9)}) for r in range(2)]
    merged = merge_ranks(per_rank)
    keys = case_keys(merged)
    assert keys["strong_host_ms"] == 1.1 and keys["host_nccl_default_ms"] == 1.3
    assert keys["host_gemm"] == "cublaslt.heuristic2" and keys["host_collective"] == "nccl_plain"
    assert keys["torch_fused_ms"] is None and keys["torch_gemm_ms"] is None
    assert keys["torch_fused_why"] == "torch is not installed"
    p = GemmProblem(workload="gemm_reducescatter", m=1024, n=1024, k=1024, world_size=2)
    rows = TPBench._rows(p, merged)
    row = next(r for r in rows if r["variant"] == "lsa.x")
    assert row["baseline_ms"] == 1.1 and row["speedup"] == round(1.1 / 0.9, 4)
    assert row["peers"]["why"] == "torch is not installed" and row["peers"]["cuco_over_torch_fused"] is None
    summary = TPBench._summary(rows)[p.label]
    assert summary["variant"] == "lsa.x" and summary["strong_host_ms"] == 1.1
    assert summary["torch_fused_ms"] is None and summary["torch_fused_why"] == "torch is not installed"


def test_the_commit_is_cuco_checkouts_wherever_the_command_runs(tmp_path, monkeypatch):
    """From another repository (or none) a result still names cuco's own commit: git ran in
    the working directory and named the other repository's, or refused after the timing."""
    import subprocess
    monkeypatch.delenv("CUCO_REV", raising=False)
    subprocess.run(["git", "-C", str(tmp_path), "init", "-q"], check=True)
    monkeypatch.chdir(tmp_path)
    ours = subprocess.run(["git", "-C", str(results.SOURCE_TREE), "rev-parse", "--short=7", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if not ours:
        pytest.skip("this cuco is not a git checkout")
    assert results.current_commit().split("-")[0] == ours == results.require_commit().split("-")[0]
