"""The emulated GIN's CPU side: where GIN may run, the planted kernels' edits, and that the
GIN templates and plants compile for real (nvcc)."""

from __future__ import annotations

import difflib

import pytest

from cuco.benchmarks import gin
from cuco.kernels.tp import render_tp
from cuco.errors import EnvironmentProblem
from cuco.runtime.worker import WorkerContext, WorkerOptions


def test_gin_outside_an_emulated_world_says_where_it_can_run():
    ctx = WorkerContext(rank=0, world_size=2, device=0, options=WorkerOptions(emulated=False))
    with pytest.raises(EnvironmentProblem, match="only in an emulated world .*CUCO_EMULATE.*use lsa or nvshmem"):
        ctx.gin  # noqa: B018


@pytest.mark.parametrize("family", gin.FAMILIES)
def test_every_gin_template_runs_through_cuco_gin_with_its_proxy(family):
    src = render_tp(gin.problem(family, 4), gin.directives("warp"))[0].source
    assert '#include <cuco/gin.cuh>' in src and "gin_proxy(ARENA_PARAMS" in src
    assert "ncclGin{" not in src and "ncclBarrierSession" not in src  # only through cuco::Gin
    assert "* epoch" not in src and "waitSignal(" not in src  # targets follow the shadows, not epochs


@pytest.mark.parametrize("plant", sorted(gin.PLANTS))
def test_each_plant_changes_only_what_it_says(plant):
    _, d, planted = gin.PLANTS[plant](2)
    base = render_tp(gin.problem("gemm_allreduce", 2), d)[0].source
    diff = list(difflib.unified_diff(base.splitlines(), planted.splitlines(), lineterm="", n=0))
    added = [l[1:] for l in diff if l.startswith("+") and not l.startswith("+++")]
    removed = [l[1:] for l in diff if l.startswith("-") and not l.startswith("---")]
    from cuco.kernels import evolve
    assert evolve.edit_violations(base, planted) == []  # block bodies only: it reaches the GPU
    if plant == "reuses_source_before_flush":
        assert removed == [] and any("store16" in l and "p_off" in l for l in added)
    else:  # the reduction moves before the loop that waits for the arrivals
        send = evolve.blocks(planted)["chunk_send"]
        assert "reduce_rx(" in send and "reduce_rx(" not in evolve.blocks(planted)["chunk_reduce"]


@pytest.mark.slow
@pytest.mark.parametrize("plant", sorted(gin.PLANTS))
def test_the_plants_compile(plant, tmp_path):
    """A plant that stopped compiling would be 'caught' for the wrong reason."""
    from cuco.kernels.compiler import Compiler
    _, d, src = gin.PLANTS[plant](2)
    built = Compiler(cache_dir=tmp_path, arch="sm_90a").compile(src, needs=("nccl",), name=plant)
    assert built.path.exists() and built.path.stat().st_size > 0
