"""bench/tp_shapes.py on the CPU: its shape spread, its --list of cases and grids, and its
summary's verdict on where cuco's best variant loses."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "tp_shapes.py"


def load():
    spec = importlib.util.spec_from_file_location("tp_shapes_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_spread_covers_what_issue_21_asks():
    shapes = load().SHAPES
    assert len(set(shapes)) == len(shapes) >= 24
    ms = [m for m, _, _ in shapes]
    assert min(ms) == 128 and max(ms) == 16384
    assert {1000, 3000, 5000} <= set(ms) and sum(m % 128 != 0 for m in ms) >= 6
    assert sum(m <= 1024 for m in ms) >= 6  # decode-like
    kn = [v for _, k, n in shapes for v in (k, n)]
    assert min(kn) == 1536 and max(kn) == 28672 and all(v % 8 == 0 for v in kn)


def test_list_prints_every_case_and_its_grid_without_a_gpu():
    r = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == f"{3 * len(load().SHAPES)} cases"
    cases = lines[:-1]
    for family in ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm"):
        assert sum(line.startswith(family + "/") for line in cases) >= 24
    ragged = [line for line in cases if " ragged " in line]
    assert any("M3000K8192N8192" in line for line in ragged)
    # a short last row tile runs in-kernel too
    assert not any(line.endswith("in-kernel 0)") for line in ragged)
    assert all(" grid " in line for line in cases)
    whole = [line for line in cases if " ragged " not in line]
    assert all("in-kernel 0)" not in line for line in whole if "M8192K8192N8192" in line)


def test_summary_names_where_the_best_variant_loses():
    def row(case, variant, ms, host, fused):
        return {"case": case, "variant": variant, "ms": ms, "baseline_ms": host, "bound_ms": 0.5,
                "speedup": round(host / ms, 4), "overlap_eff": 0.5 / ms, "correct": True,
                "suspect": False, "gemm_ms": 0.4,
                "peers": {"cuco_over_torch_fused": round(fused / ms, 4) if fused else None}}
    rows = [row("a", "lsa.side_stream.x", 1.0, 1.2, 0.9), row("a", "lsa.side_stream.y", 1.1, 1.2, 0.9),
            row("b", "lsa.epilogue.z", 1.0, 0.8, None), row("c", "nvshmem.side_stream.w", 1.0, 1.5, 1.6)]
    summary = load().ShapeSpread._summary(rows)
    assert summary["a"]["variant"] == "lsa.side_stream.x" and summary["a"]["loses_to"] == ["torch_fused"]
    assert summary["b"]["loses_to"] == ["host_nccl"] and summary["c"]["loses_to"] == []


def test_a_bench_script_refuses_a_bad_shape_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "tp_workloads.py"), "--shapes", "3000x8192x8191"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2 and "Traceback" not in out and len(out.splitlines()) == 1, out
    assert "N=8191" in out and "multiple of 8" in out and "n=8192" in out


def test_resume_keeps_finished_cases_reruns_failed_ones_and_refuses_another_world(tmp_path):
    """A device session's time limit cuts a long spread short; --resume goes on from the file."""
    import pytest

    from cuco import results
    from cuco.benchmarks.tp_workloads import TPBench
    from cuco.errors import CucoError

    shapes = ((2048, 4096, 4096), (1000, 1536, 8960))
    bench = TPBench(shapes=shapes, families=("gemm_allreduce", "allgather_gemm"), out_dir=tmp_path,
                    name="spread", resume=True)
    labels = [p.label for p in bench.problems()]
    assert len(labels) == 4
    assert bench.finished() == ([], None)  # nothing on disk yet
    rows = [{"case": labels[0], "variant": "host_nccl", "ms": 1.0},
            {"case": labels[1], "variant": "*", "status": "timeout", "correct": False}]
    results.write("spread", rows, device="2 x NVIDIA H200", world_size=2, emulated=False,
                  commit="abc1234", out_dir=tmp_path)
    kept, device = bench.finished()
    assert kept == rows[:1] and device == "2 x NVIDIA H200"
    bench.done = frozenset(r["case"] for r in kept)
    assert [p.label for p in bench.problems()] == labels[1:]  # the failed case runs again
    assert TPBench(shapes=shapes, out_dir=tmp_path, name="spread").finished() == ([], None)  # no --resume
    with pytest.raises(CucoError, match="world size 2, not 4"):
        TPBench(world_size=4, shapes=shapes, out_dir=tmp_path, name="spread", resume=True).finished()
