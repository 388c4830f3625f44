"""Chunk arithmetic shared by the kernel templates and the Python launcher.

How a workload's rows are cut into communication chunks, in which order they
are produced, and who owns each one. The side-stream kernels receive these numbers at
every launch (:func:`pack_chunk_geom`: ``cuco::ChunkGeom``, ``cuco/chunks.cuh``), packed
from the same object the launcher walks, so the two can never disagree; only whether a
plan is ``ragged`` is compiled in. Pure Python, unit-tested on the CPU.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from cuco.design.directives import Directives
from cuco.design.patterns import Collective, TPPattern, find
from cuco.design.problem import DTYPE_BYTES, ROW_ALIGN, GemmProblem
from cuco.errors import DirectiveError


#: A shape whose M is a multiple of this (the smallest tile_m: every shape the tile rules
#: accepted before ragged plans existed) is cut into equal chunks that divide each block, as
#: it always was, and renders the equal-chunk kernel bodies; any other M gets a ragged plan
#: (the general bodies). The two are the one compile-time difference of side-stream plans.
EQUAL_CHUNKS_M = 64


class Chunk(NamedTuple):
    """One chunk of a plan: its index (flag slot), the block it belongs to (owner for
    ReduceScatter, source rank for AllGather), its first row and its number of rows."""

    index: int
    block: int
    row: int
    rows: int


@dataclass(frozen=True)
class ChunkPlan:
    """Rows of one workload cut into chunks.

    ``blocks`` groups of ``chunks_per_block`` chunks: one group for GEMM+AllReduce (all M
    rows), one per destination rank for GEMM+ReduceScatter, one per source rank (X shard)
    for AllGather+GEMM. Every chunk has ``rows`` rows except the last of each block, which
    has ``last_rows`` (equal unless the plan is ``ragged``). A ``ragged`` plan (M not a
    multiple of :data:`EQUAL_CHUNKS_M`) renders the templates' general chunk bodies, which
    take each chunk's own row count; the others render the equal-chunk bodies.
    """

    pattern: TPPattern
    world_size: int
    rows: int
    chunks_per_block: int
    blocks: int
    row_elems: int
    dtype_bytes: int
    last_rows: int
    ragged: bool = False

    @property
    def n_chunks(self) -> int:
        return self.blocks * self.chunks_per_block

    @property
    def block_rows(self) -> int:
        return self.rows * (self.chunks_per_block - 1) + self.last_rows

    @property
    def chunk_elems(self) -> int:
        """Elements of a full chunk (the last of a block may have fewer: :meth:`rows_of`)."""
        return self.rows * self.row_elems

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_elems * self.dtype_bytes

    def rows_of(self, local: int) -> int:
        """Rows of chunk ``local`` (0 <= local < chunks_per_block) of any block."""
        return self.last_rows if local == self.chunks_per_block - 1 else self.rows

    def order(self) -> list[Chunk]:
        """Chunks in the order the GEMM produces them.

        ReduceScatter interleaves owners so every rank has reduction work
        throughout the GEMM; the others go block by block.
        """
        out = []
        for j in range(self.n_chunks):
            if self.pattern.collective is Collective.REDUCE_SCATTER:
                block, local = j % self.blocks, j // self.blocks
            else:
                block, local = j // self.chunks_per_block, j % self.chunks_per_block
            out.append(Chunk(j, block, block * self.block_rows + local * self.rows, self.rows_of(local)))
        return out

    @classmethod
    def for_problem(cls, problem: GemmProblem, d: Directives) -> "ChunkPlan":
        w, esz = problem.world_size, DTYPE_BYTES[problem.dtype]
        tp = find(problem.workload)
        if tp is None:
            raise DirectiveError([f"workload: no chunk plan for {problem.workload!r}"])
        blocks, unit, row_elems = tp.chunk_blocks(m=problem.m, n=problem.n, k=problem.k, world_size=w)
        target = max(1, d.chunk_bytes // (row_elems * esz))
        if problem.m % EQUAL_CHUNKS_M:
            return cls._ragged(tp, w, blocks, unit, row_elems, esz, target, d)
        rows = largest_divisor(unit, min(target, unit))
        if rows is None:
            raise DirectiveError([_too_small(d, unit, row_elems * esz)])
        plan = cls(tp, w, rows, unit // rows, blocks, row_elems, esz, rows)
        if tp.collective is Collective.ALL_REDUCE and (plan.chunk_elems * esz) % (16 * w):
            raise DirectiveError([
                f"chunk_bytes: a chunk of {plan.chunk_elems} elements does not split into "
                f"{w} slices of 16-byte vectors; choose N a multiple of {8 * w}"])
        return plan

    @classmethod
    def _ragged(cls, pattern: TPPattern, w: int, blocks: int, unit: int, row_elems: int, esz: int,
                target: int, d: Directives) -> "ChunkPlan":
        """``unit`` rows per block in chunks of at most ``target`` rows (a multiple of
        :data:`ROW_ALIGN`), as equal as that allows: the last chunk of a block takes the rest."""
        if target >= unit:
            return cls(pattern, w, unit, 1, blocks, row_elems, esz, unit, True)
        cap = target // ROW_ALIGN * ROW_ALIGN
        if cap == 0:
            raise DirectiveError([_too_small(d, unit, row_elems * esz)])
        chunks = -(-unit // cap)
        rows = -(-unit // chunks)
        rows = -(-rows // ROW_ALIGN) * ROW_ALIGN  # <= cap, so (chunks - 1) * rows < unit
        return cls(pattern, w, rows, chunks, blocks, row_elems, esz, unit - (chunks - 1) * rows, True)


#: ``cuco::ChunkGeom`` (``cuco/chunks.cuh``): five 64-bit counts, then two 32-bit ones, 48
#: bytes with no padding (tests/test_tiles_and_tp_render.py reads nvcc's layout back).
CHUNK_GEOM_FORMAT = "<5Q2i"
CHUNK_GEOM_BYTES = struct.calcsize(CHUNK_GEOM_FORMAT)


def pack_chunk_geom(plan: ChunkPlan) -> bytes:
    """``plan`` as the side-stream kernels take it, by value (``cuco::ChunkGeom``): the counts
    their index math needs, rows per chunk and per block included, computed here once rather
    than divided out on the device."""
    return struct.pack(CHUNK_GEOM_FORMAT, plan.chunk_elems, plan.row_elems, plan.rows, plan.last_rows,
                       plan.block_rows, plan.n_chunks, plan.chunks_per_block)


def _too_small(d: Directives, unit: int, row_bytes: int) -> str:
    return (f"chunk_bytes: no chunk of at most {d.chunk_bytes} bytes cuts {unit} rows of "
            f"{row_bytes} bytes into multiples of {ROW_ALIGN} rows; choose chunk_bytes "
            f">= {ROW_ALIGN * row_bytes}")


def chunk_sizes(problem: GemmProblem, parts=(4, 8, 16), floor_log2: int = 12) -> list[int]:
    """Powers of two cutting each rank's output into about ``parts`` chunks (ascending
    ``parts`` give descending sizes; duplicates dropped), none below ``2**floor_log2``."""
    return sizes_cutting(problem.output_bytes_per_rank(), parts, floor_log2)


def sizes_cutting(total_bytes: int, parts=(4, 8, 16), floor_log2: int = 12) -> list[int]:
    """Powers of two cutting ``total_bytes`` into about ``parts`` pieces (see
    :func:`chunk_sizes`)."""
    picks: list[int] = []
    for n in parts:
        c = 1 << max(floor_log2, (total_bytes // n).bit_length() - 1)
        if c not in picks:
            picks.append(c)
    return picks


def largest_divisor(unit: int, cap: int) -> int | None:
    """Largest ``r <= cap`` dividing ``unit`` with ``r % ROW_ALIGN == 0`` (or ``r == unit``)."""
    for r in range(cap, 0, -1):
        if unit % r == 0 and (r % ROW_ALIGN == 0 or r == unit):
            return r
    return None
