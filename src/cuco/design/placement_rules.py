"""Where communication runs (``placement``): every rule a placement sets on the other
directives and on the problem, in one place. Templates (:mod:`cuco.kernels.tp`) refuse only
what they cannot render; whether a combination makes sense is said here.

Each violation is a sentence naming the dimension and a fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuco.design.dimensions import Placement, format_bytes
from cuco.design.patterns import find
from cuco.design.problem import ROW_BYTES, GemmProblem

#: The placements' names, ``side_stream`` (takes every workload and shape) first, then the
#: in-kernel ones in :class:`Placement`'s order: the default of every search and help text.
PLACEMENTS: tuple[str, ...] = tuple(p.value for p in sorted(Placement, key=lambda p: p.in_kernel))
#: Rows of an output tile of the in-kernel mainloop: wgmma's M, so 64 (pingpong, one
#: warpgroup's rows), 128 or 256.
TILE_M = (64, 128, 256)
#: Rows of an output tile with A and B swapped (``swap_ab``): wgmma's N, any multiple of 16
#: from 32 to 256 (a tile fitted to few or ragged rows, or to whole waves of tiles). wgmma
#: takes any multiple of 8, but CUTLASS 4.2's mainloop slices one stage of the 128-byte-swizzled
#: operand for its TMA (CollectiveMma::Params), and CuTe's composition needs that stage's
#: rows x 64 elements to be a multiple of the swizzle's 1024: 72 and 104 rows fail its "Stride
#: Divisibility Condition" (nvcc, 72x128 swapped, this tree at 3b56751; 48, 80, 112, 144, 160
#: build). So cuco cannot build cuBLASLt's 72- and 104-row picks at 200x4096x4096 (the rows of
#: bench/results/gemm_mainloop.json say so).
SWAPPED_TILE_M = tuple(range(32, 257, 16))
#: Communication CTAs ``dedicated_ctas`` may reserve, so that most SMs run the GEMM.
MAX_DEDICATED_CTAS = 32
#: Directives an in-kernel kernel takes per launch, not per build (with the GEMM's shape):
#: points that differ only in these share one build.
IN_KERNEL_LAUNCH_TIME = ("raster_group",)
#: What a tensor-parallel side-stream kernel takes per launch (with the shape): its chunk plan
#: (``cuco::ChunkGeom``), hence the chunk size. (The MoE, KV and CP side-stream templates
#: still compile their chunks in; nothing asks for their build point.)
SIDE_STREAM_LAUNCH_TIME = ("chunk_bytes",)


def launch_time_fields(placement: Placement) -> tuple[str, ...]:
    """The directives a kernel of ``placement`` reads from its launch arguments, so that a
    sweep over them reuses one build (:meth:`cuco.design.Directives.build_point`)."""
    return IN_KERNEL_LAUNCH_TIME if placement.in_kernel else SIDE_STREAM_LAUNCH_TIME


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def violations(d: Mapping[str, Any]) -> list[str]:
    """Every rule of its placement that ``d`` breaks, whatever the problem (part of
    :func:`cuco.design.rules.violations`, which every point passes), ``cluster_m``'s among
    them (:func:`cluster_violations`)."""
    out: list[str] = []
    placement, sync, comm_ctas = _v(d["placement"]), _v(d["sync_scope"]), d["comm_ctas"]
    where = Placement(placement)
    if where.own_comm_ctas and comm_ctas < 1:
        out.append(
            f"comm_ctas: placement={placement} runs communication on CTAs of its own; "
            "set comm_ctas >= 1 (e.g. 8)"
        )
    if not where.own_comm_ctas and comm_ctas != 0:
        out.append(
            f"comm_ctas: comm_ctas={comm_ctas} does not apply to placement=epilogue (the "
            "compute CTAs communicate); set comm_ctas=0 or another placement"
        )
    if placement == "side_stream" and sync not in ("chunk", "stream"):
        out.append(
            f"sync_scope: placement=side_stream is driven by per-chunk flags, not "
            f"sync_scope={sync}; set sync_scope=chunk"
        )
    if not where.in_kernel and d.get("raster_group", 1) != 1:
        out.append(
            "raster_group: placement=side_stream runs a vendor GEMM per chunk; raster_group "
            "orders the tiles of the in-kernel placements only; set raster_group=1"
        )
    if not where.in_kernel and d.get("comm_warps", 0):
        out.append(
            "comm_warps: placement=side_stream moves chunks from a kernel of its own; comm_warps "
            "hands the tiles of the in-kernel placements to spare warps only; set comm_warps=0"
        )
    if not where.in_kernel and _v(d.get("schedule", "cooperative")) == "pingpong":
        out.append(
            "schedule: placement=side_stream runs a vendor GEMM per chunk; schedule=pingpong "
            "applies to the in-kernel placements' mainloop only; set schedule=cooperative"
        )
    if not where.in_kernel and d.get("split_k", 1) != 1:
        out.append(
            "split_k: placement=side_stream runs a vendor GEMM per chunk; split_k cuts the K "
            "loop of the in-kernel placements' mainloop only; set split_k=1"
        )
    return out + cluster_violations(d) + swap_violations(d)


def power_of_two_or_thrice(v: int) -> bool:
    """Whether ``v`` bytes are a power of two or three times one: side_stream's chunk sizes,
    and every unswapped in-kernel tile's (a 192-column tile is 3 x 2^k bytes)."""
    return v > 0 and (v & (v - 1) == 0 or (v % 3 == 0 and (v // 3) & (v // 3 - 1) == 0))


def swap_violations(d: Mapping[str, Any]) -> list[str]:
    """The rules of ``swap_ab`` (part of :func:`violations`): it swaps the operands of the
    in-kernel mainloop, whose tile rows are wgmma's M without it (64, 128 or 256) and its N
    with it (any multiple of 16); side_stream's chunks run a vendor GEMM, whose tiles and
    chunk sizes are its own (a power of two, or three times one)."""
    swap, placement, tm = d.get("swap_ab", False), _v(d["placement"]), d["tile_m"]
    if not Placement(placement).in_kernel:
        out = []
        if swap:
            out.append("swap_ab: placement=side_stream runs a vendor GEMM per chunk; swap_ab swaps "
                       "the operands of the in-kernel placements' mainloop only; set swap_ab=false")
        chunk = d["chunk_bytes"]
        if not power_of_two_or_thrice(chunk):
            out.append(f"chunk_bytes: placement=side_stream cuts chunks of a power of two bytes, or "
                       f"three times one; chunk_bytes={chunk} is neither (e.g. "
                       f"{1 << (chunk.bit_length() - 1)})")
        return out
    if not swap and tm not in TILE_M:
        return [f"tile_m: {tm} rows are wgmma's M without swap_ab, which takes 64, 128 or 256; "
                f"set swap_ab=true (the tile's rows on wgmma's N, any multiple of 16) or tile_m 64, "
                "128 or 256"]
    return []


def cluster_violations(d: Mapping[str, Any]) -> list[str]:
    """The rules of ``cluster_m`` (part of :func:`violations`): a cluster of 2 CTAs runs the
    in-kernel mainloop's pairs of m-tiles in lock-step (the B tile multicast to both), so it
    needs a placement with that mainloop, units that are whole tiles (split-K's slices of
    one tile are not paired), and, under ``dedicated_ctas``, an even number of communication
    CTAs (clusters are consecutive CTAs: the compute CTAs must start a cluster)."""
    cluster, placement = d.get("cluster_m", 1), _v(d["placement"])
    if cluster == 1:
        return []
    if not Placement(placement).in_kernel:
        return [f"cluster_m: placement=side_stream runs a vendor GEMM per chunk; cluster_m={cluster} "
                "pairs the CTAs of the in-kernel placements' mainloop only; set cluster_m=1"]
    out = []
    if d.get("split_k", 1) != 1:
        out.append(f"cluster_m: cluster_m={cluster} pairs whole tiles in lock-step and split_k="
                   f"{d['split_k']} cuts tiles into slices; set cluster_m=1 or split_k=1")
    if placement == "dedicated_ctas" and d["comm_ctas"] % cluster:
        out.append(f"comm_ctas: with cluster_m={cluster} the compute CTAs come in clusters of "
                   f"{cluster} after the communication CTAs; set comm_ctas to a multiple of {cluster} "
                   f"(e.g. {d['comm_ctas'] + cluster - d['comm_ctas'] % cluster})")
    return out


def in_kernel_violations(d: Mapping[str, Any], problem: GemmProblem) -> list[str]:
    """The rules of ``epilogue`` and ``dedicated_ctas`` at ``problem`` (none for
    ``side_stream``): one kernel raises one flag per output tile and sends it straight to its
    owner, each rank's block of rows whole. Checked where a point is rendered or searched
    (:func:`cuco.kernels.tp.render_tp`, ``GemmWorkload.supported``), not by
    :meth:`Directives.check`, which accepts the default point (``epilogue``, one kernel-wide
    sync) as a description the analytic model can time."""
    where = Placement(_v(d["placement"]))
    if not where.in_kernel:
        return []
    p, out = where.value, []
    if _v(d["sync_scope"]) != "chunk":
        out.append(f"sync_scope: placement={p} raises one flag per output tile; set "
                   "sync_scope=chunk")
    if _v(d["chunk_schedule"]) != "direct":
        out.append(f"chunk_schedule: placement={p} sends each tile straight to its owner; set "
                   "chunk_schedule=direct")
    tm, tn = d["tile_m"], d["tile_n"]
    tile_bytes = tm * tn * problem.dtype_bytes
    if d["chunk_bytes"] != tile_bytes:
        out.append(f"chunk_bytes: placement={p} moves one {tm}x{tn} output tile "
                   f"per flag; set chunk_bytes={format_bytes(tile_bytes)} ({tile_bytes})")
    rows = row_blocks_refusal(problem)
    if rows:
        out.append(f"placement: {rows}")
    if where is Placement.DEDICATED_CTAS and d["comm_ctas"] > MAX_DEDICATED_CTAS:
        out.append(f"comm_ctas: keep comm_ctas <= {MAX_DEDICATED_CTAS} so most SMs run the GEMM")
    return out


def row_block(problem: GemmProblem) -> int:
    """Rows of each rank's block of M in the in-kernel placements (they cut M into
    ``world_size`` equal blocks, one per rank; :func:`row_blocks_refusal` says when it cannot)."""
    return problem.m // problem.world_size


def row_blocks_refusal(problem: GemmProblem) -> str | None:
    """Why the in-kernel placements cannot take ``problem``'s rows, naming the fix (None when
    they can): they cut M into ``world_size`` equal blocks of rows, one per rank (any block
    size: a block's last tile may be short); ``side_stream`` takes any M."""
    m, w = problem.m, problem.world_size
    if m % w:
        return (f"epilogue and dedicated_ctas cut M into {w} equal blocks of rows, one per rank, and "
                f"M={m} is not a multiple of {w}; use placement=side_stream or pad M to a multiple "
                f"of {w} (e.g. {-(-m // w) * w})")
    return local_rows_refusal(problem)


def local_rows_refusal(problem: GemmProblem) -> str | None:
    """Why the in-kernel placements cannot take each rank's GEMM (None when they can): their
    TMA tiles read and write each rank's operands in 16-byte rows, so that GEMM's N and K
    (a rank's part of a split dimension) must be multiples of 16 bytes; ``side_stream``'s
    library GEMM takes any. (Without this the launch itself refused, with CUDA error 1.)"""
    tp = find(problem.workload)
    if tp is None:
        return None
    local = tp.local_gemm(m=problem.m, n=problem.n, k=problem.k, world_size=problem.world_size)
    step, w = ROW_BYTES // problem.dtype_bytes, problem.world_size
    for dim in ("n", "k"):
        value = getattr(local, dim)
        if value % step:
            split = dim == tp.split and w > 1
            return (f"epilogue and dedicated_ctas read each rank's operands in {ROW_BYTES}-byte "
                    f"rows, and each rank's GEMM has {dim.upper()}={value} ({value * problem.dtype_bytes} "
                    f"bytes{f' of {dim.upper()}={getattr(problem, dim)} over {w} ranks' if split else ''}); "
                    f"use placement=side_stream or choose {dim.upper()} a multiple of {step * (w if split else 1)}")
    return None


def chunk_epilogue_refusal(workload: str, placement: Placement) -> str | None:
    """Why ``workload``, which runs Python between chunks (a ``chunk_epilogue``), cannot take
    ``placement`` (None when it can): the in-kernel placements run the whole GEMM in one
    kernel, with no point between chunks to return to Python."""
    if not placement.in_kernel:
        return None
    return (f"placement: {workload} adds a chunk_epilogue (Python, between chunks); "
            f"placement={placement.value} runs the whole GEMM in one kernel; use "
            "placement=side_stream")
