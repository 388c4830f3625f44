"""Issue #37's tile widths on the CPU: tiles 192 and 64 columns wide (the directives and their
refusals, the space and the benchmark sweeping them, the wave model that picks them by
default); the nvcc builds of every new mainloop, in both build paths, are marked slow."""

from __future__ import annotations

import pytest

from cuco import DirectiveError, Directives, GemmProblem
from cuco.benchmarks import gemm_alone as ga
from cuco.kernels import catalog, tp
from cuco.kernels.tp import (
    MAINLOOPS, WAVE_TILES, Mainloop, default_mainloop, in_kernel, modelled_time, render_tp,
    with_mainloop,
)
from build_checks import assert_points_compile


def test_tile_widths_192_and_64_are_directives_with_named_refusals():
    d = in_kernel("epilogue", tile_n=192, stages=4)
    assert d.chunk_bytes == 128 * 192 * 2 and ".t128x192x64.s4." in d.full_name
    assert in_kernel("epilogue", tile_m=64, tile_n=64, stages=8, schedule="pingpong").chunk_bytes == 8192
    with pytest.raises(DirectiveError, match=r"tile_n=96 is not supported; choose one of \(64, 128, 192, 256\)"):
        in_kernel("epilogue", tile_n=96)
    with pytest.raises(DirectiveError, match=r"tile_m=200 is not supported; choose one of \(64, 128, 256\), or "
                                             "with swap_ab=true a multiple of 16"):
        in_kernel("epilogue", tile_m=200)
    with pytest.raises(DirectiveError, match=r"tile_m: 192 rows are wgmma's M without swap_ab.*set swap_ab=true"):
        in_kernel("epilogue", tile_m=192)
    # a chunk of 3 x 2^k bytes is one 192-column tile; 5 x 2^k is the bytes of a swapped
    # 160x128 tile, which side_stream's chunks (a power of two, or three times one) are not
    assert Directives(chunk_bytes=3 << 14).chunk_bytes == 49152
    assert in_kernel("epilogue", tile_m=160, tile_n=128, swap_ab=True).chunk_bytes == 5 << 13
    with pytest.raises(DirectiveError, match="side_stream cuts chunks of a power of two bytes"):
        Directives(placement="side_stream", chunk_bytes=5 << 13, comm_ctas=8)
    with pytest.raises(DirectiveError, match="a multiple of 1K"):
        Directives(chunk_bytes=5000)
    # cooperative: two warpgroups split a tile's accumulators, and past 144 registers a thread
    # they spill (a swapped 176x256 tile ran 1.7-8.7x slower than each shape's best on 1 x H200)
    assert in_kernel("epilogue", tile_m=144, tile_n=256, swap_ab=True).chunk_bytes == 144 * 256 * 2
    for tm in (160, 176, 208, 256):
        with pytest.raises(DirectiveError, match=rf"under cooperative two warpgroups hold a {tm}x256 tile's "
                                                 rf"accumulators, {tm} registers a thread.*tile_n <= 36864"):
            in_kernel("epilogue", tile_m=tm, tile_n=256, swap_ab=True)
    # pingpong: one warpgroup holds a whole tile's accumulators
    with pytest.raises(DirectiveError, match=r"schedule: under pingpong one warpgroup holds a whole 128x192"):
        in_kernel("epilogue", tile_n=192, stages=4, schedule="pingpong")


def test_a_192_wide_tile_with_too_many_stages_names_the_stages_that_fit():
    p = ga.problem_of(1000, 5120, 5120)
    with pytest.raises(DirectiveError, match="set stages=4"):
        render_tp(p, in_kernel("epilogue", tile_n=192, stages=5), gemm_only=True)


def test_every_wave_tile_renders_with_its_tile_constants():
    p = ga.problem_of(1000, 5120, 5120)
    for ml in WAVE_TILES:
        assert ml in MAINLOOPS
        src = render_tp(p, with_mainloop(ga.BASE, ml), gemm_only=True)[0].source
        assert f"kTileM = {ml.tile_m}, kTileN = {ml.tile_n}," in src


def test_the_space_offers_the_wave_tiles():
    from cuco.workloads import for_problem
    problem = GemmProblem(workload="gemm_allreduce", m=2176, k=8192, n=2048, world_size=2)
    seen = {Mainloop.of(d) for d in for_problem(problem).space(["epilogue"]).enumerate()}
    assert set(WAVE_TILES) <= seen


def test_modelled_time_counts_a_partial_last_wave_as_a_whole_one():
    p = ga.problem_of(2176, 2048, 8192)
    pp128 = Mainloop("pingpong", 128, 6)
    # 272 128x128 tiles: 3 waves of 132 SMs, each a whole 128x128 tile's work
    assert modelled_time(p, pp128) == pytest.approx(3.0)
    # 136 128x256 tiles: 2 waves of twice the work
    assert modelled_time(p, Mainloop("cooperative", 256, 3)) == pytest.approx(4.0)
    # 374 64x192 tiles: 3 waves of 3/4 of the work, at the 64-row tiles' modelled rate
    assert modelled_time(p, Mainloop("pingpong", 192, 6, tile_m=64)) == pytest.approx(3 * 0.75 / tp.TILE_M64_RATE)


@pytest.mark.parametrize("shape,expect", [
    ((1024, 1536, 28672), Mainloop("pingpong", 192, 6, tile_m=64)),
    # the wave model keeps a measured pick it does not beat by WAVE_GAIN
    ((2048, 2048, 4096), Mainloop("pingpong", 128, 6)),
    # a swapped mainloop's rows fitted to the waves (SWAP_GAIN): 2176 rows in 16 tiles of 144
    # (x 16 of 128 columns: 256 tiles, two waves, modelled as 144x256's one wave of twice the
    # work and taken for its five stages to three) instead of 374 64x192 tiles; 1536 in 11 of
    # 144 (132 tiles, one wave) instead of 96 128x192 ones; 1000 in 6 of 176 (240 tiles)
    ((2176, 2048, 8192), Mainloop("cooperative", 128, 5, tile_m=144, swap_ab=True)),
    ((1536, 1536, 1536), Mainloop("cooperative", 128, 5, tile_m=144, swap_ab=True)),
    ((1000, 5120, 5120), Mainloop("cooperative", 128, 4, tile_m=176, swap_ab=True)),
])
def test_the_default_weighs_wave_efficiency(shape, expect):
    pick = default_mainloop(ga.problem_of(*shape))
    assert pick.mainloop == expect
    if expect in WAVE_TILES:
        assert "modelled, not measured" in pick.why and "waves" in pick.why
    if expect.swap_ab:
        assert "A and B swapped" in pick.why and "SWAP_GAIN" not in pick.why and "waves" in pick.why


def test_the_benchmark_times_wave_tiles_where_the_model_says_they_can_win():
    points = {Mainloop.of(d) for d in ga.mainloop_points((1536, 1536, 1536))}
    # 96 128x192 tiles (one wave), 216 64x192 (two) and 576 64x64 (five waves of a quarter
    # tile each, at a lower rate) against 144 128x128 (two waves)
    assert set(WAVE_TILES) <= points
    # 8192x8192: 4096 128x128 tiles fill 31 waves nearly whole; 128x192's 31.5 waves of 1.5
    # tiles' work are within WAVE_TIMED of them
    assert not {Mainloop.of(d) for d in ga.mainloop_points((8192, 8192, 4096))} & set(WAVE_TILES)


# ---- nvcc (slow) ----------------------------------------------------------------------------
def wave_points():
    """Each wave tile in a gemm_only build, and the catalog's fused wave-tile points: each with
    its epilogue on the consumers, comm warps or dedicated CTAs (every tile loop of the
    template; the catalog's own points, so that CI's ``cuco kernels check`` finds them built)."""
    out = [(f"gemm_only {ml.text()}", ga.problem_of(1000, 5120, 5120), with_mainloop(ga.BASE, ml), True)
           for ml in WAVE_TILES]
    return out + [(label, p, d, False) for label, p, d in catalog.wave_points()]


@pytest.mark.slow
@pytest.mark.parametrize("whole_program", [False, True], ids=["separate", "whole"])
def test_the_wave_tiles_compile_for_sm90a_in_both_build_paths(whole_program):
    """Separate compilation (the default path, what a search builds) builds every point; the
    whole-program path (``CUCO_WHOLE_PROGRAM=1``, opt-in for timings) builds the fused points
    only, which hold every wave tile (asserted here), each under an epilogue path's block
    bodies compiled against the real CUTLASS types: the gemm_only points' mainloops are those
    same tiles, already compiled whole here and their gemm_only kernels by the separate build
    (CI's time: three CUTLASS builds fewer)."""
    points = wave_points()
    if whole_program:
        points = [p for p in points if not p[3]]
        assert {Mainloop.of(d) for _, _, d, _ in points} == set(WAVE_TILES)
    assert_points_compile(points, whole_program=whole_program)
