"""GPU tests: the in-kernel placements (epilogue, dedicated_ctas) are correct on fresh seeds
at four shapes, one of them ragged (short last tiles in M, N and K), and so are issue #37's
mainloops (split-K, 64-row tiles, 192- and 64-wide tiles, 2x1 clusters, A and B swapped); one build runs
every shape (2 ranks where there are two GPUs, else one: the mainloops, tile orders and
epilogue handovers need no peer), and a variant that skips its flag waits is caught (2 GPUs)."""

from __future__ import annotations

import pytest

from cuco.design import GemmProblem
from cuco.kernels import Compiler
from cuco.kernels.tp import in_kernel, render_tp
from conftest import TEST_WORLD
from tp_in_kernel_cases import (FAMILIES, cluster_shapes, clusters, grid_points, grid_shapes, one_build_points,
                                one_build_shapes, ring_staged, split_and_64_rows, split_shapes, swapped,
                                swapped_cluster_shapes,
                                swapped_clusters, swapped_shapes, wave_shapes,
                                wave_tiles)

pytestmark = pytest.mark.gpu(count=1)

def build(problem, points, edit=None):
    from cuco.evaluate.jobs import VariantSpec
    sources = [render_tp(problem, d)[0] for d in points]
    built = Compiler().compile_many([(s.name, edit(s.source) if edit else s.source, s.needs)
                                     for s in sources])
    for b in built:
        assert hasattr(b, "path"), str(b)
    return [VariantSpec(d.full_name, d.to_json(), str(b.path)) for d, b in zip(points, built)]


def right_on_two_seeds(world_group, problem, specs, timeout: float = 180) -> list[dict]:
    """A check-only job of ``specs`` on each of two fresh seeds: the job runs, and every
    program of it (the host programs too) is right on every element. Each seed's records."""
    from cuco.evaluate.jobs import Case
    from cuco.runtime.records import merge_ranks
    from cuco.workloads import for_problem
    out = []
    for seed in (5, 6):
        res = world_group.run(Case(for_problem(problem), variants=specs, seed=seed, time=False),
                              timeout=timeout)
        assert res.ok, res.error_text()
        merged = merge_ranks(res.results)
        for name, rec in merged.items():
            assert rec.correct, f"{problem.label} seed {seed} {name}: {rec}"
        out.append(merged)
    return out


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in grid_shapes(TEST_WORLD)])
def test_in_kernel_grid_is_correct(world_group, family, shape):
    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = grid_points(shape)
    specs = build(problem, points)
    for merged in right_on_two_seeds(world_group, problem, specs, timeout=120):
        assert set(merged) == {"host_nccl", "host_nccl_default", *(s.name for s in specs)}


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in split_shapes(TEST_WORLD)],
                         ids=[f"{f}-{'x'.join(map(str, s))}" for f in FAMILIES for s in split_shapes(TEST_WORLD)])
def test_split_k_and_64_row_tiles_are_correct(world_group, family, shape):
    """Each new mainloop that renders at the shape (a split-K point needs a k-tile per slice)
    is correct on two fresh seeds: every slice of every tile summed once, and only finished
    tiles communicated (a decode-like M of 136, a ragged shape, a deep K, and more tiles than
    CTAs with a short last wave: whole waves unsplit, the last one's tiles in slices)."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in split_and_64_rows() if not supported(problem, d)]
    assert any(d.split_k > 1 for d in points) and any(d.tile_m == 64 for d in points)
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in wave_shapes(TEST_WORLD)])
def test_wave_tiles_are_correct(world_group, family, shape):
    """Each 192- or 64-wide tile is correct on two fresh seeds, every element against the fp32
    reference: a short last n-tile of 192 columns (1040 = 5 x 192 + 80), ragged M, many tiles
    per CTA (both pingpong warpgroups), a decode-like M of 136."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in wave_tiles() if not supported(problem, d)]
    assert {d.tile_n for d in points} == {64, 192}
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in cluster_shapes(TEST_WORLD)])
def test_clusters_are_correct(world_group, family, shape):
    """Each cluster point is correct on two fresh seeds, every element against the fp32
    reference: blocks of an odd number of 128-row m-tiles, whose last one's partner is a
    phantom (384 rows on one rank: 3; 300 on one rank: 3, the last short; 136 on two ranks:
    1 each), an even number with a short last one (RAGGED, 300 on two ranks), many tiles per
    CTA, every tile order."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in clusters() if not supported(problem, d)]
    assert len(points) == len(clusters())
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in swapped_shapes(TEST_WORLD)])
def test_swapped_mainloops_are_correct(world_group, family, shape):
    """Each swapped mainloop (C^T = B^T A^T, the tile's rows on wgmma's N, staged transposed)
    is correct on two fresh seeds, every element against the fp32 reference: ragged M, N and K
    (a short last tile of 80 or 112 rows), a decode-like M of 136, many tiles per CTA (both
    pingpong warpgroups), and split-K's short last wave."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in swapped() if not supported(problem, d)]
    assert {d.swap_ab for d in points} == {True} and len({d.schedule for d in points}) == 2
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in swapped_cluster_shapes(TEST_WORLD)])
def test_swapped_clusters_are_correct(world_group, family, shape):
    """Each swapped mainloop in clusters along N (a pair of adjacent n-tiles of one m-tile,
    A's tile multicast to both) is correct on two fresh seeds, every element against the fp32
    reference: an odd number of n-tiles (the last one's partner a phantom), ragged rows, a
    decode-like M, many tiles per CTA."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in swapped_clusters() if not supported(problem, d)]
    assert len(points) == len(swapped_clusters())
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("shape", swapped_shapes(TEST_WORLD))
def test_ring_staged_tiles_are_correct(world_group, shape):
    """AllGather+GEMM's own output tiles staged and stored a sub-tile at a time through the ring
    (the stages that fit only beside it) are correct on two fresh seeds, every element against
    the fp32 reference: sub-tiles past a short last tile's rows or C's columns left out (ragged
    M, N and K), a decode-like M, many tiles per CTA (the ring's slots reused across tiles),
    clusters with phantoms, split-K."""
    from cuco.errors import DirectiveError
    from cuco.kernels.tp import ring_staged as staged

    m, n, k = shape
    problem = GemmProblem(workload="allgather_gemm", m=m, n=n, k=k, world_size=TEST_WORLD)
    points = []
    for d in ring_staged():
        try:
            render_tp(problem, d)
        except DirectiveError:  # e.g. a 144x256 tile larger than a decode-like M's output
            continue
        points.append(d)
    assert len(points) >= 5 and all(staged(problem, d) for d in points)
    right_on_two_seeds(world_group, problem, build(problem, points))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_build_runs_every_shape(world_group, family, dtype):
    """The kernel takes its shape per launch: built once (for the first shape), it is
    correct at shapes it was not rendered for, whole-tiled and ragged, in bf16 and fp16."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case
    from cuco.workloads import for_problem

    (m0, n0, k0), *others = one_build_shapes(TEST_WORLD)
    specs = build(GemmProblem(workload=family, m=m0, n=n0, k=k0, world_size=TEST_WORLD, dtype=dtype),
                  one_build_points())
    for m, n, k in others:
        problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD, dtype=dtype)
        res = world_group.run(Case(for_problem(problem), variants=specs, seed=7, time=False), timeout=120)
        assert res.ok, res.error_text()
        for name, rec in merge_ranks(res.results).items():
            assert rec.correct, f"{family} {(m, n, k)} {name}: {rec}"


@pytest.mark.gpu(count=2)
@pytest.mark.parametrize("comm_warps,schedule", [(0, "cooperative"), (3, "cooperative"),
                                                 (0, "pingpong"), (3, "pingpong")])
def test_a_reduction_that_skips_its_flag_wait_is_caught(world_group, comm_warps, schedule):
    """The owner reads its peers' partials without waiting for their flags (in the consumer
    warpgroups or in the comm warps): the stressed correctness run must see NaN poison (or
    a stale partial) and fail it."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case
    from cuco.workloads import GemmReduceScatter

    m, n, k = 1024, 1024, 2048
    d = in_kernel("epilogue", "lsa", "cta", comm_warps=comm_warps, schedule=schedule,
                  **({"tile_n": 128, "stages": 6} if schedule == "pingpong" else {}))
    cheat = "  wait_peers<N>(p, me, [&](int r) { return partial_slot(r, t); });\n"
    specs = build(GemmProblem(workload="gemm_reducescatter", m=m, n=n, k=k, world_size=TEST_WORLD), [d],
                  edit=lambda s: s.replace(cheat, "  group_sync<N>();\n"))
    res = world_group.run(Case(GemmReduceScatter(m=m, n=n, k=k, world_size=TEST_WORLD), variants=specs, seed=7, time=False),
                        timeout=120)
    assert res.ok, res.error_text()
    merged = merge_ranks(res.results)
    assert merged["host_nccl"].correct
    assert not merged[specs[0].name].correct
