"""Render fused kernels for the tensor-parallel workloads from :class:`Directives`.

Only ``placement=side_stream`` has a template so far (vendor GEMM per chunk on
one stream, a persistent communication kernel on another): LSA and NVSHMEM in
``tp_side_stream.cu.j2``, GIN (put-only, for ranks on different hosts) in
``tp_side_stream_gin.cu.j2``. Other placements are refused with a message.
"""

from __future__ import annotations

from cuco.design import Directives, Problem
from cuco.design.tiles import ChunkPlan
from cuco.errors import DirectiveError
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels.render import CTYPES, render

THREADS = 512
#: Flag slots per source rank (the most chunks a plan may have).
FLAG_STRIDE = 4096
TP_FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")


def supported(d: Directives) -> list[str]:
    """Why ``d`` has no template yet (empty when it has one)."""
    out = []
    if d.placement.value != "side_stream":
        out.append(f"placement: only placement=side_stream has a fused template for the "
                   f"tensor-parallel workloads so far, not {d.placement.value}")
    return out


def render_tp(problem: Problem, d: Directives) -> tuple[KernelSource, ChunkPlan]:
    """Kernel source and chunk plan of one fused variant; raises :class:`DirectiveError`."""
    if problem.workload not in TP_FAMILIES:
        raise DirectiveError([f"workload: {problem.workload} is not a tensor-parallel family "
                              f"({', '.join(TP_FAMILIES)})"])
    d.check(problem)
    bad = supported(d)
    if bad:
        raise DirectiveError(bad)
    plan = ChunkPlan.for_problem(problem, d)
    if plan.n_chunks > FLAG_STRIDE:
        raise DirectiveError([f"chunk_bytes: {plan.n_chunks} chunks exceed {FLAG_STRIDE}; "
                              "choose a larger chunk_bytes"])
    template = "tp_side_stream_gin.cu.j2" if d.backend.value == "gin" else "tp_side_stream.cu.j2"
    src = render(template, workload=problem.workload, backend=d.backend.value,
                 issuer=d.issuer.value, ctype=CTYPES[problem.dtype], plan=plan,
                 comm_ctas=d.comm_ctas, threads=THREADS, max_ranks=MAX_RANKS,
                 flag_stride=FLAG_STRIDE, name=d.full_name)
    needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
    name = f"{problem.workload}.{d.full_name}.M{problem.m}N{problem.n}K{problem.k}w{problem.world_size}"
    return KernelSource(name, src, needs, ("comm_kernel", "signal_chunk", "wait_chunk")), plan

