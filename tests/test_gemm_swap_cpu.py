"""The swapped in-kernel mainloop (``swap_ab``, issue #37): a directive with named refusals, a
template that renders C^T = B^T A^T only where asked, and tiles fitted to each shape."""

from __future__ import annotations

import pytest

from cuco.benchmarks import gemm_alone as ga
from cuco.design import Directives
from cuco.design.placement_rules import SWAPPED_TILE_M
from cuco.errors import DirectiveError
from cuco.kernels import tp
from cuco.kernels.tp import in_kernel, render_tp, swapped_mainloops, with_mainloop


def test_swap_ab_is_a_directive_with_named_refusals():
    d = in_kernel("epilogue", tile_m=112, tile_n=128, stages=6, swap_ab=True)
    assert d.full_name.endswith(".ab.direct") and Directives.from_json(d.to_json()) == d
    p = ga.problem_of(200, 4096, 4096)
    with pytest.raises(DirectiveError, match="tile_n: placement=epilogue with schedule=cooperative splits each "
                                             "tile's columns .* choose tile_n 128 or 256"):
        render_tp(p, in_kernel("epilogue", tile_m=112, tile_n=64, stages=8, swap_ab=True))
    with pytest.raises(DirectiveError, match="swap_ab: placement=side_stream runs a vendor GEMM .* set swap_ab=false"):
        Directives(placement="side_stream", comm_ctas=8, swap_ab=True)
    with pytest.raises(DirectiveError, match="tile_m=72 is not supported.*a multiple of 16"):
        in_kernel("epilogue", tile_m=72, swap_ab=True)


def test_only_a_swapped_point_renders_the_swapped_mainloop():
    p = ga.problem_of(1000, 5120, 5120)
    swapped = render_tp(p, with_mainloop(ga.BASE, tp.Mainloop("cooperative", 128, 4, 176, swap_ab=True)),
                        gemm_only=True)[0].source
    plain = render_tp(p, with_mainloop(ga.BASE, tp.Mainloop("pingpong", 128, 6)), gemm_only=True)[0].source
    assert "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in swapped and "cutlass::layout::ColumnMajor" in swapped
    assert "Shape<Int<kTileN>, Int<kTileM>, Int<kTileK>>" in swapped and "make_coord(nt, mt, _, 0)" in swapped
    assert "EXTENDED" not in plain and "ColumnMajor" not in plain and "make_coord(nt, mt" not in plain


def test_a_swapped_cluster_pairs_n_tiles_and_multicasts_a():
    """With swap_ab the mainloop's M is N: a cluster's CTAs take adjacent n-tiles of one m-tile
    (CUTLASS's cluster along its M multicasts its B, our A), a phantom pads the n-tiles, and
    the unswapped cluster keeps pairing m-tiles."""
    p = ga.problem_of(200, 4096, 4096)
    ml = tp.Mainloop("pingpong", 64, 8, 112, cluster_m=2, swap_ab=True)
    assert ml.text() == "pingpong 112x64 with 8 stages, clusters of 2 along N, A and B swapped"
    src = render_tp(p, with_mainloop(ga.BASE, ml), gemm_only=True)[0].source
    plain = render_tp(p, with_mainloop(ga.BASE, tp.Mainloop("pingpong", 128, 6, cluster_m=2)), gemm_only=True)[0].source
    for both in ("using ClusterShape = Shape<_2, _1, _1>;", "cute::block_rank_in_cluster()"):
        assert both in src and both in plain
    swapped_only = ("cluster_slots(d.nt, d.block_mt, raster_group)", "tile_of(p.dims.pairs, i, me, blk, nt, mt);",
                    "nt = min(nt, p.dims.nt - 1);", "if (nt < p.dims.nt)")
    plain_only = ("cluster_slots(d.block_mt, d.nt, raster_group)", "tile_of(p.dims.pairs, i, me, blk, mt, nt);",
                  "mt = min(mt, p.dims.block_mt - 1);", "if (mt < p.dims.block_mt)")
    for a, b in zip(swapped_only, plain_only):
        assert a in src and a not in plain and b in plain and b not in src, (a, b)


def test_the_search_and_the_bench_take_the_fitted_mainloops_in_clusters_along_n():
    p = ga.problem_of(200, 4096, 4096)
    fitted = swapped_mainloops(p)
    mls = tp.mainloops_for(p)
    assert [ml._replace(cluster_m=2) for ml in fitted] == [ml for ml in mls if ml.swap_ab and ml.cluster_m == 2]
    timed = {tp.Mainloop.of(d) for d in ga.mainloop_points((200, 4096, 4096), cluster_n=True)}
    assert {ml._replace(cluster_m=2) for ml in fitted} <= timed
    # without --cluster-n (the default run) none of them is timed
    assert not any(d.swap_ab and d.cluster_m > 1 for d in ga.mainloop_points((200, 4096, 4096)))
    # the tile orders of a cluster along N are those of its n-tiles (64 of 64 columns: 1, 8, 16)
    twin = fitted[0]._replace(cluster_m=2)
    assert ga.walked_tiles((200, 4096, 4096), twin) == -(-4096 // twin.tile_n)
    # one n-tile: no pair to share A with
    assert not tp.cluster_twins(ga.problem_of(200, 64, 4096), [fitted[0]._replace(tile_n=64)])


@pytest.mark.parametrize("shape", [(200, 4096, 4096), (1536, 1536, 1536), (2176, 2048, 8192), (64, 8192, 8192)])
def test_the_fitted_mainloops_render_and_fill_the_waves_best(shape):
    p = ga.problem_of(*shape)
    fitted = swapped_mainloops(p)
    assert 1 <= len(fitted) <= 2
    for ml in fitted:
        assert ml.swap_ab and ml.tile_m in SWAPPED_TILE_M and ml.stages >= 3
        assert not tp.supported(p, with_mainloop(ga.BASE, ml))
        # no other row count of its frame is modelled faster (among those the rules take: a
        # pingpong warpgroup holds at most 128x128 accumulators)
        for tm in SWAPPED_TILE_M:
            other = ml._replace(tile_m=tm, stages=tp.most_stages(tm, ml.tile_n))
            try:
                refused = other.stages < 3 or tp.supported(p, with_mainloop(ga.BASE, other))
            except DirectiveError:
                refused = True
            if not refused:
                assert tp.modelled_time(p, ml) <= tp.modelled_time(p, other) + 1e-12, (ml, tm)


def test_ci_builds_a_swapped_kernel():
    """The catalog CI compiles with nvcc (tests/test_kernels.py, `cuco kernels check`) holds
    two swapped in-kernel builds beside the unswapped ones, one in clusters along N."""
    from cuco.kernels.catalog import in_kernel_sources
    srcs = [s.source for s in in_kernel_sources()]
    assert sum("CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in s for s in srcs) == 2
    assert sum("cutlass::layout::ColumnMajor" not in s for s in srcs) == len(srcs) - 2
    assert sum("tile_of(p.dims.pairs, i, me, blk, nt, mt);" in s for s in srcs) == 1
