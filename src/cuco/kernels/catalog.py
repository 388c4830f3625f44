"""The kernels the kernel layer renders (collectives, probes, tensor-parallel layers),
which template each source came from, and :func:`compile_report`.

The full catalog, with the workloads' own kernels, is :mod:`cuco.workloads.catalog`
(what ``cuco kernels check`` and CI compile); a template not reachable from it fails
a test.
"""

from __future__ import annotations

from cuco.design.pipeline_ops import find_op
from cuco.kernels import toolchain
from cuco.kernels.collectives import KernelSource, all_sources
from cuco.kernels.compiler import SHIM_DIR, Compiler, performance_losses
from cuco.kernels.render import render


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


def in_kernel_sources() -> list[KernelSource]:
    """The one-kernel placements (CUTLASS mainloop): each workload with epilogue and
    dedicated_ctas, both backends and every issuer among them, at a small shape."""
    from cuco.design import GemmProblem
    from cuco.design.patterns import ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER, TP_PATTERNS
    from cuco.kernels.tp import in_kernel, render_tp

    # (placement, backend, issuer, comm_warps, raster_group, world size, schedule): both
    # epilogue owners (the consumers, spare producer warps), both tile orders, both consumer
    # schedules, and world sizes 4 and 8
    picks = {GEMM_ALLREDUCE: (("epilogue", "lsa", "warp", 3, 4, 4, "cooperative"),
                              ("dedicated_ctas", "nvshmem", "warp", 0, 1, 2, "pingpong")),
             GEMM_REDUCESCATTER: (("epilogue", "nvshmem", "thread", 0, 1, 2, "pingpong"),
                                  ("dedicated_ctas", "lsa", "cta", 1, 4, 2, "cooperative")),
             ALLGATHER_GEMM: (("epilogue", "nvshmem", "cta", 2, 16, 8, "cooperative"),
                              ("dedicated_ctas", "lsa", "thread", 3, 1, 2, "pingpong"))}
    out = []
    for tp in TP_PATTERNS:
        for placement, backend, issuer, warps, group, w, schedule in picks[tp]:
            problem = GemmProblem(workload=tp.name, m=1024 * (1 + (w == 8)), n=1024 * (1 + (w == 8)),
                                  k=1024, world_size=w)
            tile = {"tile_n": 128, "stages": 6} if schedule == "pingpong" else {}
            d = in_kernel(placement, backend, issuer, comm_ctas=4 if placement == "dedicated_ctas" else 0,
                          comm_warps=warps, raster_group=group, schedule=schedule, **tile)
            out.append(render_tp(problem, d)[0])
    # issue #37's mainloops: K in slices (split-K), the epilogue on spare warps and on comm
    # CTAs; 64-row pingpong tiles
    small = dict(m=1024, n=1024, k=2048, world_size=2)
    out.append(render_tp(GemmProblem(workload=GEMM_ALLREDUCE.name, **small),
                         in_kernel("epilogue", "lsa", "warp", tile_n=128, stages=6, schedule="pingpong",
                                   comm_warps=3, raster_group=8, split_k=2))[0])
    out.append(render_tp(GemmProblem(workload=GEMM_REDUCESCATTER.name, **small),
                         in_kernel("dedicated_ctas", "nvshmem", "thread", comm_ctas=4, tile_m=64, tile_n=128,
                                   stages=8, schedule="pingpong", split_k=4))[0])
    # A and B swapped (the tile's rows on wgmma's N, 80 of them), the epilogue on spare warps;
    # and in clusters of 2 along N (A multicast to a pair of n-tiles), on the consumers
    out.append(render_tp(GemmProblem(workload=ALLGATHER_GEMM.name, **small),
                         in_kernel("epilogue", "lsa", "warp", tile_m=80, tile_n=128, stages=6, comm_warps=3,
                                   raster_group=8, swap_ab=True))[0])
    out.append(render_tp(GemmProblem(workload=GEMM_REDUCESCATTER.name, **small),
                         in_kernel("epilogue", "nvshmem", "cta", tile_m=112, tile_n=64, stages=8,
                                   schedule="pingpong", swap_ab=True, cluster_m=2))[0])
    return out


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
