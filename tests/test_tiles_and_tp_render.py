"""Chunk plans (the arithmetic kernels and launcher share) and TP rendering refusals."""

from __future__ import annotations

import pytest

from cuco import DirectiveError, Directives, GemmProblem
from cuco.design.tiles import ChunkPlan
from cuco.agents.api import gpu_space
from cuco.kernels.tp import render_tp


def side(**kw) -> Directives:
    return Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, **kw)


@pytest.mark.parametrize("w", [2, 4, 8])
def test_reducescatter_order_interleaves_owners_and_covers_all_rows(w):
    p = GemmProblem(workload="gemm_reducescatter", m=8192, n=8192, k=8192, world_size=w)
    plan = ChunkPlan.for_problem(p, side(chunk_bytes=4 << 20))
    assert plan.rows == 256 and plan.blocks == w
    order = plan.order()
    assert [c.block for c in order[:w]] == list(range(w))
    rows = sorted(c.row for c in order)
    assert rows == list(range(0, 8192, plan.rows))
    for j, block, row, rows in order:
        assert row // plan.block_rows == block == j % w and rows == plan.rows


@pytest.mark.parametrize("w", [2, 4, 8])
def test_allreduce_and_allgather_plans(w):
    ar = ChunkPlan.for_problem(GemmProblem(workload="gemm_allreduce", m=4096, n=28672, k=8192,
                                       world_size=w), side(chunk_bytes=16 << 20))
    assert ar.rows * ar.row_elems * 2 <= 16 << 20 and 4096 % ar.rows == 0
    assert ar.n_chunks * ar.rows == 4096 and (ar.chunk_elems * 2) % (16 * w) == 0
    ag = ChunkPlan.for_problem(GemmProblem(workload="allgather_gemm", m=2048, n=4096, k=4096,
                                       world_size=w), side(chunk_bytes=1 << 20))
    assert ag.row_elems == 4096 and ag.block_rows == 2048 // w
    assert [c.block for c in ag.order()] == sorted(c.block for c in ag.order())


def test_plans_that_cannot_exist_are_refused():
    p = GemmProblem(workload="gemm_allreduce", m=1000, n=1024, k=64, world_size=2)
    with pytest.raises(DirectiveError, match="chunk_bytes"):
        ChunkPlan.for_problem(p, side(chunk_bytes=8192))


def test_render_refuses_what_has_no_template():
    p = GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=1024, world_size=2)
    with pytest.raises(DirectiveError, match="one flag per output tile"):
        render_tp(p, Directives(placement="epilogue"))
    with pytest.raises(DirectiveError, match="not a tensor-parallel family"):
        render_tp(GemmProblem(workload="moe", m=8, n=8, k=8, world_size=2), side())
    src, _ = render_tp(p, side(issuer="warp", chunk_bytes=256 << 10))
    assert "EVOLVE-BLOCK-START chunk_allreduce" in src.source
    assert "const int kChunks = geom.chunks" in src.source  # the plan is a launch argument
    assert src.needs == ("nccl",)


@pytest.mark.parametrize("family", ["gemm_allreduce", "gemm_reducescatter", "allgather_gemm"])
def test_every_point_of_the_gpu_search_space_renders(family):
    p = GemmProblem(workload=family, m=2048, n=4096, k=4096, world_size=2)
    g = list(gpu_space(p).enumerate())
    assert {d.placement.value for d in g} == {"side_stream", "epilogue", "dedicated_ctas"}
    assert len({d.full_name for d in g}) == len(g)
    for d in g:
        render_tp(p, d)  # raises if the search could propose a point with no kernel
    assert {d.comm_warps for d in g if d.placement.value != "side_stream"} == {0, 3}
    assert {(d.raster_group, d.comm_warps) for d in g if d.placement.value == "side_stream"} == {(1, 0)}
    only = gpu_space(p, ("side_stream",))
    assert only.size == sum(d.placement.value == "side_stream" for d in g)


def test_a_workload_with_a_python_chunk_epilogue_searches_side_stream_only():
    from cuco.workloads import GemmAllReduce, register
    from cuco.workloads.base import REGISTRY

    class Scaled(GemmAllReduce):
        family = "scaled_allreduce_space_test"
        pattern = "gemm_allreduce"

        def chunk_epilogue(self, ctx, inputs, ptr, row0, rows, stream):
            pass

    register(Scaled)
    try:
        p = GemmProblem(workload="gemm_allreduce", m=2048, n=4096, k=4096, world_size=2)
        assert {d.placement.value for d in gpu_space(p.model_copy(update={"workload": Scaled.family})).enumerate()} \
            == {"side_stream"}
    finally:
        REGISTRY.pop(Scaled.family)


def test_chunk_sizes_are_powers_of_two_cutting_the_output():
    from cuco.design.tiles import chunk_sizes
    p = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)  # 128 MiB/rank
    assert chunk_sizes(p, (4, 8, 16)) == [32 << 20, 16 << 20, 8 << 20]
    small = GemmProblem(workload="allgather_gemm", m=64, n=128, k=64, world_size=2)  # 8 KiB/rank
    assert chunk_sizes(small, (2, 4, 8, 16, 32), floor_log2=15) == [32 << 10]


@pytest.mark.parametrize("family", ["gemm_allreduce", "gemm_reducescatter", "allgather_gemm"])
def test_gin_renders_put_only_kernels_for_ranks_on_different_hosts(family):
    from cuco.evaluate.static import static_violations
    from cuco.kernels import evolve
    one_host = GemmProblem(workload=family, m=1024, n=1024, k=1024, world_size=2)
    with pytest.raises(DirectiveError, match="gin needs ranks on different hosts"):
        render_tp(one_host, side(backend="gin"))
    p = one_host.model_copy(update={"has_network": True})
    for issuer in ("thread", "warp", "cta"):
        src, _ = render_tp(p, side(backend="gin", issuer=issuer))
        assert src.needs == ("nccl",) and "gin.put(" in src.source
        assert "ncclGetLsaPointer" not in src.source  # nothing crosses ranks but GIN puts
        assert evolve.blocks(src.source) and static_violations(src.source) == []
        assert evolve.edit_violations(src.source, src.source) == []
