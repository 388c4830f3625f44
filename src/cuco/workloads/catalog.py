"""Every kernel cuco ships, rendered: what ``cuco kernels check`` and CI compile.

The kernel layer's own sources (:func:`cuco.kernels.catalog.kernel_sources`) and the
pipeline workloads' kernels, which only the workloads can render. A template that is
not reachable from :func:`everything` fails a test, so no template can ship without
being compile-checked.
"""

from __future__ import annotations

from cuco.design import Backend, Directives
from cuco.kernels.catalog import SHIMS, compile_report, kernel_sources, template_of
from cuco.kernels.collectives import KernelSource
from cuco.workloads.cp import CPAttention
from cuco.workloads.kv import KVTransfer, layer_kernel_source
from cuco.workloads.moe import MoE
from cuco.workloads.moe.grouped_gemm import DECODE_CONFIG, PREFILL_CONFIG, config_source


def pipeline_sources() -> list[KernelSource]:
    """KV transfer, MoE and context-parallel attention: every backend each has and every
    issuer, at a small shape (GIN on a problem whose ranks span hosts, as GIN requires)."""
    cp = CPAttention(2, seq=1024, heads=4, head_dim=128, causal=True)
    workloads = (KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256),
                 MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2), cp)
    out = []
    for wl in workloads:
        for backend in wl.backends:
            at = wl.at(wl.problem.model_copy(update={"has_network": True})) if backend is Backend.GIN else wl
            for issuer in ("thread", "warp", "cta"):
                d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                               issuer=issuer, chunk_bytes=64 << 10, comm_ctas=4)
                out.append(at.render(d))
    for backend in cp.backends:  # the library cores' fused call: comm kernel, wait, merge
        out.append(cp.render(Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                        issuer="warp", chunk_bytes=64 << 10, comm_ctas=4,
                                        core="cudnn")))
    cp4 = CPAttention(4, seq=2048, heads=4, head_dim=128, causal=True)  # grouped: 3+ ranks
    for backend in cp4.backends:  # the grouped calls' fused call: the grouped receive layout
        out.append(cp4.render(Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                         issuer="warp", chunk_bytes=64 << 10, comm_ctas=4,
                                         core="cudnn", peer_calls="grouped")))
    # the MoE layer's expert GEMMs: one build per row regime's configuration, any shape
    out.extend(config_source(c) for c in (DECODE_CONFIG, PREFILL_CONFIG))
    out.append(layer_kernel_source())  # the KV prefill's RMSNorm, causal softmax, SwiGLU
    out.append(cp.core_kernel_source())  # the attention kernel the CP host programs run
    out.append(cp.merge_kernel_source())  # the library cores' merge alone (the kernel benchmark's)
    return out


def everything() -> list[KernelSource]:
    """Every kernel cuco ships, at small shapes."""
    return [*kernel_sources(), *pipeline_sources()]


def nccl_sources(*, cutlass: bool = False) -> list[KernelSource]:
    """Every rendered source that includes the NCCL device API (LSA and GIN); the
    CUTLASS-based in-kernel ones only with ``cutlass=True`` (slow to build)."""
    return [s for s in everything() if "nccl" in s.needs and (cutlass or "cutlass" not in s.needs)]


def representative() -> list[KernelSource]:
    """A subset of :func:`everything` that still compiles every template and both kernel
    kinds (cubin and CUTLASS launcher): one source per template (for the one-kernel
    template, the epilogue placement with spare comm warps). The default test run compiles
    this; CI's second step (``cuco kernels check``) compiles everything."""
    picked: dict[str, KernelSource] = {}
    for s in everything():
        picked.setdefault(template_of(s), s)
    return list(picked.values())


def compile_everything(arch: str = "sm_90a", *, sources: list[KernelSource] | None = None,
                       on_done=None) -> dict[str, str]:
    """Compile every kernel (or ``sources``) and both host shims on all cores;
    ``{name: 'ok' | error summary}``; ``on_done(name, ok)`` after each (progress)."""
    return compile_report(everything() if sources is None else sources, arch, on_done=on_done)


def catalog_size(sources: list[KernelSource] | None = None) -> int:
    """How many items :func:`compile_everything` builds (kernels and the host shims)."""
    return len(everything() if sources is None else sources) + len(SHIMS)
