"""Result files and the collectives benchmark's CPU-side helpers."""

from __future__ import annotations

import json
import sys

import pytest

from cuco import results
from cuco.benchmarks.collectives import CollectivesBench, bus_factor, parse_size, size_label
from cuco.runtime.collective_ops import CollectiveCase, merge_ranks


def test_result_file_has_the_shared_schema(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--out-dir", str(tmp_path), "--iters", "5"])
    rows = [{"case": "allreduce/1MiB", "variant": "lsa_oneshot", "ms": 1.0, "baseline": "host_nccl",
             "baseline_ms": 1.5, "speedup": 1.5, "bound_ms": None, "overlap_eff": None,
             "correct": True}]
    path = results.write("x", rows, device="2 x NVIDIA H200", world_size=2, out_dir=tmp_path,
                         extra={"runtime": {"rpc_launches_per_s": 1.0}})
    doc = json.loads(path.read_text())
    assert list(doc)[:6] == ["bench", "created", "command", "device", "world_size", "versions"]
    assert doc["command"] == "python bench/x.py --iters 5"
    assert doc["versions"]["cuco"] and doc["versions"]["nccl"].startswith("2.")
    assert doc["rows"] == rows and doc["runtime"]["rpc_launches_per_s"] == 1.0


def test_sizes_and_bus_factors():
    assert parse_size("64KiB") == 65536 and parse_size("256MiB") == 256 << 20
    assert parse_size("4096") == 4096
    assert size_label(1 << 20) == "1MiB" and size_label(1000) == "1000B"
    with pytest.raises(ValueError, match="not like 64KiB"):
        parse_size("1 megabyte")
    assert bus_factor("allreduce", 2) == 1.0 and bus_factor("allgather", 4) == 3
    assert bus_factor("reducescatter", 8) == pytest.approx(7 / 8)


def test_merge_takes_max_time_and_worst_error():
    per_rank = [
        {"variants": {"v": {"median_ms": 1.0, "correct": True, "bad_elements": 0, "rel_l2_error": 1e-3}}},
        {"variants": {"v": {"median_ms": 1.2, "correct": False, "bad_elements": 3, "rel_l2_error": 0.5}}},
    ]
    m = merge_ranks(per_rank)["v"]
    assert m["ms"] == 1.2 and m["rank_ms"] == [1.0, 1.2]
    assert m["correct"] is False and m["bad_elements"] == 3 and m["rel_l2_error"] == 0.5


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


def test_torch_peers_say_why_they_are_missing_and_land_in_rows():
    import importlib.util

    from cuco.benchmarks.torch_peers import peer_times
    from cuco.benchmarks.tp_workloads import TPBench
    assert "no fused op" in peer_times("gemm_allreduce", 1024, 1024, 1024)["why"]
    bench = TPBench(shapes=((1024, 1024, 1024),), families=("gemm_allreduce",))
    rows = [{"case": "gemm_allreduce/M1024K1024N1024/bf16", "variant": "lsa.x", "ms": 0.5,
             "baseline_ms": 0.6, "bound_ms": 0.4, "speedup": 1.2, "overlap_eff": 0.8, "correct": True}]
    bench._add_peers(rows)
    assert rows[0]["peers"]["torch_fused_ms"] is None and rows[0]["peers"]["cuco_over_torch_fused"] is None
    assert bench._summary(rows)[rows[0]["case"]]["torch_fused_ms"] is None
    if importlib.util.find_spec("torch") is None:
        assert "torch is not installed" in peer_times("allgather_gemm", 1024, 1024, 1024)["why"]
