"""The tensor-parallel block trained with cuco's ops on 2 GPUs (the CPU half:
test_tp_block_cpu.py).

One checked kernel per fused GEMM of a small Llama-style block (hidden 1024, 8 heads of 128,
4 KV heads, FFN 2816, 1024 tokens) and of its backward, evaluated by cuco's evaluator and
exported; ``gpu_scripts/tp_block.py gpu`` registers them as torch ops and trains the block
2 steps with them and with plain TP (bf16), against plain TP in fp32: every element of the
output and of each weight's gradient, and the losses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import torchrun

from cuco import CandidateDB, Directives, make_problem
from cuco.evaluate import Evaluator
from cuco.export import export
from cuco.workloads import for_problem

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu_scripts" / "tp_block.py"
sys.path.insert(0, str(ROOT / "examples"))
import tp_block as B  # noqa: E402

#: side-stream kernels; chunks small enough for every GEMM of the small block
SIDE = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", comm_ctas=32,
                  chunk_bytes=512 << 10)
SMALL = dict(hidden=1024, ffn=2816, heads=8, kv_heads=4, tokens=1024)  # = the script's SMALL


def block_gemms() -> list[tuple[str, str]]:
    shapes = [B.BlockShape(**SMALL, world=2, out=out).check() for out in ("rs", "ar")]
    return list(dict.fromkeys(g for s in shapes for g in s.gemms()))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    pytest.importorskip("torch")
    from cuco.runtime import WorkerGroup
    root = tmp_path_factory.mktemp("tp_block")
    db = CandidateDB(root / "c.db")
    paths = []
    with WorkerGroup(2) as group:
        for pattern, shape in block_gemms():
            wl = for_problem(make_problem(pattern, shape, world_size=2))
            run = db.create_run("tp-block-gpu", wl.family, problem=wl.problem.model_dump())
            r = Evaluator(wl, group=group, db=db, run_id=run).evaluate(SIDE)
            assert r.status == "ok", (pattern, shape, r.error)
            cand = db.candidates(run_id=run)[-1].id
            paths.append(str(export(db, cand, root / f"{pattern}-{shape}").path))
    return paths


def test_the_small_block_has_twelve_fused_gemms():
    assert len(block_gemms()) == 12  # rs: 4 forward + 4 backward; ar: 2 + 2


@pytest.mark.gpu(count=2)
def test_block_trained_with_cuco_ops_matches_plain_tp(artifacts, tmp_path):
    out = tmp_path / "gpu.json"
    v = torchrun.verdict(SCRIPT, ["gpu", str(out), *artifacts], out, nproc=2, timeout=600,
                         env={"CUDA_MODULE_LOADING": "EAGER", "NCCL_NVLS_ENABLE": "0",
                              "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    print(json.dumps(v))
    assert v["registered"] == 12
    for out_mode in ("rs", "ar"):
        row = v[f"H1024F2816/T1024/{out_mode}/w2"]
        for name in ("plain", "cuco"):  # plain bf16 passing the same bar shows the bar is fair
            r = row[name]
            assert r["output_bad"] == 0, (out_mode, name, r)
            assert r["grad_bad"] == {k: 0 for k in B.WEIGHTS}, (out_mode, name, r)
            assert r["loss_rel_err"] <= B.LOSS_RTOL, (out_mode, name, r)
        assert row["fp32_losses"][1] < row["fp32_losses"][0]  # the step trained
