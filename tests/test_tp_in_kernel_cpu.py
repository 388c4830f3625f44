"""The in-kernel placements (epilogue, dedicated_ctas): what renders, what is refused and why."""

from __future__ import annotations

import pytest

from cuco.benchmarks.tp_workloads import SHAPES, grid
from cuco.design import Directives, GemmProblem
from cuco.errors import DirectiveError
from cuco.kernels import evolve
from cuco.kernels.tp import IN_KERNEL, in_kernel, local_gemm, render_tp
from build_checks import PRINT_TILES, host_rows

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")


@pytest.mark.parametrize("family", FAMILIES)
def test_benchmark_points_render_one_kernel_with_cutlass(family):
    from cuco.evaluate.static import static_violations
    for m, k, n in SHAPES:
        p = GemmProblem(workload=family, m=m, n=n, k=k, world_size=2)
        points = [d for d in grid(p) if d.placement.value in IN_KERNEL]
        assert {d.placement.value for d in points} == set(IN_KERNEL)
        for d in points:
            src, plan = render_tp(p, d)
            assert plan is None and "cutlass" in src.needs
            assert f"KernelTmaWarpSpecialized{d.schedule.value.capitalize()}" in src.source
            assert f"constexpr int kTileM = 128, kTileN = {d.tile_n}" in src.source
            assert static_violations(src.source) == []
            names = set(evolve.blocks(src.source))
            expected = {"push_x", "store_tile"} if family == "allgather_gemm" else {"push_partial", "reduce_own"}
            assert names == expected, names
            if d.placement.value == "dedicated_ctas":
                assert f"constexpr int kCommCtas = {d.comm_ctas};" in src.source


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("gemm_only", [False, True], ids=["fused", "profile"])
def test_only_tiles_a_rank_keeps_are_staged_for_tma_and_stored_by_it(family, gemm_only):
    """allgather_gemm's tiles are its own output: staged swizzled and unpadded, first in shared
    memory, and stored by TMA through a tensor map of each block's rows (every placement and
    schedule); the reductions' tiles go to peers or to the staging buffer, read back by the
    epilogue's threads from padded rows, with no tensor map of C."""
    p = GemmProblem(workload=family, m=1000, n=1040, k=1040, world_size=2)
    points = [in_kernel("epilogue"), in_kernel("epilogue", comm_warps=3, schedule="pingpong", tile_n=128, stages=6),
              in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4),
              in_kernel("epilogue", "nvshmem", "cta", tile_m=144, tile_n=128, stages=5, comm_warps=3, swap_ab=True)]
    for d in points:
        src = render_tp(p, d, gemm_only=gemm_only)[0].source
        by_tma = family == "allgather_gemm"
        assert ("store_staged(p, ss, blk, mt, nt)" in src) is by_tma, d
        assert ("#include <cuco/bulk.cuh>" in src) is by_tma
        assert ("encode_out_map(dims, out, b, p.out_map[b])" in src) is by_tma
        assert ("alignas(1024) T tile[kTileM * kTileN];" in src) is by_tma
        assert ("alignas(128) T tile[kTileM * kStageRow];" in src) is not by_tma
        assert ("SW128_Atom<TG>" in src) is by_tma
        if by_tma:  # the stage's writes are seen by the TMA unit; the last tile lands before the kernel ends
            assert src.count("cutlass::arch::fence_view_async_shared();") == 1 and "cuco::bulk_wait();" in src
            assert src.index("T tile[kTileM * kTileN]") < src.index("MainloopTensors mainloop;\n")


def test_world_size_reaches_the_kernel_and_the_shape_is_a_launch_argument():
    p = GemmProblem(workload="gemm_reducescatter", m=4096, n=2048, k=8192, world_size=4)
    src, _ = render_tp(p, in_kernel("epilogue"))
    assert "constexpr int kW = 4;" in src.source
    assert local_gemm(p) == (4096, 2048, 2048)  # K split over 4 ranks: what the runner passes
    ag = GemmProblem(workload="allgather_gemm", m=4096, n=2048, k=8192, world_size=8)
    assert local_gemm(ag) == (4096, 256, 8192)  # N split over 8 ranks
    # every shape of one configuration renders the same source: one build serves them all
    for family, shapes in (("gemm_reducescatter", [(4096, 2048, 8192), (1024, 512, 4096)]),
                           ("allgather_gemm", [(4096, 2048, 8192), (2048, 8192, 1024)])):
        d = in_kernel("dedicated_ctas", comm_ctas=8)
        sources = {render_tp(GemmProblem(workload=family, m=m, n=n, k=k, world_size=8), d)[0].source
                   for m, n, k in shapes}
        assert len(sources) == 1
        assert "cuco_fused_launch(int device, void* stream, int grid, int m, int n, int k, int raster_group," \
            in sources.pop()


@pytest.mark.parametrize("change,field,fix", [
    ({"backend": "gin"}, "backend", "gin runs with placement=side_stream only"),
    ({"sync_scope": "kernel"}, "sync_scope", "set sync_scope=chunk"),
    ({"chunk_bytes": 1 << 20}, "chunk_bytes", "set chunk_bytes=64K"),
    ({"tile_m": 64, "chunk_bytes": 32 << 10}, "tile_m", "choose tile_m 128 or 256"),
    ({"stages": 4}, "stages", "set stages=3"),
    ({"chunk_schedule": "ring"}, "chunk_schedule", "set chunk_schedule=direct"),
])
def test_refusals_name_the_dimension_and_the_fix(change, field, fix):
    p = GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=1024, world_size=2,
                has_network=change.get("backend") == "gin")
    d = Directives(**{**in_kernel("epilogue").model_dump(), **change})
    with pytest.raises(DirectiveError) as err:
        render_tp(p, d)
    assert any(line.startswith(field) and fix in line for line in err.value.problems), err.value


@pytest.mark.parametrize("family", FAMILIES)
def test_comm_warps_take_the_epilogue_off_the_consumers(family):
    """With comm_warps the consumers only stage each tile and hand it over (FULL), waiting
    only for the comm warps to free the stage (EMPTY); without, they run the epilogue."""
    p = GemmProblem(workload=family, m=1024, n=1024, k=1024, world_size=2)
    handed, own = (render_tp(p, in_kernel("epilogue", comm_warps=w))[0].source for w in (3, 0))
    consumers = handed[handed.index("// ---- consumers"):handed.index("// ---- host side")]
    assert "tile_epilogue" not in consumers and "NamedBarrier::arrive(kHandoff, kBarFull)" in consumers
    assert "tile_epilogue<kCommThreads>" in handed and "constexpr int kCommWarps = 3;" in handed
    assert "warpgroup_reg_dealloc<56>" in handed and "warpgroup_reg_alloc<224>" in handed
    assert "tile_epilogue<kMmaThreads>" in own and "kBarFull" not in own.split("// ---- the kernel")[1]
    assert "warpgroup_reg_alloc<232>" in own


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("placement,comm_ctas,comm_warps", [("epilogue", 0, 0), ("epilogue", 0, 3),
                                                           ("dedicated_ctas", 4, 2)])
def test_the_issuer_is_a_type_picked_on_one_line(family, placement, comm_ctas, comm_warps):
    """Who polls the peers' flags is a type from cuco/issuer.cuh (Issuer::wait_in), not a
    branch of the template: the three issuers render the same kernel but for the line that
    picks the type (and the header comment naming the variant)."""
    p = GemmProblem(workload=family, m=1024, n=1024, k=1024, world_size=2)
    lines = {i: render_tp(p, in_kernel(placement, "lsa", i, comm_ctas=comm_ctas, comm_warps=comm_warps)
                          )[0].source.splitlines() for i in ("thread", "warp", "cta")}
    for issuer, src in lines.items():
        assert src.count(f"using Issuer = cuco::Issuer{issuer.capitalize()};") == 1
        assert len(src) == len(lines["thread"])
        differ = [a for a, b in zip(lines["thread"], src) if a != b]
        assert [a for a in differ if not a.startswith(("// issuer=", "using Issuer ="))] == [], issuer
        assert "Issuer::wait_in<N>(" in "\n".join(src)


def test_comm_warps_are_an_in_kernel_tunable():
    with pytest.raises(DirectiveError, match="comm_warps: placement=side_stream .* set comm_warps=0"):
        Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, comm_warps=2)
    with pytest.raises(DirectiveError, match="comm_warps=4 must be <= 3"):
        in_kernel("epilogue", comm_warps=4)  # the producer warpgroup has 3 spare warps
    assert in_kernel("epilogue", comm_warps=3, raster_group=8).full_name.endswith(".g8.cw3.direct")


def test_rows_that_split_unevenly_over_the_ranks_are_refused_and_short_tiles_are_not():
    p = GemmProblem(workload="gemm_reducescatter", m=384, n=1000, k=1008, world_size=2)  # 192 rows/rank, K 504 a rank
    assert "cuco_fused_launch" in render_tp(p, in_kernel("epilogue"))[0].source
    odd = GemmProblem(workload="gemm_allreduce", m=385, n=1024, k=1024, world_size=2)
    with pytest.raises(DirectiveError, match="use placement=side_stream or pad M to a multiple of 2"):
        render_tp(odd, in_kernel("epilogue"))


HARNESS = """
#include <cstdio>
constexpr int kW = {{ w }};
struct Dims { int block_mt, nt, block_tiles, group_m; };
{% include "_raster.cu.j2" %}
int main() {
  const Dims s{ {{ bmt }}, {{ nt }}, {{ bmt }} * {{ nt }}, {{ group }} < {{ bmt }} ? {{ group }} : {{ bmt }} };
""" + PRINT_TILES


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["gemm_reducescatter", "allgather_gemm"])
@pytest.mark.parametrize("w,bmt,nt,group", [(2, 16, 112, 8), (4, 5, 3, 4), (8, 2, 7, 16), (2, 3, 4, 1)])
def test_tile_order_is_a_bijection_in_block_order(tmp_path, workload, w, bmt, nt, group):
    """The kernel's own tile_of, compiled by nvcc for the host and run for every tile."""
    rows = host_rows(tmp_path, HARNESS, "order", w=w, bmt=bmt, nt=nt, workload=workload, group=group)
    per_tile = bmt * nt
    g = min(group, bmt)
    for me in range(w):
        mine = [r for r in rows if r[0] == me]
        assert sorted((b, m, n) for _, _, b, m, n in mine) == \
            sorted((b, m, n) for b in range(w) for m in range(bmt) for n in range(nt))
        for _, i, b, m, n in mine:
            step = i // per_tile  # reductions: peers' blocks first and own last; all-gather: own first
            assert b == ((me + step) % w if workload == "allgather_gemm" else (me + 1 + step) % w)
            j = i % per_tile
            if group == 1:
                assert (m, n) == (j // nt, j % nt)  # row by row
            else:
                first = j // (g * nt) * g
                assert first <= m < first + g  # one wave stays inside its group of m-tiles


def test_ci_builds_comm_warp_kernels_at_world_sizes_4_and_8():
    """The reduction's batched loads (kU units x kW-1 peers) and the X pushes to every peer at
    the world sizes no machine here has: the catalog that CI compiles with nvcc
    (tests/test_kernels.py) holds them."""
    from cuco.kernels.catalog import in_kernel_sources
    srcs = [s.source for s in in_kernel_sources()]
    for w, family in ((4, "gemm_allreduce"), (8, "allgather_gemm")):
        assert any(f"constexpr int kW = {w};" in s and "constexpr int kCommWarps = 0;" not in s
                   and f"cuco: {family}" in s for s in srcs), (w, family)
