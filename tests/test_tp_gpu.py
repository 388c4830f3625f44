"""GPU tests (2 GPUs): every side-stream variant of a small grid is correct on fresh seeds."""

from __future__ import annotations

import pytest

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
    out = []
    for backend in ("lsa", "nvshmem"):
        for issuer in ("thread", "warp", "cta"):
            for chunk in (64 << 10, 256 << 10):
                out.append(Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                      issuer=issuer, chunk_bytes=chunk, comm_ctas=4))
    return out


@pytest.mark.parametrize("family,shape", [(f, s) for f, ss in SHAPES.items() for s in ss])
def test_side_stream_grid_is_correct(gpu_group, family, shape):
    from cuco.runtime.collective_ops import merge_ranks
    from cuco.workloads import Case, VariantSpec, for_problem

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=2)
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
            assert rec["correct"], f"{family} {shape} seed {seed} {name}: {rec}"
