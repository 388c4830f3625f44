"""Every kernel cuco ships, rendered: what ``cuco kernels check`` and CI compile.

A template that is not reachable from :func:`everything` fails a test, so no
template can ship without being compile-checked.
"""

from __future__ import annotations

from cuco.kernels import toolchain
from cuco.kernels.collectives import KernelSource, all_sources
from cuco.kernels.compiler import SHIM_DIR, Compiler
from cuco.kernels.render import render


def probe_source() -> KernelSource:
    return KernelSource("probes", render("probes.cu.j2"), (), ("noop", "spin_forever",
                                                              "illegal_address"))


def tp_sources() -> list[KernelSource]:
    """One side-stream variant per workload, backend and issuer, at a small shape (GIN
    on a problem whose ranks span hosts, as GIN requires)."""
    from cuco.design import Directives, Problem
    from cuco.kernels.tp import TP_FAMILIES, render_tp

    out = []
    for fam in TP_FAMILIES:
        for backend in ("lsa", "nvshmem", "gin"):
            problem = Problem(workload=fam, m=1024, n=1024, k=1024, world_size=2,
                              has_network=backend == "gin")
            for issuer in ("thread", "warp", "cta"):
                d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                               issuer=issuer, chunk_bytes=256 << 10, comm_ctas=8)
                out.append(render_tp(problem, d)[0])
    return out


def in_kernel_sources() -> list[KernelSource]:
    """The one-kernel placements (CUTLASS mainloop): each workload with epilogue and
    dedicated_ctas, both backends and every issuer among them, at a small shape."""
    from cuco.design import Problem
    from cuco.kernels.tp import TP_FAMILIES, in_kernel, render_tp

    # (placement, backend, issuer, comm_warps, raster_group, world size): both epilogue owners
    # (the consumers, spare producer warps), both tile orders, and world sizes 4 and 8
    picks = {"gemm_allreduce": (("epilogue", "lsa", "warp", 3, 4, 4), ("dedicated_ctas", "nvshmem", "warp", 0, 1, 2)),
             "gemm_reducescatter": (("epilogue", "nvshmem", "thread", 0, 1, 2), ("dedicated_ctas", "lsa", "cta", 1, 4, 2)),
             "allgather_gemm": (("epilogue", "nvshmem", "cta", 2, 16, 8), ("dedicated_ctas", "lsa", "thread", 3, 1, 2))}
    out = []
    for fam in TP_FAMILIES:
        for placement, backend, issuer, warps, group, w in picks[fam]:
            problem = Problem(workload=fam, m=1024 * (1 + (w == 8)), n=1024 * (1 + (w == 8)), k=1024,
                              world_size=w)
            d = in_kernel(placement, backend, issuer, comm_ctas=4 if placement == "dedicated_ctas" else 0,
                          comm_warps=warps, raster_group=group)
            out.append(render_tp(problem, d)[0])
    return out


def pipeline_sources() -> list[KernelSource]:
    """KV transfer, MoE and context-parallel attention: every backend and issuer at a
    small shape."""
    from cuco.design import Directives
    from cuco.workloads.cp_attention import CPAttention
    from cuco.workloads.kv_transfer import KVTransfer
    from cuco.workloads.moe import MoE

    workloads = (KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256),
                 MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2),
                 CPAttention(2, seq=1024, heads=4, head_dim=128, causal=True))
    out = []
    for wl in workloads:
        for backend in ("lsa", "nvshmem"):
            for issuer in ("thread", "warp", "cta"):
                d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                               issuer=issuer, chunk_bytes=64 << 10, comm_ctas=4)
                out.append(wl.render(d))
    return out


def everything() -> list[KernelSource]:
    return [*all_sources(), probe_source(), *tp_sources(), *in_kernel_sources(), *pipeline_sources()]


def template_of(source: KernelSource) -> str:
    """Template file a source was rendered from (by naming convention)."""
    if source.name.startswith("lsa_collectives"):
        return "collectives_lsa.cu.j2"
    if source.name.startswith("nvshmem_collectives"):
        return "collectives_nvshmem.cu.j2"
    if "gin.side_stream" in source.name:
        return "tp_side_stream_gin.cu.j2"
    for family in ("kv_transfer", "moe", "cp_attention"):
        if source.name.startswith(family + "."):
            return f"{family}.cu.j2"
    if ".epilogue." in source.name or ".dedicated_ctas." in source.name:
        return "tp_fused.cu.j2"
    if "side_stream" in source.name:
        return "tp_side_stream.cu.j2"
    return f"{source.name}.cu.j2"


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


SHIMS = {"nccl_devcomm": ("nccl", "libnccl.so.2"), "nvshmem_host": ("nvshmem", "libnvshmem_host.so.3")}


def compile_report(sources: list[KernelSource], arch: str = "sm_90a",
                   shims: tuple[str, ...] = tuple(SHIMS), compiler: Compiler | None = None,
                   on_done=None) -> dict[str, str]:
    """Compile ``sources`` and the named host shims on all cores; ``{name: 'ok' | error
    summary}``; ``on_done(name, ok)`` after each kernel (progress). NCCL's headers and
    library come from one installation (:func:`toolchain.nccl`)."""
    comp = compiler or Compiler(arch=arch)
    report: dict[str, str] = {}
    done = None if on_done is None else (lambda name, r: on_done(name, hasattr(r, "path")))
    for s, r in zip(sources, comp.compile_many([(s.name, s.source, s.needs) for s in sources], on_done=done)):
        report[s.name] = "ok" if hasattr(r, "path") else str(r)
    for shim in shims:
        need, lib_name = SHIMS[shim]
        try:
            lib = getattr(toolchain, need)()
            comp.build_shared((SHIM_DIR / f"{shim}.cu").read_text(), name=shim, needs=(need,),
                              link=[f"-L{lib.lib}", f"-l:{lib_name}"])
            report[f"shim:{shim}"] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            report[f"shim:{shim}"] = str(exc)
        if on_done is not None:
            on_done(f"shim:{shim}", report[f"shim:{shim}"] == "ok")
    return report


def compile_everything(arch: str = "sm_90a", *, sources: list[KernelSource] | None = None,
                       on_done=None) -> dict[str, str]:
    """Compile every kernel (or ``sources``) and both host shims; ``{name: 'ok' | error summary}``."""
    return compile_report(everything() if sources is None else sources, arch, on_done=on_done)


def catalog_size(sources: list[KernelSource] | None = None) -> int:
    """How many items :func:`compile_everything` builds (kernels and the two shims)."""
    return len(everything() if sources is None else sources) + len(SHIMS)
