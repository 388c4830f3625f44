"""Render fused kernels for the tensor-parallel workloads from :class:`Directives`.

Three templates:

* ``placement=side_stream`` (``tp_side_stream.cu.j2``; GIN in ``tp_side_stream_gin.cu.j2``):
  vendor GEMM per chunk on one stream, a persistent communication kernel on another.
* ``placement=epilogue`` and ``dedicated_ctas`` (``tp_fused.cu.j2``): ONE persistent kernel
  whose GEMM mainloop is CUTLASS's Hopper collective (TMA + wgmma); each output tile is
  moved by the compute CTA itself (epilogue) or by CTAs of the same kernel reserved for
  communication (dedicated_ctas), with a flag per tile. These are built as shared objects
  (CUTLASS builds the TMA descriptors on the host) and need a tile_m of 128 or 256; the
  placements' own rules (one output tile per flag, ...) are in
  :mod:`cuco.design.placement_rules`.
"""

from __future__ import annotations

from typing import Any

from cuco.design import Directives, GemmProblem, placement_rules
from cuco.design.dimensions import Placement, Schedule
from cuco.design.patterns import TP_NAMES, LocalGemm, TPPattern, find
from cuco.design.rules import SMEM_LIMIT_BYTES, smem_bytes
from cuco.design.tiles import EQUAL_CHUNKS_M, ChunkPlan
from cuco.errors import DirectiveError
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels import fused_launch
from cuco.kernels.compiler import LAUNCHER_PARTS
from cuco.kernels.render import CTYPES, render

THREADS = 512
#: Flag slots per source rank: side-stream chunks, or fused tiles (at most half of them).
FLAG_STRIDE = 16384
#: The in-kernel placements' names, derived from :attr:`Placement.in_kernel` (test it there).
IN_KERNEL = tuple(p.value for p in Placement if p.in_kernel)
#: What a profile build's name starts with (the fused kernel's GEMM alone, ``gemm_only``).
PROFILE = "profile.gemm_only."
CUTLASS_TYPES = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}
#: The in-kernel mainloops a search sweeps, ``(schedule, tile_n, stages)`` at tile_m 128: the
#: most stages that fit beside the staged output tile. On one H200 the best of them ran
#: 1.003-1.078x torch.matmul on each of 12 GEMMs; pingpong won 8, cooperative 128x256 the
#: large-N ones (bench/results/gemm_mainloop.json, python bench/gemm_mainloop.py).
MAINLOOPS = (("cooperative", 128, 4), ("cooperative", 256, 3), ("pingpong", 128, 6))


def in_kernel(placement: str, backend: str = "lsa", issuer: str = "cta", tile_n: int = 256,
              stages: int = 3, comm_ctas: int = 0, dtype_bytes: int = 2, raster_group: int = 1,
              comm_warps: int = 0, schedule: str = "cooperative") -> Directives:
    """An ``epilogue``/``dedicated_ctas`` point: tile 128 x ``tile_n`` x 64, one tile per flag."""
    return Directives(backend=backend, placement=placement, sync_scope="chunk", issuer=issuer,
                      tile_m=128, tile_n=tile_n, tile_k=64, stages=stages, comm_ctas=comm_ctas,
                      chunk_bytes=128 * tile_n * dtype_bytes, raster_group=raster_group,
                      comm_warps=comm_warps, schedule=schedule)


def pattern_of(problem: GemmProblem) -> TPPattern:
    """The pattern whose templates render ``problem``; :class:`DirectiveError` for a
    workload that is none (a user workload renders under its pattern's problem)."""
    tp = find(problem.workload)
    if tp is None:
        raise DirectiveError([f"workload: {problem.workload} is not a tensor-parallel family "
                              f"({', '.join(TP_NAMES)})"])
    return tp


def local_gemm(problem: GemmProblem) -> LocalGemm:
    """``(rows of C, cols of C, K)`` of the GEMM one rank runs in a fused kernel."""
    return pattern_of(problem).local_gemm(m=problem.m, n=problem.n, k=problem.k,
                                          world_size=problem.world_size)


def fused_tiles(problem: GemmProblem, d: Directives) -> int:
    """Output tiles of one rank's fused GEMM: each rank's block of M/w rows cut into
    ``tile_m``-row tiles (the last one short where they do not divide), N likewise."""
    n = local_gemm(problem).n
    return problem.world_size * -(-placement_rules.row_block(problem) // d.tile_m) * -(-n // d.tile_n)


def supported(problem: GemmProblem, d: Directives) -> list[str]:
    """What the templates cannot render of ``d`` at ``problem`` (empty when they can): no GIN
    or fp32 in-kernel template, CUTLASS's tile shapes, the shared memory and flag slots. Whether
    ``d`` makes sense is :mod:`cuco.design.placement_rules`' to say."""
    if not d.placement.in_kernel:
        return []
    out = []
    p = d.placement.value
    if d.backend.value == "gin":
        out.append(f"backend: placement={p} has lsa and nvshmem templates; gin runs with "
                   "placement=side_stream only")
    if problem.dtype not in CUTLASS_TYPES:
        out.append(f"dtype: placement={p} runs a CUTLASS bf16/fp16 mainloop, not {problem.dtype}")
    if d.schedule is Schedule.COOPERATIVE and d.tile_m not in (128, 256):
        out.append(f"tile_m: placement={p} with schedule=cooperative splits each tile's rows "
                   "between two consumer warpgroups of 64+ rows; choose tile_m 128 or 256 (or "
                   "schedule=pingpong)")
    if d.schedule is Schedule.PINGPONG and d.tile_m not in (64, 128):
        out.append(f"tile_m: placement={p} with schedule=pingpong gives each consumer warpgroup "
                   "whole tiles; choose tile_m 64 or 128")
    smem = smem_bytes(d.tile_m, d.tile_n, d.tile_k, d.stages) + d.tile_m * (d.tile_n + 8) * problem.dtype_bytes
    if smem > SMEM_LIMIT_BYTES - 1024:
        fit = (SMEM_LIMIT_BYTES - 1024 - d.tile_m * (d.tile_n + 8) * problem.dtype_bytes) \
            // smem_bytes(d.tile_m, d.tile_n, d.tile_k, 1)
        out.append(f"stages: placement={p} stages the output tile in shared memory beside the "
                   f"{d.stages} mainloop stages ({smem // 1024} KiB > {SMEM_LIMIT_BYTES // 1024 - 1} KiB); "
                   + (f"set stages={fit}" if fit >= 2 else "choose a smaller tile"))
    if not out and fused_tiles(problem, d) > FLAG_STRIDE // 2 - 1:
        out.append(f"tile_n: {fused_tiles(problem, d)} output tiles exceed the "
                   f"{FLAG_STRIDE // 2 - 1} flag slots; choose larger tiles")
    return out


def fused_context(problem: GemmProblem, d: Directives, *, gemm_only: bool = False) -> dict[str, Any]:
    """What ``tp_fused.cu.j2`` is rendered with for the in-kernel point ``d`` (one that
    :func:`supported` accepts): no shape, which each launch passes (:func:`local_gemm`), so
    every shape of one workload, pattern, dtype and world size renders the same source and
    builds once. ``bench/compile_speed.py`` and ``bench/kernel_identity.py`` render the
    template of an earlier commit with it, to compare builds before and after a change
    (hence ``m``, ``n``, ``k``, which templates before that took)."""
    m, n, k = local_gemm(problem)  # read only by templates before the shape became an argument
    return dict(workload=pattern_of(problem).name, placement=d.placement.value, backend=d.backend.value,
                issuer=d.issuer.value, ctype=CTYPES[problem.dtype], cutlass_type=CUTLASS_TYPES[problem.dtype],
                world=problem.world_size, m=m, n=n, k=k, tile_m=d.tile_m, tile_n=d.tile_n, tile_k=d.tile_k,
                stages=d.stages, raster_group=d.raster_group, comm_warps=d.comm_warps,
                schedule=d.schedule.value, pingpong=d.schedule is Schedule.PINGPONG,
                comm_ctas=d.comm_ctas if d.placement.own_comm_ctas else 0, max_ranks=MAX_RANKS,
                flag_stride=FLAG_STRIDE, name=d.build_point().full_name, gemm_only=gemm_only,
                launch_entry=fused_launch.ENTRY,
                launch_params=fused_launch.c_params(indent=len(f'extern "C" int {fused_launch.ENTRY}(')),
                **LAUNCHER_PARTS)


def side_stream_plan(problem: GemmProblem, d: Directives) -> ChunkPlan:
    """The chunk plan of a ``side_stream`` point, or :class:`DirectiveError` naming what to
    change when its templates cannot take it (too many chunks for the flag slots; a ragged
    plan on the GIN template, whose receive slots assume equal chunks)."""
    plan = ChunkPlan.for_problem(problem, d)
    out = []
    if plan.n_chunks >= FLAG_STRIDE // 2:
        out.append(f"chunk_bytes: {plan.n_chunks} chunks exceed {FLAG_STRIDE // 2 - 1}; "
                   "choose a larger chunk_bytes")
    if plan.ragged and d.backend.value == "gin":
        out.append(f"backend: the gin side-stream kernels cut rows into equal chunks; M={problem.m} "
                   f"needs a ragged plan; choose backend=lsa or nvshmem, or pad M to a multiple "
                   f"of {EQUAL_CHUNKS_M}")
    if out:
        raise DirectiveError(out)
    return plan


def render_tp(problem: GemmProblem, d: Directives, *, gemm_only: bool = False
              ) -> tuple[KernelSource, ChunkPlan | None]:
    """Kernel source and chunk plan (None for in-kernel placements, whose unit is a tile)
    of one fused variant; raises :class:`DirectiveError`.

    ``gemm_only=True`` (in-kernel placements; profiling) renders the same kernel with its
    communication left out: its time is the GEMM's inside the fused kernel, and its output
    is not the workload's."""
    pattern_of(problem)
    d.check(problem)
    bad = placement_rules.in_kernel_violations(d.__dict__, problem) + supported(problem, d)
    if bad:
        raise DirectiveError(bad)
    name = problem.kernel_name(d.full_name)
    if d.placement.in_kernel:
        src = render("tp_fused.cu.j2", **fused_context(problem, d, gemm_only=gemm_only))
        if gemm_only:
            name = PROFILE + name
        needs = ("cutlass", "nccl") if d.backend.value == "lsa" else ("cutlass", "nvshmem")
        return KernelSource(name, src, needs, (fused_launch.ENTRY,)), None
    if gemm_only:
        raise ValueError("gemm_only renders in-kernel placements only")
    return render_side_stream(problem, d)


def render_side_stream(problem: GemmProblem, d: Directives) -> tuple[KernelSource, ChunkPlan]:
    """The side-stream kernels of ``d`` and their chunk plan, for a point the design rules
    accepted (:func:`render_tp` checks them first); :class:`DirectiveError` when the plan
    does not fit the templates."""
    plan = side_stream_plan(problem, d)
    template = "tp_side_stream_gin.cu.j2" if d.backend.value == "gin" else "tp_side_stream.cu.j2"
    src = render(template, workload=plan.pattern.name, backend=d.backend.value,
                 issuer=d.issuer.value, ctype=CTYPES[problem.dtype], plan=plan,
                 comm_ctas=d.comm_ctas, threads=THREADS, max_ranks=MAX_RANKS,
                 flag_stride=FLAG_STRIDE, name=d.full_name)
    needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
    return KernelSource(problem.kernel_name(d.full_name), src, needs,
                        ("comm_kernel", "signal_chunk", "wait_chunk")), plan
