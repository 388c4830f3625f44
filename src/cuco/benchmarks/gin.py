"""The emulated GIN's evidence: its points and two planted kernels that break GIN's rules.

GIN promises little about when a put lands: only that its signal follows it, and that a
source may be reused after ``flush``. The emulated GIN (``cuco/gin.cuh``: a proxy that
completes puts late and out of order) holds kernels to exactly that, so a kernel relying on
more must be judged wrong there. Used by ``bench/gin_correctness.py`` and
``tests/test_gin_emulated_gpu.py``.
"""

from __future__ import annotations

from cuco.design import Directives, GemmProblem
from cuco.design.patterns import TP_PATTERNS
from cuco.kernels import evolve
from cuco.kernels.tp import render_tp

#: Global M x K x N of every GIN point (small: W ranks share one GPU).
M, K, N = 1024, 1024, 2048
ISSUERS = ("thread", "warp", "cta")
#: Every TP pattern has a GIN side-stream template.
FAMILIES = tuple(p.name for p in TP_PATTERNS)


def problem(family: str, world_size: int) -> GemmProblem:
    """``family`` with ranks on different hosts, as GIN requires (an emulated world's ranks
    each claim a host of their own)."""
    return GemmProblem(workload=family, m=M, n=N, k=K, world_size=world_size, has_network=True)


def directives(issuer: str) -> Directives:
    return Directives(backend="gin", placement="side_stream", sync_scope="chunk", issuer=issuer,
                      chunk_bytes=256 << 10, comm_ctas=8)


def points(world_size: int, issuers=ISSUERS) -> list[tuple[str, Directives]]:
    """(family, directives) of every TP family and issuer."""
    return [(fam, directives(i)) for fam in FAMILIES for i in issuers]


def _allreduce_source(world_size: int) -> tuple[GemmProblem, Directives, str, dict[str, str]]:
    p, d = problem("gemm_allreduce", world_size), directives("cta")
    src = render_tp(p, d)[0].source
    bodies = evolve.blocks(src)
    # where the plants cut (asserted, so a template change breaks them loudly instead of
    # making them "caught" for nothing)
    assert "gin.put(" in bodies["chunk_send"] and "reduce_rx(" in bodies["chunk_reduce"], \
        "the GIN AllReduce template changed: update the plants"
    return p, d, src, bodies


def reuses_source_before_flush(world_size: int) -> tuple[GemmProblem, Directives, str]:
    """After putting its slices of a chunk, the CTA reuses those source bytes as scratch at
    once (it writes 1.0 over them) instead of after ``flush``. With puts that copy on issue it
    would be right; GIN may read a source any time before the flush."""
    p, d, src, bodies = _allreduce_source(world_size)
    reuse = (
        "    __syncthreads();\n"
        "    for (int s = 0; s < W; ++s)\n"
        "      if (s != me)\n"
        "        for (size_t i = threadIdx.x; i < slice / 16; i += blockDim.x)\n"
        "          cuco::store16(a.local(p_off + (size_t)c * kChunkBytes + (size_t)s * slice) + i * 16,\n"
        "                        make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u));\n")
    return p, d, evolve.splice(src, {"chunk_send": bodies["chunk_send"] + reuse})


def reads_before_its_signal(world_size: int) -> tuple[GemmProblem, Directives, str]:
    """Reduces a chunk's received slices right after sending its own, in the send block,
    before the signal that says they landed (the reduce block then only sends the sums)."""
    p, d, src, bodies = _allreduce_source(world_size)
    reduce_loop, sends = bodies["chunk_reduce"].split("    __syncthreads();\n", 1)
    early = ("    __syncthreads();\n    {\n      const size_t mine = (size_t)c * kChunkBytes + (size_t)me * slice;\n"
             + reduce_loop + "    }\n")
    return p, d, evolve.splice(src, {"chunk_send": bodies["chunk_send"] + early,
                                     "chunk_reduce": "    __syncthreads();\n" + sends})


PLANTS = {"reuses_source_before_flush": reuses_source_before_flush,
          "reads_before_its_signal": reads_before_its_signal}
