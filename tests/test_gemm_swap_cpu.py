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
    with pytest.raises(DirectiveError, match="cluster_m: .* set cluster_m=1 or swap_ab=false"):
        render_tp(p, in_kernel("epilogue", tile_m=112, tile_n=128, stages=6, swap_ab=True, cluster_m=2))
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


@pytest.mark.parametrize("shape", [(200, 4096, 4096), (1536, 1536, 1536), (2176, 2048, 8192), (64, 8192, 8192)])
def test_the_fitted_mainloops_render_and_fill_the_waves_best(shape):
    p = ga.problem_of(*shape)
    fitted = swapped_mainloops(p)
    assert 1 <= len(fitted) <= 2
    for ml in fitted:
        assert ml.swap_ab and ml.tile_m in SWAPPED_TILE_M and ml.stages >= 3
        assert not tp.supported(p, with_mainloop(ga.BASE, ml))
        # no other row count of its frame is modelled faster
        for tm in SWAPPED_TILE_M:
            other = ml._replace(tile_m=tm, stages=tp.most_stages(tm, ml.tile_n))
            if other.stages >= 3 and not tp.supported(p, with_mainloop(ga.BASE, other)):
                assert tp.modelled_time(p, ml) <= tp.modelled_time(p, other) + 1e-12, (ml, tm)


def test_ci_builds_a_swapped_kernel():
    """The catalog CI compiles with nvcc (tests/test_kernels.py, `cuco kernels check`) holds a
    swapped in-kernel build beside the unswapped ones."""
    from cuco.kernels.catalog import in_kernel_sources
    srcs = [s.source for s in in_kernel_sources()]
    assert sum("CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in s for s in srcs) == 1
    assert sum("cutlass::layout::ColumnMajor" not in s for s in srcs) == len(srcs) - 1
