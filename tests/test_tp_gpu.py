"""GPU tests (2 GPUs, or an emulated world of W ranks): every side-stream variant of a small grid is correct on fresh seeds."""

from __future__ import annotations

import pytest
from conftest import TEST_WORLD
from gpu_checks import rank_sms

from cuco.design import Directives, GemmProblem
from cuco.kernels import Compiler
from cuco.kernels.tp import render_tp

pytestmark = pytest.mark.gpu(count=2)

SHAPES = {
    "gemm_allreduce": [(512, 1024, 2048), (1024, 512, 1024)],
    "gemm_reducescatter": [(512, 1024, 2048), (1024, 512, 1024)],
    "allgather_gemm": [(512, 1024, 2048), (1024, 512, 1024)],
}


def grid(problem: GemmProblem) -> list[Directives]:
    """Both backends, every issuer, a 64 KiB chunk and a larger one: 256 KiB, or at most what a
    rank produces (AllGather's 128 KiB at W = 8)."""
    out = []
    large = 1 << (min(256 << 10, problem.output_bytes_per_rank()).bit_length() - 1)
    for backend in ("lsa", "nvshmem"):
        for issuer in ("thread", "warp", "cta"):
            for chunk in (64 << 10, large):
                out.append(Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                      issuer=issuer, chunk_bytes=chunk, comm_ctas=4))
    return out


@pytest.mark.parametrize("family,shape", [(f, s) for f, ss in SHAPES.items() for s in ss])
def test_side_stream_grid_is_correct(gpu_group, family, shape):
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.workloads import for_problem

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    comp = Compiler()
    points = grid(problem)
    sources = [render_tp(problem, d)[0] for d in points]
    built = comp.compile_many([(s.name, s.source, s.needs) for s in sources])
    specs = [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(points, built)]
    for seed in (3, 4):
        case = Case(for_problem(problem), variants=specs, seed=seed, time=False)
        res = gpu_group.run(case, timeout=100)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        assert set(merged) == {"host_nccl", "host_nccl_default", *(s.name for s in specs)}
        for name, rec in merged.items():
            assert rec.correct, f"{family} {shape} seed {seed} {name}: {rec}"


RAGGED = [("gemm_allreduce", (3000, 1536, 1536)), ("gemm_reducescatter", (3000, 1536, 1536)),
          ("allgather_gemm", (3000, 1536, 1536)),
          ("gemm_allreduce", (3001, 1544, 1536))]  # odd M, 193 units a row: uneven slices


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("family,shape", RAGGED, ids=[f"{f}-M{s[0]}N{s[1]}" for f, s in RAGGED])
def test_side_stream_is_correct_at_a_ragged_m(gpu_group, family, shape, dtype):
    """Issue #21: M=3000 (1500 rows per rank for ReduceScatter/AllGather), K=N=1536, and an
    odd M with rows of an odd number of 16-byte units: every element of every side-stream
    variant (ragged chunk plans: a short last chunk per block, AllReduce's uneven slices)
    against the fp32 reference, on fresh seeds; both backends, all issuers, chunk sizes
    whose plans are ragged and one of a single chunk per block."""
    from cuco.design.tiles import ChunkPlan
    from cuco.kernels.tp import render_side_stream
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case, VariantSpec
    from cuco.workloads import for_problem

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD, dtype=dtype)
    points = grid(problem) + [Directives(backend="lsa", placement="side_stream", sync_scope="chunk",
                                         issuer="cta", chunk_bytes=8 << 20, comm_ctas=8)]
    plans = [ChunkPlan.for_problem(problem, d) for d in points]
    assert all(p.ragged for p in plans) and any(p.last_rows != p.rows for p in plans)
    sources = [render_side_stream(problem, d)[0] for d in points]  # the design rules' tile
    built = Compiler().compile_many([(s.name, s.source, s.needs) for s in sources])  # shapes aside
    specs = [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(points, built)]
    for seed in (5, 6):
        res = gpu_group.run(Case(for_problem(problem), variants=specs, seed=seed, time=False), timeout=200)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        assert {s.name for s in specs} <= set(merged)
        for name, rec in merged.items():
            assert rec.correct, f"{family} {dtype} {shape} seed {seed} {name}: {rec}"


def test_a_communication_grid_too_wide_for_the_ranks_share_is_refused_before_any_gpu_work(gpu_group):
    """Its CTAs spin on their peers: W ranks' copies that cannot all be resident would hang
    (in an emulated world each rank has 1 / W of one GPU), so the evaluator refuses the point
    with the count that fits, and a point at that count runs."""
    from cuco.evaluate import Evaluator
    from cuco.workloads import GemmAllReduce

    from cuco.runtime.emulated import spinning_grid_limit

    fits = rank_sms(gpu_group)
    most = spinning_grid_limit(fits, gpu_group.emulated)
    if most >= 64:
        pytest.skip(f"each rank may spin {most} CTAs, more than the 64 comm_ctas may name")
    wl = GemmAllReduce(m=512, n=1024, k=2048, world_size=TEST_WORLD)
    ev = Evaluator(wl, group=gpu_group, timing_iters=8, peers=False)
    wide = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", comm_ctas=most + 1,
                      chunk_bytes=64 << 10)
    r = ev.evaluate(wide)
    assert (r.status, r.stage_reached) == ("invalid", "static"), r.error
    assert f"comm_ctas={most + 1}" in r.error and f"use comm_ctas={most} or fewer" in r.error
    assert ev.gpu_s == 0.0
    r = ev.evaluate(wide.model_copy(update={"comm_ctas": min(most, 32)}))
    assert r.status == "ok", r.error
