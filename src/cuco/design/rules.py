"""Validity rules of the design space, as one pure function over plain values.

Kept apart from the pydantic model so that :meth:`DesignSpace.enumerate` can
filter tens of thousands of points quickly, and so that every rule lives in
one place: the placements' rules in :mod:`cuco.design.placement_rules`, the
stream-ordered values' in :mod:`cuco.design.stream_order`, the library cores' in
:mod:`cuco.design.cores`, the rest here. Each violation is a sentence naming the dimension and a fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuco.design import cores, placement_rules, stream_order
from cuco.design.dimensions import Placement, format_bytes
from cuco.design.problem import GemmProblem, Problem

# Hopper: 227 KiB of shared memory per block once the dynamic limit is raised.
SMEM_LIMIT_BYTES = 227 * 1024
OPERAND_BYTES = 2  # bf16/fp16 operands in the GEMM mainloop
#: Pingpong: one warpgroup's fp32 accumulators of a tile (128 registers a thread at most).
PINGPONG_TILE_ELEMS = 128 * 128
#: Cooperative: two consumer warpgroups split a tile, each holding half its fp32 accumulators,
#: at most 144 registers a thread: a swapped 144x256 tile is often the fastest, while 176x256
#: and 208x256 spilled and ran 1.7-8.7x and 15-83x slower than each shape's best
#: (bench/results/gemm_decode_explore.json, 1 x H200).
COOPERATIVE_TILE_ELEMS = 2 * 144 * 128


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def schedule_holds(schedule: str, tile_m: int, tile_n: int) -> bool:
    """Whether ``schedule``'s consumers can hold a ``tile_m`` x ``tile_n`` tile's accumulators
    in registers: under pingpong one warpgroup holds a whole tile
    (:data:`PINGPONG_TILE_ELEMS`), under cooperative two split it
    (:data:`COOPERATIVE_TILE_ELEMS`)."""
    return tile_m * tile_n <= tile_elems(schedule)


def tile_elems(schedule: str) -> int:
    """The most accumulators of one tile ``schedule``'s consumer warpgroups hold."""
    return PINGPONG_TILE_ELEMS if _v(schedule) == "pingpong" else COOPERATIVE_TILE_ELEMS


def smem_bytes(tile_m: int, tile_n: int, tile_k: int, stages: int) -> int:
    """Shared memory the mainloop's A and B stages take."""
    return stages * (tile_m + tile_n) * tile_k * OPERAND_BYTES


def violations(d: Mapping[str, Any], problem: Problem | None = None) -> list[str]:
    """Every rule ``d`` breaks, alone and (if given) for ``problem``."""
    out: list[str] = []
    backend, placement = _v(d["backend"]), _v(d["placement"])
    sync, schedule = _v(d["sync_scope"]), _v(d["chunk_schedule"])
    chunk, where = d["chunk_bytes"], Placement(placement)
    tm, tn, tk, stages = d["tile_m"], d["tile_n"], d["tile_k"], d["stages"]

    out += placement_rules.violations(d)
    out += stream_order.violations(d, problem)
    out += cores.violations(d, problem)
    if schedule == "ring" and sync == "kernel":
        out.append(
            "chunk_schedule: a ring schedule forwards chunks hop by hop and needs a "
            "per-chunk or per-CTA sync; set sync_scope=chunk or cta, or chunk_schedule=direct"
        )
    if not schedule_holds(d.get("schedule", "cooperative"), tm, tn):
        if _v(d.get("schedule", "cooperative")) == "pingpong":
            out.append(
                f"schedule: under pingpong one warpgroup holds a whole {tm}x{tn} tile's "
                f"accumulators; choose tile_m x tile_n <= {PINGPONG_TILE_ELEMS} (128x128 or "
                "64x256) or schedule=cooperative"
            )
        else:
            out.append(
                f"tile_m: under cooperative two warpgroups hold a {tm}x{tn} tile's accumulators, "
                f"{tm * tn // 256} registers a thread, and they spill past 144; choose tile_m x "
                f"tile_n <= {COOPERATIVE_TILE_ELEMS} (e.g. 144x256 or 128x256)"
            )
    need = smem_bytes(tm, tn, tk, stages)
    if need > SMEM_LIMIT_BYTES:
        fit = SMEM_LIMIT_BYTES // smem_bytes(tm, tn, tk, 1)
        fix = f"lower stages to {fit}" if fit >= 2 else "choose a smaller tile"
        out.append(
            f"stages: tile {tm}x{tn}x{tk} with stages={stages} needs {need // 1024} KiB of "
            f"shared memory (> {SMEM_LIMIT_BYTES // 1024} KiB on Hopper); {fix}"
        )
    if problem is None:
        return out

    if backend == "gin" and not problem.has_network:
        out.append(
            "backend: backend=gin needs ranks on different hosts (a network); on one "
            "NVLink host choose backend=lsa or backend=nvshmem"
        )
    if isinstance(problem, GemmProblem):
        out += _gemm_violations(tm, tn, tk, chunk, problem, where.in_kernel)
    return out


def _gemm_violations(tm: int, tn: int, tk: int, chunk: int, problem: GemmProblem,
                     tiled: bool) -> list[str]:
    """The rules of a GEMM problem: a chunk fits each rank's output; where the placement runs
    cuco's own mainloop (``tiled``), a chunk holds a tile. Tiles need not divide the GEMM:
    the in-kernel kernels run a short last tile (TMA reads its missing rows as zeros and
    the epilogue moves the rows that exist); side_stream runs a vendor GEMM per chunk."""
    out: list[str] = []
    out_bytes = problem.output_bytes_per_rank()
    if chunk > out_bytes:
        out.append(
            f"chunk_bytes: chunk_bytes={format_bytes(chunk)} exceeds the "
            f"{format_bytes(out_bytes)} each rank produces; choose chunk_bytes <= "
            f"{format_bytes(out_bytes)}"
        )
    if not tiled:
        return out
    tile_bytes = tm * tn * problem.dtype_bytes
    if chunk < tile_bytes:
        out.append(
            f"chunk_bytes: chunk_bytes={format_bytes(chunk)} is smaller than one "
            f"{tm}x{tn} {problem.dtype} output tile ({format_bytes(tile_bytes)}); "
            f"choose chunk_bytes >= {format_bytes(tile_bytes)}"
        )
    return out
