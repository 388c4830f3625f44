"""Workloads on the CPU side: shapes, tolerances, registry; arena layouts."""

from __future__ import annotations

import pytest

from cuco import ShapeError
from cuco.errors import InputError
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter, get
from cuco.kernels.tp import FLAG_STRIDE
from cuco.runtime.arena import ArenaLayout


def test_per_rank_shapes():
    ar = GemmAllReduce(m=8192, n=8192, k=8192, world_size=2)
    assert ar.local_gemm() == (8192, 8192, 4096) and ar.output_shape() == (8192, 8192)
    rs = GemmReduceScatter(m=4096, n=28672, k=8192, world_size=4)
    assert rs.local_gemm() == (4096, 28672, 2048) and rs.output_shape() == (1024, 28672)
    ag = AllGatherGemm(m=2048, n=4096, k=4096, world_size=8)
    assert ag.local_gemm() == (2048, 512, 4096) and ag.output_shape() == (2048, 512)
    assert ar.flops_per_rank() == 2 * 8192 * 8192 * 4096


def test_shapes_that_do_not_divide_are_refused_with_the_fix():
    with pytest.raises(ShapeError, match="K=128 is split over 3 ranks.*choose K a multiple of 24"):
        GemmAllReduce(m=128, n=128, k=128, world_size=3)
    with pytest.raises(ShapeError, match="N=100 is split over 8 ranks"):
        AllGatherGemm(m=64, n=100, k=64, world_size=8)


def test_tolerance_grows_with_world_size_and_k_and_stays_tight():
    a = GemmAllReduce(m=1024, n=1024, k=1024, world_size=2).tolerance()
    b = GemmAllReduce(m=1024, n=1024, k=65536, world_size=8).tolerance()
    assert b[0] > a[0] and b[1] > a[1]
    # a dropped rank's contribution errs by ~rms(ref) ~ max|ref|/4: far above atol
    assert a[1] < 0.02 and b[1] < 0.05


def test_registry():
    assert get("gemm_reducescatter") is GemmReduceScatter
    assert get("moe").family == "moe"
    with pytest.raises(InputError, match="unknown workload .moee."):
        get("moee")


def test_arena_layout_is_page_aligned_and_disjoint():
    lay = GemmAllReduce(m=8192, n=8192, k=8192, world_size=2).layout()
    region = 8192 * 8192 * 2
    assert lay.data["p"] == 0 and lay.guards[0] == region and lay.data["o"] == region + 4096
    assert lay.guards[1] == lay.data["o"] + region and lay.data["r"] == lay.guards[1] + 4096
    assert lay.guards[2] == lay.data["r"] + region and lay.flags == lay.guards[2] + 4096
    assert lay.bar - lay.flags >= 2 * 2 * FLAG_STRIDE * 8  # side-stream counters, then in-kernel epochs
    assert lay.bar > lay.flags
    assert all(v % 4096 == 0 for v in (*lay.data.values(), *lay.guards, lay.flags, lay.bar, lay.size))
    ag = AllGatherGemm(m=2048, n=4096, k=4096, world_size=2).layout()
    assert set(ag.data) == {"xf"} and ag.sync_bytes == ag.size - ag.flags


def test_arena_lives_in_the_runtime_and_refuses_gin():
    """The runtime owns the arena; the TP layout needs only numbers (the pattern's regions,
    the templates' flag slots), and GIN outside an emulated world is refused before anything
    is allocated (NCCL's GIN cannot run on the machines cuco meets)."""
    from cuco.runtime.worker import WorkerContext, WorkerOptions
    from cuco.design.patterns import GEMM_REDUCESCATTER
    from cuco.runtime.arena import Arena

    wl = GemmReduceScatter(m=4096, n=2048, k=1024, world_size=2)
    regions = {"p": 4096 * 2048 * 2, "r": 4096 * 2048 * 2}
    assert GEMM_REDUCESCATTER.arena_regions(m=4096, n=2048, k=1024, dtype_bytes=2) == regions
    assert wl.layout() == ArenaLayout.for_tp(regions, 2, FLAG_STRIDE)
    ctx = WorkerContext(rank=0, world_size=2, device=0, options=WorkerOptions(emulated=False))
    with pytest.raises(RuntimeError, match="backend=gin runs here only in an emulated world"):
        Arena(ctx, "gin", 1 << 20)


def test_gemm_workloads_take_keywords_only_and_say_so():
    """Shape strings read M x K x N and the constructors took (m, n, k): the same four numbers
    meant two problems. Positional numbers are refused with the keywords to use."""
    with pytest.raises(TypeError, match=r"GemmAllReduce\(m=M, n=N, k=K, world_size=W\)"):
        GemmAllReduce(1024, 1024, 2048, 2)
    wl = GemmAllReduce(m=1024, n=1024, k=2048, world_size=2)
    from cuco import make_problem
    assert wl.problem == make_problem("gemm_allreduce", "1024x2048x1024", world_size=2)
