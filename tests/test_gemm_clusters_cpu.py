"""Issue #37's 2x1 clusters on the CPU: the ``cluster_m`` directive and its refusals, what a
cluster build renders (ClusterShape, the cluster launch, slots and phantoms) and what it leaves
as it was, the space sweeping the cluster mainloops, and the kernel's own slot order compiled
for the host and run for every slot; the nvcc builds, in both build paths, are marked slow."""

from __future__ import annotations

import pytest

from cuco import DirectiveError, Directives, GemmProblem
from cuco.benchmarks import gemm_alone as ga
from cuco.kernels import catalog
from cuco.kernels.tp import CLUSTER_MAINLOOPS, MAINLOOPS, Mainloop, in_kernel, render_tp, with_mainloop
from build_checks import PRINT_TILES, assert_points_compile, host_rows


def test_cluster_m_is_an_in_kernel_directive_with_named_refusals():
    d = in_kernel("epilogue", tile_n=128, stages=6, schedule="pingpong", cluster_m=2)
    assert d.cluster_m == 2 and d.full_name.endswith(".pp.cl2.direct")
    old = d.model_dump()
    old.pop("cluster_m")  # a point stored before clusters existed reads back without one
    assert Directives(**old).cluster_m == 1 and ".cl" not in Directives(**old).full_name
    with pytest.raises(DirectiveError, match=r"cluster_m=4 is not supported; choose one of \(1, 2\)"):
        in_kernel("epilogue", cluster_m=4)
    with pytest.raises(DirectiveError, match="cluster_m: placement=side_stream runs a vendor GEMM per chunk; "
                                             "cluster_m=2 pairs .* set cluster_m=1"):
        Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, cluster_m=2)
    with pytest.raises(DirectiveError, match="cluster_m: cluster_m=2 pairs whole tiles in lock-step and "
                                             "split_k=2 cuts tiles into slices; set cluster_m=1 or split_k=1"):
        in_kernel("epilogue", tile_n=128, stages=6, schedule="pingpong", split_k=2, cluster_m=2)
    with pytest.raises(DirectiveError, match=r"comm_ctas: with cluster_m=2 .* set comm_ctas to a multiple "
                                             r"of 2 \(e.g. 4\)"):
        in_kernel("dedicated_ctas", comm_ctas=3, cluster_m=2)
    assert in_kernel("dedicated_ctas", comm_ctas=4, cluster_m=2).cluster_m == 2


def test_a_cluster_build_renders_its_pieces_and_a_build_without_is_unchanged():
    p = ga.problem_of(1000, 5120, 5120)
    plain = in_kernel("epilogue", "nvshmem", "cta", tile_n=128, stages=6, schedule="pingpong", comm_warps=3)
    base = render_tp(p, plain, gemm_only=True)[0].source
    pair = render_tp(p, plain.replace(cluster_m=2), gemm_only=True)[0].source
    for piece in ("using ClusterShape = Shape<_2, _1, _1>;", "cute::cluster_wait();", "cluster_slots(",
                  "i < p.dims.slots", "tile_of(p.dims.pairs, i,", "cute::block_rank_in_cluster()",
                  "mt = min(mt, p.dims.block_mt - 1);", "if (mt < p.dims.block_mt)",
                  "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", "cuco_cubin::cluster_grid(",
                  "cuOccupancyMaxActiveClusters"):
        assert piece in pair and piece not in base, piece
    assert "using ClusterShape = Shape<_1, _1, _1>;" in base and "__syncthreads();\n" in base


def test_the_space_sweeps_the_cluster_mainloops():
    from cuco.workloads import for_problem
    problem = GemmProblem(workload="gemm_reducescatter", m=4096, k=4096, n=4096, world_size=2)
    space = for_problem(problem).space(["epilogue", "dedicated_ctas"])
    seen = {Mainloop.of(d) for d in space.enumerate()}
    assert set(CLUSTER_MAINLOOPS) <= seen and set(CLUSTER_MAINLOOPS) <= set(MAINLOOPS)
    assert all(d.comm_ctas % 2 == 0 for d in space.enumerate() if d.cluster_m == 2)


def test_the_default_never_picks_an_unmeasured_cluster():
    from cuco.kernels.tp import default_mainloop
    for shape in ga.default_shapes():
        assert default_mainloop(ga.problem_of(*shape)).mainloop.cluster_m == 1


def test_the_benchmark_times_the_cluster_mainloops():
    points = {Mainloop.of(d) for d in ga.mainloop_points((8192, 8192, 4096))}
    assert set(CLUSTER_MAINLOOPS) <= points
    # one m-tile: nothing for a cluster's second CTA to share B with (a swapped mainloop's
    # clusters pair n-tiles: test_gemm_swap_cpu.py)
    assert not any(d.cluster_m > 1 and not d.swap_ab for d in ga.mainloop_points((64, 8192, 8192)))


HARNESS = """
#include <cstdio>
constexpr int kW = {{ w }};
constexpr int kClusterM = 2;
{% include "_clusters.cu.j2" %}
{% include "_raster.cu.j2" %}
int main() {
  const Slots s = cluster_slots({{ bmt }}, {{ nt }}, {{ group }});
""" + PRINT_TILES


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["gemm_reducescatter", "allgather_gemm"])
@pytest.mark.parametrize("w,bmt,nt,group", [(2, 16, 11, 8), (2, 5, 3, 1), (4, 3, 7, 16), (1, 17, 16, 4),
                                            (8, 1, 5, 8)])
def test_cluster_slots_pair_adjacent_m_tiles_and_cover_each_tile_once(tmp_path, workload, w, bmt, nt, group):
    """The kernel's own cluster_slots and tile_of, compiled by nvcc for the host: slots 2q and
    2q+1 (what a cluster's two CTAs take together) are m-tiles 2p and 2p+1 of one n-tile of
    one block; every real tile comes once; a phantom only past an odd block's last m-tile;
    blocks in the pattern's order."""
    rows = host_rows(tmp_path, HARNESS, "slots", w=w, bmt=bmt, nt=nt, workload=workload, group=group)
    padded = bmt + bmt % 2
    for me in range(w):
        mine = [r[2:] for r in rows if r[0] == me]
        assert len(mine) == w * padded * nt
        real = [(b, m, n) for b, m, n in mine if m < bmt]
        assert sorted(real) == sorted((b, m, n) for b in range(w) for m in range(bmt) for n in range(nt))
        assert all(m == bmt and bmt % 2 for b, m, n in mine if m >= bmt)
        for q in range(0, len(mine), 2):
            (b0, m0, n0), (b1, m1, n1) = mine[q], mine[q + 1]
            assert (b0, n0) == (b1, n1) and m0 % 2 == 0 and m1 == m0 + 1
            step = q // (padded * nt)
            assert b0 == ((me + step) % w if workload == "allgather_gemm" else (me + 1 + step) % w)


def cluster_points():
    """Every cluster mainloop alone (gemm_only), and the catalog's fused cluster points: each
    with an epilogue path (consumers, comm warps, dedicated CTAs), all three patterns (the
    catalog's own points, so that CI's ``cuco kernels check`` finds them built)."""
    out = [(f"gemm_only {ml.text()}", ga.problem_of(1000, 5120, 5120), with_mainloop(ga.BASE, ml), True)
           for ml in CLUSTER_MAINLOOPS]
    return out + [(label, p, d, False) for label, p, d in catalog.cluster_points()]


@pytest.mark.slow
@pytest.mark.parametrize("whole_program", [False, True], ids=["separate", "whole"])
def test_the_cluster_mainloops_compile_for_sm90a_in_both_build_paths(whole_program):
    """Separate compilation (the default path, what a search builds) builds every point; the
    whole-program path (``CUCO_WHOLE_PROGRAM=1``, opt-in for timings) builds the fused points
    only, which hold every cluster mainloop (asserted here), each under an epilogue path's
    block bodies compiled against the real CUTLASS types: the gemm_only points' mainloops are
    those same mainloops, already compiled whole here and their gemm_only kernels by the
    separate build (CI's time: three CUTLASS builds fewer)."""
    points = cluster_points()
    if whole_program:
        points = [p for p in points if not p[3]]
        assert {Mainloop.of(d) for _, _, d, _ in points} == set(CLUSTER_MAINLOOPS)
    assert_points_compile(points, whole_program=whole_program)
