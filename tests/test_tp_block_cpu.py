"""The tensor-parallel block of ``examples/tp_block.py`` and cuco's backward duals, on the CPU.

Two gloo ranks under torchrun (``gpu_scripts/tp_block.py cpu``): the plain-TP block against
the unsharded block, and each dual against autograd of the whole GEMM (real values, fp32).
The GEMM shapes the cuco block tunes, and its refusals, need no torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchrun

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu_scripts" / "tp_block.py"
sys.path.insert(0, str(ROOT / "examples"))
import tp_block as B  # noqa: E402

from cuco.errors import InputError, ShapeError  # noqa: E402


def test_the_block_tunes_its_forward_and_backward_gemms():
    s = B.block_shape("llama3-8b", 2048, 2, "rs")
    assert s.qkv_cols == 6144 and s.q_cols == 4096
    assert s.gemms(backward=False) == [
        ("allgather_gemm", "2048x4096x6144"), ("gemm_reducescatter", "2048x4096x4096"),
        ("allgather_gemm", "2048x4096x28672"), ("gemm_reducescatter", "2048x14336x4096")]
    # each backward dual swaps K and N: AllGather's is a ReduceScatter and back
    assert s.gemms()[4:] == [
        ("gemm_reducescatter", "2048x6144x4096"), ("allgather_gemm", "2048x4096x4096"),
        ("gemm_reducescatter", "2048x28672x4096"), ("allgather_gemm", "2048x4096x14336")]
    ar = B.block_shape("llama3-70b", 4096, 2, "ar")
    assert ar.gemms() == [("gemm_allreduce", "4096x8192x8192"), ("gemm_allreduce", "4096x28672x8192"),
                          ("gemm_allreduce", "4096x10240x8192"), ("gemm_allreduce", "4096x57344x8192")]
    decode = B.block_shape("llama3-8b", 128, 2, "rs", decode=1024)
    assert decode.seq == 1 and len(decode.gemms(backward=False)) == 4


@pytest.mark.parametrize("kw, match", [
    (dict(model="llama3-8b", tokens=2048, world=3), r"heads=32 does not split over 3 ranks"),
    (dict(model="llama3-8b", tokens=1025, world=2), r"tokens=1025 do not split over 2 ranks"),
    (dict(model="llama3-8b", tokens=6144, world=2), r"multiple of 4096"),
    (dict(model="llama3-8b", tokens=2048, world=2, out="xx"), r"'rs' \(ReduceScatter"),
    (dict(model="llama-7b", tokens=2048, world=2), r"choose one of llama3-8b, llama3-70b"),
])
def test_shapes_the_block_cannot_split_are_refused_with_the_fix(kw, match):
    with pytest.raises(ShapeError, match=match) as info:
        B.block_shape(**kw)
    assert isinstance(info.value, InputError)


def test_sharded_block_and_backward_duals_match_the_whole_on_two_gloo_ranks(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.json"
    v = torchrun.verdict(SCRIPT, ["cpu", str(out)], out, nproc=2, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert v["world"] == 2
    assert set(v["duals"]) == {"all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
                               "column_parallel_matmul"}
    for name, d in v["duals"].items():
        assert d["dA"] < 1e-5 and d["dB"] < 1e-5, (name, d)
        assert d["dA_shape_ok"] and d["need_only_dA"], (name, d)
    blocks = {k: b for k, b in v.items() if k.startswith("H64")}
    assert len(blocks) == 4  # rs and ar, training and decode
    for label, b in blocks.items():
        assert b["loss_rel_err"] < 1e-5 and b["output_rel_err"] < 1e-5, (label, b)
        if "decode" not in label:
            assert set(b["grad_rel_err"]) == set(B.WEIGHTS)
            assert max(b["grad_rel_err"].values()) < 1e-5, (label, b)


def test_bench_lists_its_sizes_and_without_two_gpus_says_so_and_exits_2():
    bench = [sys.executable, str(ROOT / "bench" / "tp_block.py")]
    r = subprocess.run(bench + ["--list", "--models", "llama3-8b", "--tokens", "1024"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("H4096F14336/T1024/rs/w2: allgather_gemm 1024x4096x6144")
    assert lines[1].startswith("H4096F14336/decode128x1024/rs/w2") and len(lines) == 2
    r = subprocess.run(bench + ["--tokens", "6144"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "multiple of 4096" in r.stderr and "Traceback" not in r.stderr
    from cuco.runtime import visible_gpus
    if visible_gpus() < 2:
        r = subprocess.run(bench, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "needs 2 GPUs" in r.stderr, r.stderr
