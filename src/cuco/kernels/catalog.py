"""The kernels the kernel layer renders (collectives, probes, tensor-parallel layers),
which template each source came from, and :func:`compile_report`.

The full catalog, with the workloads' own kernels, is :mod:`cuco.workloads.catalog`
(what ``cuco kernels check`` and CI compile); a template not reachable from it fails
a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuco.design.pipeline_ops import find_op
from cuco.kernels import toolchain
from cuco.kernels.collectives import KernelSource, all_sources
from cuco.kernels.compiler import SHIM_DIR, Compiler, performance_losses
from cuco.kernels.render import render

if TYPE_CHECKING:
    from cuco.design import Directives, GemmProblem


def probe_source() -> KernelSource:
    return KernelSource("probes", render("probes.cu.j2"), (), ("noop", "spin_forever",
                                                              "illegal_address"))


def tp_sources() -> list[KernelSource]:
    """One side-stream variant per workload, backend and issuer, at a small shape (GIN
    on a problem whose ranks span hosts, as GIN requires)."""
    from cuco.design import Directives, GemmProblem
    from cuco.design.patterns import TP_PATTERNS
    from cuco.kernels.tp import render_tp

    out = []
    for tp in TP_PATTERNS:
        for backend in ("lsa", "nvshmem", "gin"):
            problem = GemmProblem(workload=tp.name, m=1024, n=1024, k=1024, world_size=2,
                                  has_network=backend == "gin")
            for issuer in ("thread", "warp", "cta"):
                d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                               issuer=issuer, chunk_bytes=256 << 10, comm_ctas=8)
                out.append(render_tp(problem, d)[0])
    return out


# A fused in-kernel point the catalog compiles: what it stands for, the problem, the
# directives. Kernel sources carry no shape and the kernel cache is keyed on the
# source, so a point the slow tests build too (they take their fused points from here) costs
# CI one build, not two.


def _tp_problems() -> dict:
    """The three tensor-parallel patterns at one small ragged shape on two ranks."""
    from cuco.design import GemmProblem
    from cuco.design.patterns import TP_PATTERNS
    return {tp.name: GemmProblem(workload=tp.name, m=1000, n=1040, k=1040, world_size=2)
            for tp in TP_PATTERNS}


def cluster_points() -> list[tuple[str, GemmProblem, Directives]]:
    """Each 2x1 cluster mainloop fused with one epilogue path (the consumers, three spare comm
    warps, dedicated CTAs beside one comm warp), one pattern each, both backends and every
    issuer among them (tests/test_gemm_clusters_cpu.py builds them in both build paths)."""
    from cuco.kernels.tp import in_kernel
    p = _tp_problems()
    return [("pingpong reduce-scatter", p["gemm_reducescatter"],
             in_kernel("epilogue", "nvshmem", "thread", tile_n=128, stages=6, schedule="pingpong", cluster_m=2)),
            ("all-reduce, comm warps", p["gemm_allreduce"],
             in_kernel("epilogue", "lsa", "warp", comm_warps=3, cluster_m=2)),
            ("all-gather, dedicated CTAs", p["allgather_gemm"],
             in_kernel("dedicated_ctas", "lsa", "thread", comm_ctas=4, tile_n=128, stages=4, comm_warps=1,
                       cluster_m=2))]


def wave_points() -> list[tuple[str, GemmProblem, Directives]]:
    """Each wave tile (192 or 64 columns) fused with one epilogue path; all-gather at eight
    ranks, a dedicated all-reduce (tests/test_gemm_wave_tiles_cpu.py builds them in both
    build paths)."""
    from cuco.design import GemmProblem
    from cuco.kernels.tp import in_kernel
    p = _tp_problems()
    return [("128x192 reduce-scatter", p["gemm_reducescatter"],
             in_kernel("epilogue", "lsa", "cta", tile_n=192, stages=4)),
            ("64x64 all-gather at eight ranks, comm warps",
             GemmProblem(workload="allgather_gemm", m=2048, n=2048, k=1024, world_size=8),
             in_kernel("epilogue", "nvshmem", "warp", tile_m=64, tile_n=64, stages=8, schedule="pingpong",
                       comm_warps=3)),
            ("64x192 all-reduce, dedicated CTAs", p["gemm_allreduce"],
             in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=4, tile_m=64, tile_n=192, stages=6,
                       schedule="pingpong"))]


def split_k_points() -> list[tuple[str, GemmProblem, Directives]]:
    """K in slices, the fold before the epilogue: three slices under dedicated CTAs with comm
    warps (tests/test_gemm_mainloop_cpu.py's new values build it; they build split K under
    the epilogue with comm warps too, in the GEMM bench's gemm_only build)."""
    from cuco.design import GemmProblem
    from cuco.kernels.tp import in_kernel
    small = dict(m=1024, n=1024, k=2048, world_size=2)
    return [("split-K cooperative, dedicated CTAs, reduce-scatter",
             GemmProblem(workload="gemm_reducescatter", **small),
             in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, comm_warps=2, split_k=3))]


def swapped_points() -> list[tuple[str, GemmProblem, Directives]]:
    """A and B swapped (the tile's rows on wgmma's N, 80 of them), the epilogue on spare warps;
    and in clusters of 2 along N (A multicast to a pair of n-tiles), on the consumers."""
    from cuco.design import GemmProblem
    from cuco.kernels.tp import in_kernel
    small = dict(m=1024, n=1024, k=2048, world_size=2)
    return [("swapped 80x128 all-gather, comm warps", GemmProblem(workload="allgather_gemm", **small),
             in_kernel("epilogue", "lsa", "warp", tile_m=80, tile_n=128, stages=6, comm_warps=3, swap_ab=True)),
            ("swapped 112x64 reduce-scatter in clusters along N", GemmProblem(workload="gemm_reducescatter", **small),
             in_kernel("epilogue", "nvshmem", "cta", tile_m=112, tile_n=64, stages=8, schedule="pingpong",
                       swap_ab=True, cluster_m=2))]


def in_kernel_sources() -> list[KernelSource]:
    """The one-kernel placements (CUTLASS mainloop), at small shapes: every pattern with
    epilogue and dedicated_ctas, both backends and every issuer among them, both consumer
    schedules, both epilogue owners, world sizes 2, 4 and 8, and issue #37's mainloops (split
    K, 64-row and wave tiles, clusters, A and B swapped). The first (the all-reduce at four
    ranks, comm warps on the epilogue) is the template's representative; the rest are the
    points of :func:`cluster_points`, :func:`wave_points`, :func:`split_k_points` and
    :func:`swapped_points`."""
    from cuco.design import GemmProblem
    from cuco.kernels.tp import in_kernel, render_tp
    first = (GemmProblem(workload="gemm_allreduce", m=1024, n=1024, k=1024, world_size=4),
             in_kernel("epilogue", "lsa", "warp", comm_warps=3))
    points = [first, *((p, d) for _, p, d in
                       [*cluster_points(), *wave_points(), *split_k_points(), *swapped_points()])]
    return [render_tp(p, d)[0] for p, d in points]


def kernel_sources() -> list[KernelSource]:
    """The kernels this layer renders on its own: collectives, probes, the tensor-parallel
    layers (side stream and in-kernel). The workloads' own kernels join them in
    :func:`cuco.workloads.catalog.everything`."""
    return [*all_sources(), probe_source(), *tp_sources(), *in_kernel_sources()]


def template_of(source: KernelSource) -> str:
    """Template file a source was rendered from (by naming convention)."""
    if source.name.startswith("lsa_collectives"):
        return "collectives_lsa.cu.j2"
    if source.name.startswith("nvshmem_collectives"):
        return "collectives_nvshmem.cu.j2"
    op = find_op(source.name.split(".", 1)[0])  # a pipeline op's sources start with its label
    if op is not None and "." in source.name:
        return op.template_for("gin" if ".gin.side_stream." in source.name else "lsa")
    if "gin.side_stream" in source.name:
        return "tp_side_stream_gin.cu.j2"
    if ".epilogue." in source.name or ".dedicated_ctas." in source.name:
        return "tp_fused.cu.j2"
    if "side_stream" in source.name:
        return "tp_side_stream.cu.j2"
    return f"{source.name.split('.', 1)[0]}.cu.j2"  # a configuration's build: template.config


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
    # the CUTLASS builds (minutes each on a small machine) start first, so that the last build
    # to start is a short one and no core idles while one long build ends alone; the report
    # keeps the catalog's order
    order = sorted(range(len(sources)), key=lambda i: "cutlass" not in sources[i].needs)  # stable
    results = comp.compile_many([(sources[i].name, sources[i].source, sources[i].needs) for i in order],
                                on_done=done)
    built = dict(zip(order, results))
    for i, s in enumerate(sources):
        r = built[i]
        if not hasattr(r, "path"):  # a CompileError
            report[s.name] = str(r)
        else:
            losses = performance_losses(r.log)
            report[s.name] = f"slow: ptxas: {losses[0]}" if losses else "ok"
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
