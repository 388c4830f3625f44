"""Any M (issue #21): ragged chunk plans, the side-stream kernels that take them (rendered
and built with the real nvcc), and the refusals that name the fix for what cannot run."""

from __future__ import annotations

import random

import pytest

from cuco import DirectiveError, Directives, GemmProblem, ShapeError
from cuco.design.tiles import EQUAL_CHUNKS_M, ChunkPlan, largest_divisor
from cuco.evaluate.static import static_violations
from cuco.kernels import evolve
from cuco.kernels.tp import in_kernel, render_side_stream
from cuco.workloads import AllGatherGemm, GemmAllReduce, GemmReduceScatter

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")
RAGGED = dict(m=3000, k=1536, n=1536, world_size=2)  # 1500 rows per rank block


def side(**kw) -> Directives:
    return Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, **kw)


def block_units(p: GemmProblem) -> tuple[int, int]:
    """(blocks, rows per block) of a family's chunk plan."""
    return (1, p.m) if p.workload == "gemm_allreduce" else (p.world_size, p.m // p.world_size)


def test_every_row_is_in_exactly_one_chunk_for_any_m():
    """Property check over many shapes: chunks tile each block without gaps or overlap,
    keep the production order and owners, and stay within the chunk size asked for."""
    rng = random.Random(21)
    for _ in range(2000):
        family = rng.choice(FAMILIES)
        w = rng.choice((2, 3, 4, 8))
        m = w * rng.randint(1, 3000) if family != "gemm_allreduce" else rng.randint(1, 9000)
        n = 8 * w * rng.randint(1, 64)
        p = GemmProblem(workload=family, m=m, n=n, k=n, world_size=w)
        d = side(chunk_bytes=1 << rng.randint(12, 22))
        try:
            plan = ChunkPlan.for_problem(p, d)
        except DirectiveError as exc:  # only a chunk smaller than 8 rows is refused
            assert "chunk_bytes" in str(exc) and d.chunk_bytes < 8 * plan_row_bytes(p)
            continue
        blocks, unit = block_units(p)
        assert plan.blocks == blocks and plan.block_rows == unit
        order = plan.order()
        assert [c.index for c in order] == list(range(plan.n_chunks))
        seen = sorted((c.row, c.rows) for c in order)
        assert seen[0][0] == 0 and sum(r for _, r in seen) == blocks * unit
        assert all(a + ra == b for (a, ra), (b, _) in zip(seen, seen[1:]))  # no gap, no overlap
        for c in order:
            assert c.row // plan.block_rows == c.block  # a chunk never crosses its owner's block
            assert (c.block == c.index % w) if family == "gemm_reducescatter" \
                else (c.block == c.index // plan.chunks_per_block)
            assert c.rows <= max(plan.rows, 1) and c.rows >= 1
        if plan.chunks_per_block > 1:
            assert plan.rows % 8 == 0 and plan.rows * plan_row_bytes(p) <= max(d.chunk_bytes, 8 * plan_row_bytes(p))
        assert plan.ragged == bool(m % EQUAL_CHUNKS_M)


def plan_row_bytes(p: GemmProblem) -> int:
    return (p.k if p.workload == "allgather_gemm" else p.n) * p.dtype_bytes


@pytest.mark.parametrize("m", [64, 4096, 8192, 3008, 6144])
def test_shapes_that_divide_keep_their_equal_chunks(m):
    """An M that is a multiple of 64 is planned as before ragged plans existed: the largest
    divisor of the block that fits the chunk (what keeps its kernels byte-identical)."""
    for family in FAMILIES:
        p = GemmProblem(workload=family, m=m, n=4096, k=4096, world_size=2)
        for chunk in (1 << 16, 1 << 18, 1 << 21):
            plan = ChunkPlan.for_problem(p, side(chunk_bytes=chunk))
            _, unit = block_units(p)
            assert not plan.ragged and plan.last_rows == plan.rows
            assert plan.rows == largest_divisor(unit, min(max(1, chunk // plan_row_bytes(p)), unit))


def test_a_ragged_plan_cuts_1500_rows_into_near_equal_chunks():
    p = GemmProblem(workload="gemm_reducescatter", **RAGGED)
    plan = ChunkPlan.for_problem(p, side(chunk_bytes=1 << 20))  # 341 rows of 3 KiB fit
    assert (plan.rows, plan.chunks_per_block, plan.last_rows) == (304, 5, 284)
    assert [c.rows for c in plan.order()] == [304] * 8 + [284] * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_kernels_render_with_the_same_blocks(family):
    """Every issuer and backend renders a ragged plan's general bodies; the EVOLVE-BLOCKs
    keep their names, pass the static checks, and splice into the small ragged shape the
    evaluator checks first."""
    p = GemmProblem(workload=family, **RAGGED)
    wl = {"gemm_allreduce": GemmAllReduce, "gemm_reducescatter": GemmReduceScatter,
          "allgather_gemm": AllGatherGemm}[family](m=p.m, n=p.n, k=p.k, world_size=2)
    equal = render_side_stream(p.model_copy(update={"m": 3072}), side())[0]
    small = wl.small_problem()
    assert small.m % EQUAL_CHUNKS_M == p.m % EQUAL_CHUNKS_M
    for backend in ("lsa", "nvshmem"):
        for issuer in ("thread", "warp", "cta"):
            d = side(backend=backend, issuer=issuer, chunk_bytes=1 << 20)
            src, plan = render_side_stream(p, d)
            assert plan.ragged and "chunk_rows(" in src.source and "chunk_rows(" not in equal.source
            assert evolve.blocks(src.source).keys() == evolve.blocks(equal.source).keys()
            assert static_violations(src.source) == []
            small_src, small_plan = render_side_stream(small, wl.small_directives(d, wl.at(small)))
            assert small_plan.ragged
            spliced = evolve.splice(small_src.source, evolve.blocks(src.source))
            assert evolve.edit_violations(small_src.source, spliced) == []


def test_fp16_renders_half_precision_with_fp32_accumulation():
    p = GemmProblem(workload="gemm_allreduce", dtype="fp16", **RAGGED)
    src, _ = render_side_stream(p, side())
    assert "using T = __half;" in src.source and "cuco::Acc16<T>" in src.source


def test_gin_refuses_a_ragged_plan_with_the_fix():
    p = GemmProblem(workload="gemm_allreduce", has_network=True, **RAGGED)
    with pytest.raises(DirectiveError, match="choose backend=lsa or nvshmem, or pad M to a multiple of 64"):
        render_side_stream(p, side(backend="gin"))


def test_ragged_side_stream_kernels_compile_with_nvcc(tmp_path):
    """Two ragged kernels built for sm_90a: AllReduce's uneven slices, ReduceScatter's
    short owner chunks (AllGather's body is ReduceScatter's copy without the sum)."""
    from cuco.kernels import Compiler
    comp = Compiler(arch="sm_90a", cache_dir=str(tmp_path / "kcache"))
    srcs = [render_side_stream(GemmProblem(workload=f, **RAGGED), side(issuer=i, chunk_bytes=1 << 20))[0]
            for f, i in (("gemm_allreduce", "cta"), ("gemm_reducescatter", "warp"))]
    for built in comp.compile_many([(s.name, s.source, s.needs) for s in srcs]):
        assert built.path.exists()


# ---- what cannot run says what to do ----------------------------------------------------
def test_in_kernel_points_take_any_m_n_k_and_refuse_unequal_row_blocks_naming_side_stream():
    # 1500 rows per rank: eleven whole 128-row tiles and a short one; N and K not tile
    # multiples (each rank's part of them 776: whole 16-byte rows)
    for wl in (GemmReduceScatter(m=3000, n=1552, k=1552, world_size=2), AllGatherGemm(m=3000, n=1552, k=1552, world_size=2),
               GemmAllReduce(m=3000, n=1552, k=1552, world_size=2)):
        d = in_kernel("epilogue", tile_n=128, stages=4)
        assert wl.supported(d) == [] and wl.row_blocks_refusal() is None
        assert "cuco_fused_launch" in wl.render(d).source
        assert {"epilogue", "dedicated_ctas"} <= {p.value for p in wl.space().choices["placement"]}
    # a rank's part of a split dimension that is not whole 16-byte rows (the TMA tiles' unit)
    for wl, dim in ((GemmReduceScatter(m=3000, n=1544, k=1544, world_size=2), "K=772"),
                    (AllGatherGemm(m=1000, n=1040, k=1040, world_size=4), "N=260")):
        why = wl.supported(in_kernel("epilogue", tile_n=128, stages=4))
        assert why and dim in why[0] and "use placement=side_stream" in why[0], why
        assert {p.value for p in wl.space().choices["placement"]} == {"side_stream"}
    # an AllReduce M that does not split into equal blocks per rank
    wl = GemmAllReduce(m=3001, n=1536, k=1536, world_size=2)
    why = wl.supported(in_kernel("epilogue", tile_n=128, stages=4))
    assert why and "use placement=side_stream or pad M to a multiple of 2 (e.g. 3002)" in why[0]
    with pytest.raises(DirectiveError, match="use placement=side_stream"):
        wl.render(in_kernel("epilogue", tile_n=128, stages=4))
    with pytest.raises(ShapeError, match="use placement=side_stream") as err:
        wl.space(["epilogue", "dedicated_ctas"])
    assert (err.value.param, err.value.fix) == ("placements", "side_stream")
    assert {p.value for p in wl.space().choices["placement"]} == {"side_stream"}


@pytest.mark.parametrize("shape,param,fix", [
    (dict(workload="gemm_allreduce", m=3000, k=8192, n=8191), "n", 8192),
    (dict(workload="allgather_gemm", m=3000, k=8190, n=8192), "k", 8192),
    (dict(workload="gemm_reducescatter", m=3001, k=8192, n=8192), "m", 3000),
    (dict(workload="allgather_gemm", m=3000, k=8192, n=1004), "n", 1000),
    (dict(workload="gemm_allreduce", m=100, k=100, n=64, dtype="fp32"), "k", 100),
])
def test_shapes_that_cannot_run_name_the_parameter_and_the_nearest_fix(shape, param, fix):
    w = 2
    if param == "k" and shape.get("dtype") == "fp32":  # 16-byte rows: 4 fp32; split over 2
        assert GemmProblem(world_size=w, **shape).k == 100
        return
    with pytest.raises(ShapeError) as err:
        GemmProblem(world_size=w, **shape)
    assert (err.value.param, err.value.fix) == (param, fix)
    assert "multiple of" in str(err.value)


@pytest.mark.parametrize("wl", [GemmAllReduce(m=3000, n=1536, k=1536, world_size=2), GemmReduceScatter(m=3000, n=1536, k=1536, world_size=2),
                                AllGatherGemm(m=1000, n=5120, k=4096, world_size=2)], ids=FAMILIES)
def test_a_ragged_shape_searches_every_placement(wl):
    from cuco.workloads.tp import GemmWorkload
    assert isinstance(wl, GemmWorkload)
    space = wl.space()
    points = list(space.enumerate())
    assert {d.placement.value for d in points} == {"side_stream", "epilogue", "dedicated_ctas"}
    by_placement = {}
    for d in points:
        by_placement.setdefault(d.placement.value, d)
    for d in by_placement.values():
        assert wl.render(d).source


@pytest.mark.parametrize("workload", ["gemm_allreduce", "gemm_reducescatter", "allgather_gemm"])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", ["1024x1024x2048", "3000x1544x4096", "256x8192x1536"])
def test_every_side_stream_point_has_a_chunk_the_small_check_shape_cuts(workload, world, shape):
    """The evaluator checks each point at its workload's small shape first: a chunk valid at
    the problem must cut the small shape's rows too (AllGather's small K is 512 W, so its
    rows are wider: at W = 8 a 32 KiB chunk held 4 of 8192 bytes and every AllGather
    side-stream default was refused at the static stage)."""
    from cuco import make_problem
    from cuco.design.tiles import ChunkPlan
    from cuco.workloads.base import for_problem
    wl = for_problem(make_problem(workload, shape, world_size=world))
    small = for_problem(wl.small_problem())
    for d in wl.space(["side_stream"]).enumerate():
        ChunkPlan.for_problem(small.pattern_problem, wl.small_directives(d, small))
