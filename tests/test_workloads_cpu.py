"""Workloads on the CPU side: shapes, tolerances, registry; arena layouts."""

from __future__ import annotations

import pytest

from cuco import ShapeError
from cuco.errors import InputError
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter, get
from cuco.kernels.tp import FLAG_STRIDE
from cuco.runtime.arena import ArenaLayout


def test_per_rank_shapes():
    ar = GemmAllReduce(8192, 8192, 8192, 2)
    assert ar.local_gemm() == (8192, 8192, 4096) and ar.output_shape() == (8192, 8192)
    rs = GemmReduceScatter(4096, 28672, 8192, 4)
    assert rs.local_gemm() == (4096, 28672, 2048) and rs.output_shape() == (1024, 28672)
    ag = AllGatherGemm(2048, 4096, 4096, 8)
    assert ag.local_gemm() == (2048, 512, 4096) and ag.output_shape() == (2048, 512)
    assert ar.flops_per_rank() == 2 * 8192 * 8192 * 4096


def test_shapes_that_do_not_divide_are_refused_with_the_fix():
    with pytest.raises(ShapeError, match="K=128 is split over 3 ranks.*choose K a multiple of 24"):
        GemmAllReduce(128, 128, 128, 3)
    with pytest.raises(ShapeError, match="N=100 is split over 8 ranks"):
        AllGatherGemm(64, 100, 64, 8)


def test_tolerance_grows_with_world_size_and_k_and_stays_tight():
    a = GemmAllReduce(1024, 1024, 1024, 2).tolerance()
    b = GemmAllReduce(1024, 1024, 65536, 8).tolerance()
    assert b[0] > a[0] and b[1] > a[1]
    # a dropped rank's contribution errs by ~rms(ref) ~ max|ref|/4: far above atol
    assert a[1] < 0.02 and b[1] < 0.05


def test_registry():
    assert get("gemm_reducescatter") is GemmReduceScatter
    assert get("moe").family == "moe"
    with pytest.raises(InputError, match="unknown workload .moee."):
        get("moee")


def test_arena_layout_is_page_aligned_and_disjoint():
    lay = ArenaLayout.for_workload(GemmAllReduce(8192, 8192, 8192, 2))
    region = 8192 * 8192 * 2
    assert lay.data["p"] == 0 and lay.guards[0] == region and lay.data["o"] == region + 4096
    assert lay.guards[1] == lay.data["o"] + region and lay.data["r"] == lay.guards[1] + 4096
    assert lay.guards[2] == lay.data["r"] + region and lay.flags == lay.guards[2] + 4096
    assert lay.bar - lay.flags >= 2 * 2 * FLAG_STRIDE * 8  # side-stream counters, then in-kernel epochs
    assert lay.bar > lay.flags
    assert all(v % 4096 == 0 for v in (*lay.data.values(), *lay.guards, lay.flags, lay.bar, lay.size))
    ag = ArenaLayout.for_workload(AllGatherGemm(2048, 4096, 4096, 2))
    assert set(ag.data) == {"xf"} and ag.sync_bytes == ag.size - ag.flags


def test_arena_lives_in_the_runtime_and_refuses_gin():
    """The runtime owns the arena; the TP layout needs only numbers, and GIN is refused
    before anything is allocated (its kernels are compile-checked only)."""
    from cuco.runtime.arena import Arena

    wl = GemmReduceScatter(4096, 2048, 1024, 2)
    assert ArenaLayout.for_workload(wl) == ArenaLayout.for_tp("gemm_reducescatter", 4096, 2048, 1024, 2, "bf16")
    with pytest.raises(RuntimeError, match="backend=gin kernels are rendered and compile-checked but not run"):
        Arena(None, "gin", 1 << 20)
