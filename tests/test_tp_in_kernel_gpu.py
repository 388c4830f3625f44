"""GPU tests: the in-kernel placements (epilogue, dedicated_ctas) are correct on fresh seeds
at four shapes, one of them ragged (short last tiles in M, N and K), and so are issue #37's
mainloops (split-K, 64-row tiles, 192- and 64-wide tiles, 2x1 clusters); one build runs
every shape (2 ranks where there are two GPUs, else one: the mainloops, tile orders and
epilogue handovers need no peer), and a variant that skips its flag waits is caught (2 GPUs)."""

from __future__ import annotations

import pytest

from cuco.design import GemmProblem
from cuco.kernels import Compiler
from cuco.kernels.tp import in_kernel, render_tp
from conftest import TEST_WORLD

pytestmark = pytest.mark.gpu(count=1)

SHAPES = [(512, 1024, 2048), (1024, 512, 1024)]  # (m, n, k)
#: 1000 rows (500 a rank at W = 2: three 128-row tiles and a short one), N and K (and
#: each rank's part of them, 520 wide at any W: whole 16-byte rows) not multiples of any
#: tile: every tile edge is ragged.
RAGGED = (1000, 520 * TEST_WORLD, 520 * TEST_WORLD)
#: Several tiles per CTA (odd and even counts): both pingpong warpgroups take turns.
MANY_TILES = (4096, 2048, 256)
FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")


def grid():
    return [in_kernel("epilogue", "lsa", "cta"), in_kernel("epilogue", "lsa", "thread"),
            in_kernel("epilogue", "nvshmem", "warp"), in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=4),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2),
            # the epilogue handed to spare producer warps; grouped tile orders
            in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=4),
            in_kernel("epilogue", "nvshmem", "thread", comm_warps=1, raster_group=16),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, comm_warps=2, raster_group=8),
            *pingpong()]


def pingpong():
    """The two consumer warpgroups on tiles of their own, taking turns."""
    return [in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=128, stages=6, comm_warps=3,
                      raster_group=8, schedule="pingpong"),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_n=128, stages=6,
                      comm_warps=2, raster_group=16, schedule="pingpong")]


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


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES for s in (*SHAPES, MANY_TILES, RAGGED)])
def test_in_kernel_grid_is_correct(world_group, family, shape):
    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = grid() if shape != MANY_TILES else [in_kernel("epilogue", "lsa", "cta", comm_warps=3,
                                                           raster_group=8), *pingpong()]
    specs = build(problem, points)
    for merged in right_on_two_seeds(world_group, problem, specs, timeout=120):
        assert set(merged) == {"host_nccl", "host_nccl_default", *(s.name for s in specs)}


def split_and_64_rows():
    """Issue #37's mainloops: 64-row pingpong tiles and K cut into slices (split-K), with the
    epilogue on the consumers or on spare warps, under both placements and schedules."""
    return [in_kernel("epilogue", "lsa", "cta", tile_m=64, tile_n=128, stages=8, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=64, tile_n=256, stages=4, schedule="pingpong",
                      comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong", split_k=2),
            in_kernel("epilogue", "nvshmem", "thread", tile_n=128, stages=6, schedule="pingpong", split_k=4,
                      comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "warp", tile_m=64, tile_n=128, stages=8, schedule="pingpong",
                      split_k=4, comm_warps=3),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, split_k=2),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, tile_n=128, stages=4, split_k=3,
                      comm_warps=2, raster_group=16)]


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES
                                          for s in ((512, 1024, 2048), (136, 528, 4096), RAGGED)])
def test_split_k_and_64_row_tiles_are_correct(world_group, family, shape):
    """Each new mainloop that renders at the shape (a split-K point needs a k-tile per slice)
    is correct on two fresh seeds: every slice of every tile summed once, and only finished
    tiles communicated (a decode-like M of 136, a ragged shape, a deep K)."""
    from cuco.kernels.tp import supported

    m, n, k = shape
    problem = GemmProblem(workload=family, m=m, n=n, k=k, world_size=TEST_WORLD)
    points = [d for d in split_and_64_rows() if not supported(problem, d)]
    assert any(d.split_k > 1 for d in points) and any(d.tile_m == 64 for d in points)
    right_on_two_seeds(world_group, problem, build(problem, points))


def wave_tiles():
    """Issue #37's tiles 192 and 64 columns wide (cuco.kernels.tp.WAVE_TILES), with the epilogue
    on the consumers, on spare warps or on dedicated CTAs."""
    return [in_kernel("epilogue", "lsa", "cta", tile_n=192, stages=4),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=192, stages=4, comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "thread", tile_m=64, tile_n=192, stages=6, schedule="pingpong"),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_m=64, tile_n=192, stages=6,
                      schedule="pingpong", comm_warps=2),
            in_kernel("epilogue", "lsa", "cta", tile_m=64, tile_n=64, stages=8, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=64, tile_n=64, stages=8, schedule="pingpong",
                      comm_warps=3, raster_group=16)]


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES
                                          for s in ((512, 1024, 2048), (136, 528, 4096), MANY_TILES, RAGGED)])
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


def clusters():
    """Issue #37's 2x1 clusters (B multicast to a pair of m-tiles) under both schedules, with
    the epilogue on the consumers, on spare warps or on dedicated CTAs, in every tile order."""
    return [in_kernel("epilogue", "lsa", "cta", cluster_m=2),
            in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong", cluster_m=2),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=128, stages=4, comm_warps=3, raster_group=8,
                      cluster_m=2),
            in_kernel("epilogue", "lsa", "thread", tile_n=128, stages=6, schedule="pingpong", comm_warps=3,
                      raster_group=16, cluster_m=2),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_n=128, stages=6, schedule="pingpong",
                      comm_warps=2, cluster_m=2),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, raster_group=4, cluster_m=2)]


@pytest.mark.parametrize("family,shape", [(f, s) for f in FAMILIES
                                          for s in ((512, 1024, 2048), (136, 528, 4096), (384, 1024, 1024),
                                                    (300, 1040, 1024), MANY_TILES, RAGGED)])
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


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_one_build_runs_every_shape(world_group, family, dtype):
    """The kernel takes its shape per launch: built once (for the first shape), it is
    correct at shapes it was not rendered for, whole-tiled and ragged, in bf16 and fp16."""
    from cuco.runtime.records import merge_ranks
    from cuco.evaluate.jobs import Case
    from cuco.workloads import for_problem

    points = [in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8),
              in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, tile_n=128, stages=6,
                        schedule="pingpong")]
    specs = build(GemmProblem(workload=family, m=512, n=1024, k=2048, world_size=TEST_WORLD, dtype=dtype),
                  points)
    for m, n, k in ((2048, 1024, 512), RAGGED, (136, 528, 784)):
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
