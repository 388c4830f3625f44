"""The emulated GIN's evidence: its points and planted kernels that break GIN's rules.

GIN promises little about when a put lands: only that its signal follows it, and that a
source may be reused after ``flush``. The emulated GIN (``cuco/gin.cuh``: a proxy that
completes puts late and out of order) holds kernels to exactly that, so a kernel relying on
more must be judged wrong there. The points: every TP family's side-stream GIN kernel and the
MoE layer's (dispatch, expert GEMMs, combine over GIN puts), each issuer. Used by
``bench/gin_correctness.py`` and ``tests/test_gin_emulated_gpu.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from cuco.design import Directives, GemmProblem, MoEProblem, Problem
from cuco.design.patterns import TP_PATTERNS
from cuco.design.pipeline_ops import MOE
from cuco.kernels import evolve
from cuco.workloads.base import for_problem

#: Global M x K x N of every TP GIN point (small: W ranks share one GPU).
M, K, N = 1024, 1024, 2048
#: The MoE GIN point's shape: two expert groups at the 256 KiB chunk of :func:`directives`
#: (the evaluator's small shape, one), so rows of one group arrive while the other computes.
MOE_SHAPE = dict(tokens=128, hidden=512, ffn=512, experts=16, topk=4)
ISSUERS = ("thread", "warp", "cta")


def _tp_problem(family: str) -> Callable[[int], Problem]:
    return lambda world_size: GemmProblem(workload=family, m=M, n=N, k=K, world_size=world_size,
                                          has_network=True)


def _moe_problem(world_size: int, **change) -> Problem:
    return MoEProblem(world_size=world_size, has_network=True, **{**MOE_SHAPE, **change})


#: Every workload with a GIN template (every TP pattern, the MoE layer): its problem at W ranks.
PROBLEMS: dict[str, Callable[[int], Problem]] = {**{p.name: _tp_problem(p.name) for p in TP_PATTERNS},
                                                 MOE.name: _moe_problem}
FAMILIES = tuple(PROBLEMS)


def problem(family: str, world_size: int) -> Problem:
    """``family`` with ranks on different hosts, as GIN requires (an emulated world's ranks
    each claim a host of their own)."""
    return PROBLEMS[family](world_size)


def directives(issuer: str) -> Directives:
    return Directives(backend="gin", placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=256 << 10, comm_ctas=8)


def points(world_size: int, issuers=ISSUERS) -> list[tuple[str, Directives]]:
    """(family, directives) of every GIN family and issuer."""
    return [(fam, directives(i)) for fam in FAMILIES for i in issuers]


def source(family: str, world_size: int, d: Directives) -> str:
    """The GIN kernel of ``family`` at its point, as the evaluator renders it."""
    return for_problem(problem(family, world_size)).render(d).source


def _bodies(family: str, world_size: int, block: str,
            *needles: str) -> tuple[Problem, Directives, str, dict[str, str]]:
    """The point a plant edits (issuer cta) and its blocks, checked to hold ``needles`` in
    ``block`` (where the plant cuts: a template change breaks it loudly instead of making it
    "caught" for nothing)."""
    p, d = problem(family, world_size), directives("cta")
    src = source(family, world_size, d)
    bodies = evolve.blocks(src)
    assert all(n in bodies[block] for n in needles), f"the GIN {family} template changed: update the plants"
    return p, d, src, bodies


def reuses_source_before_flush(world_size: int) -> tuple[Problem, Directives, str]:
    """After putting its slices of a chunk, the CTA reuses those source bytes as scratch at
    once (it writes 1.0 over them) instead of after ``flush``. With puts that copy on issue it
    would be right; GIN may read a source any time before the flush."""
    p, d, src, bodies = _bodies("gemm_allreduce", world_size, "chunk_send", "gin.put(")
    assert "reduce_rx(" in bodies["chunk_reduce"], "the GIN AllReduce template changed: update the plants"
    reuse = (
        "    __syncthreads();\n"
        "    for (int s = 0; s < W; ++s)\n"
        "      if (s != me)\n"
        "        for (size_t i = threadIdx.x; i < slice / 16; i += blockDim.x)\n"
        "          cuco::store16(a.local(p_off + (size_t)c * kChunkBytes + (size_t)s * slice) + i * 16,\n"
        "                        make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u));\n")
    return p, d, evolve.splice(src, {"chunk_send": bodies["chunk_send"] + reuse})


def reads_before_its_signal(world_size: int) -> tuple[Problem, Directives, str]:
    """Reduces a chunk's received slices right after sending its own, in the send block,
    before the signal that says they landed (the reduce block then only sends the sums)."""
    p, d, src, bodies = _bodies("gemm_allreduce", world_size, "chunk_reduce", "reduce_rx(")
    reduce_loop, sends = bodies["chunk_reduce"].split("    __syncthreads();\n", 1)
    early = ("    __syncthreads();\n    {\n      const size_t mine = (size_t)c * kChunkBytes + (size_t)me * slice;\n"
             + reduce_loop + "    }\n")
    return p, d, evolve.splice(src, {"chunk_send": bodies["chunk_send"] + early,
                                     "chunk_reduce": "    __syncthreads();\n" + sends})


def moe_reuses_staged_rows_before_flush(world_size: int) -> tuple[Problem, Directives, str]:
    """MoE dispatch: right after putting a block of token rows it staged, the CTA writes 1.0
    over the staged rows (as if reusing them for the next block) instead of after
    ``flush``: the owner receives whatever the source holds when the put reads it."""
    p, d, src, bodies = _bodies(MOE.name, world_size, "dispatch_block", "gather_rows(", "gin.put(")
    reuse = ("      __syncthreads();\n"
             "      for (size_t k = threadIdx.x; k < (size_t)n * kRowUnits; k += blockDim.x)\n"
             "        cuco::store16(a.local(staged) + k * 16,\n"
             "                      make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u));\n")
    return p, d, evolve.splice(src, {"dispatch_block": bodies["dispatch_block"] + reuse})


def moe_reads_outputs_before_their_signal(world_size: int) -> tuple[Problem, Directives, str]:
    """MoE combine: sums the expert outputs its peers put back before waiting for the signal
    that says they landed (the wait still follows, so every signal stays counted)."""
    p, d, src, bodies = _bodies(MOE.name, world_size, "combine", "waitSignalMeetShadow(", "weighted_sum(")
    wait, loop = bodies["combine"].split("\n", 1)
    return p, d, evolve.splice(src, {"combine": loop + wait + "\n"})


#: Each plant: ``make(world_size) -> (problem, directives, source)``; its problem names the
#: family it belongs to.
PLANTS = {"reuses_source_before_flush": reuses_source_before_flush,
          "reads_before_its_signal": reads_before_its_signal,
          "moe_reuses_staged_rows_before_flush": moe_reuses_staged_rows_before_flush,
          "moe_reads_outputs_before_their_signal": moe_reads_outputs_before_their_signal}
