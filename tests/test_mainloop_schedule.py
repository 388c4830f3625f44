"""The in-kernel mainloop's consumer schedule (cooperative or pingpong): what the design
rules accept, what the search space offers, and what the template renders."""

from __future__ import annotations

import pytest

from cuco import DirectiveError, Directives, GemmProblem, Schedule
from cuco.kernels.tp import MAINLOOPS, Mainloop, in_kernel, render_tp
from cuco.workloads import for_problem

PROBLEM = GemmProblem(workload="gemm_reducescatter", m=2048, k=2048, n=2048, world_size=2)


def test_cooperative_is_the_default_and_keeps_old_names():
    d = in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8)
    assert d.schedule is Schedule.COOPERATIVE
    assert d.full_name == "lsa.epilogue.chunk.cta.c64K.t128x256x64.s3.g8.cw3.direct"
    pp = in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong")
    assert pp.full_name == "lsa.epilogue.chunk.cta.c32K.t128x128x64.s6.pp.direct"
    assert Directives.from_json(pp.to_json()) == pp


def test_pingpong_is_refused_where_it_cannot_apply():
    with pytest.raises(DirectiveError, match="schedule=pingpong applies to the in-kernel"):
        Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, schedule="pingpong")
    with pytest.raises(DirectiveError, match="tile_m x tile_n <= 16384"):
        in_kernel("epilogue", tile_n=256, schedule="pingpong")
    with pytest.raises(DirectiveError, match="choose tile_m 128 or 256"):
        render_tp(PROBLEM, Directives(placement="epilogue", sync_scope="chunk", tile_m=64,
                                      tile_n=128, chunk_bytes=16384))


def test_the_space_sweeps_both_schedules_only_with_their_mainloops():
    from cuco.kernels.tp import cluster_twins, swapped_mainloops
    workload = for_problem(PROBLEM)
    points = list(workload.space().enumerate())
    seen = {Mainloop.of(d) for d in points if d.placement.in_kernel}
    fitted = swapped_mainloops(workload.pattern_problem)
    assert seen == {*MAINLOOPS, *fitted, *cluster_twins(workload.pattern_problem, fitted)}
    assert not any(d.schedule is Schedule.PINGPONG for d in points if not d.placement.in_kernel)


def test_the_template_renders_the_schedule_it_is_given():
    coop = render_tp(PROBLEM, in_kernel("epilogue", "lsa", "cta", comm_warps=3))[0].source
    pp = render_tp(PROBLEM, in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, comm_warps=3,
                                      schedule="pingpong"))[0].source
    assert "KernelTmaWarpSpecializedCooperative" in coop and "OrderedSequenceBarrier" not in coop
    assert "constexpr int kTeams = 1;" in coop
    assert "KernelTmaWarpSpecializedPingpong" in pp and "OrderedSequenceBarrier<2, kTeams>" in pp
    assert "constexpr int kTeams = 2;" in pp


def test_the_gemm_alone_benchmark_covers_every_mainloop_on_every_shape():
    """bench/gemm_mainloop.py's cases: the six distinct per-rank GEMMs of the nine pairs and a
    spread; every searched mainloop is timed on some shape, and each point renders (no GPU)."""
    from cuco.benchmarks.gemm_alone import GemmAloneBench, mainloop_points, nine_pair_gemms, problem_of

    assert nine_pair_gemms() == [(8192, 8192, 4096), (8192, 4096, 8192), (4096, 28672, 4096),
                                 (4096, 14336, 8192), (2048, 4096, 2048), (2048, 2048, 4096)]
    from cuco.kernels.tp import deepest, swapped_mainloops
    seen, deeper = set(), set()
    for shape in GemmAloneBench().shapes:
        points = mainloop_points(shape)
        # each swapped mainloop fitted to the shape, and with the stages the ring leaves room for
        assert {Mainloop.of(d) for d in points if d.swap_ab} == {
            x for ml in swapped_mainloops(problem_of(*shape)) for x in (ml, deepest(problem_of(*shape), ml))}
        deeper |= {deepest(problem_of(*shape), ml) for ml in MAINLOOPS} - set(MAINLOOPS)
        for d in points:
            seen.add(Mainloop.of(d))
            src = render_tp(problem_of(*shape), d, gemm_only=True)[0]
            assert src.name.startswith("profile.gemm_only.") and "cuco_fused_launch" in src.source
    assert {ml for ml in seen if not ml.swap_ab} == set(MAINLOOPS) | deeper
    assert Mainloop("cooperative", 256, 4) in deeper  # 128x256 beside the ring: 4 stages, not 3
