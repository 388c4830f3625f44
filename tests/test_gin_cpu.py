"""The emulated GIN's CPU side: where GIN may run, which workloads have GIN templates, the
planted kernels' edits, and that the GIN templates and plants compile for real (nvcc)."""

from __future__ import annotations

import difflib

import pytest

from cuco.benchmarks import gin
from cuco.design import Backend
from cuco.errors import DirectiveError, EnvironmentProblem
from cuco.kernels import evolve
from cuco.runtime.worker import WorkerContext, WorkerOptions
from cuco.workloads.base import for_problem
from cuco.workloads.moe import MoE, MoEGinRunner, MoERunner


def test_gin_outside_an_emulated_world_says_where_it_can_run():
    ctx = WorkerContext(rank=0, world_size=2, device=0, options=WorkerOptions(emulated=False))
    with pytest.raises(EnvironmentProblem, match="only in an emulated world .*CUCO_EMULATE.*use lsa or nvshmem"):
        ctx.gin  # noqa: B018


def test_a_moe_gin_job_outside_an_emulated_world_is_refused_the_same_way():
    """A job's arenas come first (``prepare_arenas``): the GIN one refuses before anything
    is allocated, for the MoE layer as for the TP families."""
    from cuco.runtime.arena import prepare_arenas
    ctx = WorkerContext(rank=0, world_size=2, device=0, options=WorkerOptions(emulated=False))
    with pytest.raises(EnvironmentProblem, match="backend=gin runs here only in an emulated world"):
        prepare_arenas(ctx, for_problem(gin.problem("moe", 2)).layout(), {"gin"})


@pytest.mark.parametrize("family", gin.FAMILIES)
def test_every_gin_template_runs_through_cuco_gin_with_its_proxy(family):
    for issuer in gin.ISSUERS:
        src = gin.source(family, 4, gin.directives(issuer))
        assert '#include <cuco/gin.cuh>' in src and "gin_proxy(ARENA_PARAMS" in src
        assert "ncclGin{" not in src and "ncclBarrierSession" not in src  # only through cuco::Gin
        assert "* epoch" not in src and "waitSignal(" not in src  # targets follow the shadows, not epochs
        assert "ncclGetLsaPointer" not in src and "a.at(" not in src  # no byte crosses but by a put


def test_the_moe_layer_has_a_gin_template_and_the_other_pipelines_none():
    """The op's table (``PipelineOp.gin_template``) is what the workloads, the design space
    and the catalog read: MoE offers gin where its ranks span hosts, KV and CP refuse it."""
    from cuco.design.pipeline_ops import CP_ATTENTION, KV_TRANSFER, MOE
    from cuco.kernels.catalog import template_of
    assert MOE.backends == (Backend.LSA, Backend.NVSHMEM, Backend.GIN) and MoE.backends == MOE.backends
    assert MOE.template_for("gin") == "moe_gin.cu.j2" and MOE.template_for(Backend.LSA) == "moe.cu.j2"
    assert all(Backend.GIN not in op.backends for op in (KV_TRANSFER, CP_ATTENTION))
    networked = for_problem(gin.problem("moe", 2))
    backends = {d.backend for d in networked.space().enumerate()}
    assert backends == {Backend.LSA, Backend.NVSHMEM, Backend.GIN}
    one_host = MoE(2, **gin.MOE_SHAPE)
    assert Backend.GIN not in {d.backend for d in one_host.space().enumerate()}
    with pytest.raises(DirectiveError, match="backend=gin needs ranks on different hosts"):
        one_host.render(gin.directives("cta"))
    with pytest.raises(DirectiveError, match="placement"):
        networked.render(gin.directives("cta").replace(placement="dedicated_ctas", comm_ctas=4))
    src = networked.render(gin.directives("warp"))
    assert template_of(src) == "moe_gin.cu.j2" and src.needs == ("nccl",)
    assert src.functions == MoEGinRunner.KERNELS and networked.runner_class(gin.directives("warp")) is MoEGinRunner
    assert networked.runner_class(gin.directives("warp").replace(backend="lsa")) is MoERunner


def test_moe_gin_stages_and_returns_rows_in_the_arena_only_where_ranks_span_hosts():
    wl = for_problem(gin.problem("moe", 4))
    rows = wl.pairs * wl.row_bytes
    lay = wl.layout()
    assert {"send", "ret"} <= set(lay.data) and lay.guards == tuple(sorted(lay.guards))
    assert lay.data["ret"] - lay.data["send"] >= rows  # one row per pair each, guard pages between
    assert set(MoE(4, **gin.MOE_SHAPE).layout().data) == {"recv", "y", "counts"}


def test_moe_gin_groups_are_bounded_by_the_signals():
    from cuco.workloads.moe import gin as moe_gin
    moe_gin.plan_check(64)
    with pytest.raises(DirectiveError, match="GIN signals"):
        moe_gin.plan_check(5000)


@pytest.mark.parametrize("plant", sorted(gin.PLANTS))
def test_each_plant_changes_only_what_it_says(plant):
    problem, d, planted = gin.PLANTS[plant](2)
    base = gin.source(problem.workload, 2, d)
    diff = list(difflib.unified_diff(base.splitlines(), planted.splitlines(), lineterm="", n=0))
    added = [l[1:] for l in diff if l.startswith("+") and not l.startswith("+++")]
    removed = [l[1:] for l in diff if l.startswith("-") and not l.startswith("---")]
    assert evolve.edit_violations(base, planted) == []  # block bodies only: it reaches the GPU
    if plant == "reuses_source_before_flush":
        assert removed == [] and any("store16" in l and "p_off" in l for l in added)
    elif plant == "reads_before_its_signal":  # the reduction moves before the loop that waits for the arrivals
        send = evolve.blocks(planted)["chunk_send"]
        assert "reduce_rx(" in send and "reduce_rx(" not in evolve.blocks(planted)["chunk_reduce"]
    elif plant == "moe_reuses_staged_rows_before_flush":  # scribbles over the put's source right after it
        assert removed == [] and any("store16" in l and "staged" in l for l in added)
        assert "gin.flush(" not in evolve.blocks(planted)["dispatch_block"]
    else:  # the same wait and sum, the sum first
        body = evolve.blocks(planted)["combine"]
        assert body.index("weighted_sum(") < body.index("waitSignalMeetShadow(")
        assert sorted(added) == sorted(removed)


@pytest.mark.slow
@pytest.mark.parametrize("plant", sorted(gin.PLANTS))
def test_the_plants_compile(plant, tmp_path):
    """A plant that stopped compiling would be 'caught' for the wrong reason."""
    from cuco.kernels.compiler import Compiler
    _, d, src = gin.PLANTS[plant](2)
    built = Compiler(cache_dir=tmp_path, arch="sm_90a").compile(src, needs=("nccl",), name=plant)
    assert built.path.exists() and built.path.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("issuer", gin.ISSUERS)
def test_the_moe_gin_kernels_build_every_kernel_their_runner_launches(issuer, compiler_cache):
    """One build serves NCCL's GIN and the emulated one (``cuco::Gin`` decides at run time, on
    the window's tag bit): nvcc compiles both paths, every kernel the runner launches in it."""
    from cuco.kernels.compiler import Compiler
    s = for_problem(gin.problem("moe", 2)).render(gin.directives(issuer))
    built = Compiler(arch="sm_90a", cache_dir=compiler_cache).compile(s.source, needs=s.needs, name=s.name)
    image = built.path.read_bytes()
    for name in MoEGinRunner.KERNELS:
        assert name.encode() in image, name
