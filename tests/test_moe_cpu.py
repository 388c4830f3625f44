"""The device-side MoE layer on the CPU: its templates build with nvcc for sm_90a, the grouped
GEMM library's host side fills the strides the kernel reads, and bad shapes are refused
with the fix. (The routing layout is checked in test_pipelines_cpu.py.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuco.design import Directives
from cuco.errors import DirectiveError, ShapeError
from cuco.kernels import Compiler
from cuco.workloads.moe import MoE, MoERunner
from cuco.workloads.moe.grouped_gemm import DECODE_CONFIG, SHAPE_BYTES, config_source


def side(**kw) -> Directives:
    base = dict(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                chunk_bytes=1 << 20, comm_ctas=4)
    return Directives(**{**base, **kw})


@pytest.mark.slow
def test_grouped_gemm_builds_and_its_host_side_fills_strides(compiler_cache):
    """One CUTLASS build (about 1.5 min on 2 cores), in the cache test_kernels builds the
    catalog into (the same source: built once a session). The host functions touch no GPU:
    the sizes its tables use, and packed K-major strides."""
    s = config_source(DECODE_CONFIG)  # the catalog's first MoE build: test_kernels' representative
    built = Compiler(arch="sm_90a", cache_dir=compiler_cache).compile(s.source, needs=s.needs, name=s.name)
    assert built.launcher and b"grouped_gemm_kernel" in built.path.read_bytes()
    lib = ctypes.CDLL(str(built.path))
    sizes = (ctypes.c_int * 5)()
    lib.cuco_gg_sizes(sizes)
    assert sizes[0] == SHAPE_BYTES and sizes[1] == sizes[2] == sizes[3] == 8
    assert 100 << 10 < sizes[4] <= 227 << 10  # the mainloop's stages fill shared memory
    groups, n, k = 3, 384, 640
    host = [np.zeros(groups, dtype=np.int64) for _ in range(3)]
    lib.cuco_gg_strides(groups, n, k, *(ctypes.c_void_p(h.ctypes.data) for h in host))
    assert list(host[0]) == [k] * 3 and list(host[1]) == [k] * 3 and list(host[2]) == [n] * 3


def test_moe_template_builds_every_kernel_the_runner_launches():
    wl = MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2, routing="empty_experts")
    src = wl.render(side(issuer="cta", chunk_bytes=16 << 10))
    assert "kGroups = 4;" in src.source and "kRouteWarps = 32;" in src.source
    built = Compiler(arch="sm_90a").compile(src.source, needs=src.needs, name=src.name)
    image = built.path.read_bytes()
    for name in MoERunner.KERNELS:
        assert name.encode() in image, name


def test_moe_plan_follows_chunk_bytes():
    wl = MoE(2, tokens=128, experts=256, topk=8)
    # flag_slots: a counter per group and source rank, then counts, done and finished a rank
    assert wl.plan(side(chunk_bytes=1 << 28)) == {"groups": 1, "flag_slots": 1 * 8 + 3 * 8}
    assert wl.plan(side(chunk_bytes=1 << 20)) == {"groups": 8, "flag_slots": 8 * 8 + 3 * 8}   # 14.7 MB of rows / 1 MiB
    assert wl.route_warps() == 32 and MoE(2, experts=8192, topk=8).route_warps() == 1
    with pytest.raises(DirectiveError, match="side_stream"):
        wl.render(Directives(backend="lsa", placement="epilogue", comm_ctas=0))


@pytest.mark.parametrize("kw,fix", [
    (dict(experts=16384, topk=8), "experts=8192"),
    (dict(hidden=7170), "multiples of 8"),
    (dict(ffn=100), "multiples of 8"),
    (dict(experts=8, topk=9), "topk=9"),
])
def test_bad_moe_shapes_are_refused_with_the_fix(kw, fix):
    with pytest.raises(ShapeError, match=fix):
        MoE(2, **kw)


def test_benchmark_rows_measure_against_the_faster_correct_host_program():
    from cuco.benchmarks.pipelines import PipelineBench
    from cuco.runtime.records import ProgramResult
    wl = MoE(2, tokens=128)

    def rec(ms, correct=True):
        return ProgramResult(verified=True, correct=correct, ms=ms, rank_ms=[ms, ms])
    merged = {"host_nccl": rec(4.0), "host_cutlass": rec(3.2), "host_per_expert": rec(5.4),
              "compute_only": rec(2.1), "comm_only": rec(0.1), "lsa.x": rec(2.0)}
    rows = {r["variant"]: r for r in PipelineBench.rows(wl, merged)}
    assert rows["lsa.x"]["baseline"] == "host_cutlass" and rows["lsa.x"]["speedup"] == 1.6
    merged["host_cutlass"] = rec(3.2, correct=False)  # a wrong program is no baseline
    rows = {r["variant"]: r for r in PipelineBench.rows(wl, merged)}
    assert rows["lsa.x"]["baseline"] == "host_nccl" and rows["lsa.x"]["speedup"] == 2.0


def test_the_layer_builds_the_fastest_measured_configuration_of_its_row_regime():
    """The per-regime pick against the measured files (1 x H200, moe_compute.json; 1 x H100,
    moe_compute_h100_b77b06f.json): on every row the configuration the layer would build at
    that row count is the fastest correct one there, or within 1 % of it (H200's Qwen3-30B
    prefill: pingpong 128x128 1.5144 ms, the pick 1.5147), and the fused and host programs of
    a decode and a prefill layer take it."""
    import json
    from pathlib import Path
    from cuco.workloads.moe import MoE
    from cuco.workloads.moe.grouped_gemm import CONFIGS, DECODE_CONFIG, PREFILL_CONFIG, default_config
    for name in ("moe_compute", "moe_compute_h100_b77b06f"):
        data = json.loads((Path(__file__).parents[1] / "bench" / "results" / f"{name}.json").read_text())
        assert data["rows"] and set(data["rows"][0]["configs"]) == set(CONFIGS)
        for row in data["rows"]:
            ms = {c: v["ms"] for c, v in row["configs"].items() if v.get("correct", True)}
            pick = default_config(row["rows"]["mean"])
            assert ms[pick] <= 1.01 * min(ms.values()), (name, row["case"], pick, ms)
    decode = MoE(8, tokens=16, hidden=7168, ffn=2048, experts=256, topk=8)
    prefill = MoE(8, tokens=4096, hidden=7168, ffn=2048, experts=256, topk=8)
    assert decode.rows_per_expert == 4 and decode.grouped_gemm_config == DECODE_CONFIG
    assert prefill.rows_per_expert == 1024 and prefill.grouped_gemm_config == PREFILL_CONFIG
