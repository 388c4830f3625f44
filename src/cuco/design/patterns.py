"""The three tensor-parallel patterns as typed objects: what each one is, in one place.

A pattern is the global GEMM ``C[M, N] = A[M, K] B[K, N]`` cut over ``w`` ranks and joined
by one collective:

* ``gemm_allreduce``      K split; ``Y = allreduce(X_r[M, K/w] @ W_r[K/w, N])``, ``[M, N]``
* ``gemm_reducescatter``  K split; ``Y_r = rows_r(sum_s X_s @ W_s)``, ``[M/w, N]``
* ``allgather_gemm``      N split; ``Y_r = allgather_rows(X_s[M/w, K]) @ W_r[K, N/w]``

Everything else asks the :class:`TPPattern` object (its split dimension, collective,
per-rank GEMM, operand shapes, torch op, arena regions) instead of comparing its name:
a pattern name (a string from the CLI, a database row, a table file, a workload class) is
looked up here once, by :func:`tp_pattern` (or :func:`find`), where it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from cuco.design.registry import Registry
from cuco.errors import InputError

Shape2 = tuple[int, int]


class Collective(str, Enum):
    """The collective that joins the ranks' GEMMs (named as NCCL's calls are)."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"


class LocalGemm(NamedTuple):
    """The GEMM one rank runs: ``C[m, n] = A[m, k] B[k, n]``."""

    m: int
    n: int
    k: int


class OperandShapes(NamedTuple):
    """Per-rank shapes of a fused call: ``a @ b`` (then the collective) gives ``out``."""

    a: Shape2
    b: Shape2
    out: Shape2


@dataclass(frozen=True)
class TPPattern:
    """One tensor-parallel pattern (see the module's docstring); three instances exist,
    :data:`GEMM_ALLREDUCE`, :data:`GEMM_REDUCESCATTER` and :data:`ALLGATHER_GEMM`."""

    #: the workload name (the built-in workload's ``family``, its templates' ``workload``)
    name: str
    collective: Collective
    #: the global GEMM dimension cut over ranks (``"k"`` or ``"n"``)
    split: str
    #: the op of the ``torch.ops.cuco`` namespace that runs it
    torch_op: str
    #: PyTorch's fused symmetric-memory op of the pattern (``torch.ops.symm_mem``), if any
    symm_mem_op: str | None
    #: the arena's data regions: name -> the global matrix it holds (``"mn"``: M x N,
    #: ``"mk"``: M x K). p: this rank's partial (side stream) or staged tiles
    #: (dedicated_ctas); o: the all-reduced output; r: receive slots of the in-kernel
    #: placements, [src][M/w][N]; xf: the gathered X
    regions: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        return f"TPPattern({self.name})"

    def __str__(self) -> str:
        return self.name

    # ---- what moves ----------------------------------------------------------------------
    @property
    def gathers_input(self) -> bool:
        """Whether the ranks' input rows (X) are gathered: each rank holds M/w of A's rows."""
        return self.collective is Collective.ALL_GATHER

    @property
    def scatters_rows(self) -> bool:
        """Whether M's rows are split over ranks (gathered or scattered): M divides by w."""
        return self.collective is not Collective.ALL_REDUCE

    @property
    def output_in_arena(self) -> bool:
        """Whether the fused kernels leave the result in the arena's ``o`` region (every
        rank's all-reduced copy) rather than in the caller's output."""
        return self.collective is Collective.ALL_REDUCE

    @property
    def tiles_are_own_output(self) -> bool:
        """Whether a rank's output tiles are its own output (the gathered pattern: what moves
        is X): the in-kernel templates store them by TMA, the others read them back to send."""
        return self.collective is Collective.ALL_GATHER

    def link_bytes(self, *, m: int, n: int, k: int, world_size: int, dtype_bytes: int) -> int:
        """Bytes each rank receives from its peers in one call of the global ``M x K`` times
        ``K x N``: AllReduce a reduce-scatter then an all-gather of the M x N result
        (2 (w-1)/w of it), ReduceScatter (w-1)/w of the M x N partial sums, AllGather every
        peer's M/w x K rows of X. The physical floor and the analytic model both use it."""
        w = world_size
        if self.collective is Collective.ALL_GATHER:
            return (w - 1) * m * k * dtype_bytes // w
        times = 2 if self.collective is Collective.ALL_REDUCE else 1
        return times * (w - 1) * m * n * dtype_bytes // w

    # ---- shapes ----------------------------------------------------------------------------
    def local_gemm(self, *, m: int, n: int, k: int, world_size: int) -> LocalGemm:
        """The GEMM one rank runs, of the global ``M x K`` times ``K x N``."""
        w = world_size
        return LocalGemm(m, n // w if self.split == "n" else n, k // w if self.split == "k" else k)

    def output_rows(self, rows: int, world_size: int):
        """Rows of each rank's output from the rows of its ``A`` (symbolic sizes stay so)."""
        if self.collective is Collective.REDUCE_SCATTER:
            return rows // world_size
        if self.collective is Collective.ALL_GATHER:
            return rows * world_size
        return rows

    def operand_shapes(self, *, m: int, n: int, k: int, world_size: int) -> OperandShapes:
        """Per-rank ``A``, ``B`` and output shapes of the fused call (the torch op's too)."""
        g = self.local_gemm(m=m, n=n, k=k, world_size=world_size)
        a_rows = m // world_size if self.gathers_input else m
        return OperandShapes((a_rows, g.k), (g.k, g.n),
                             (self.output_rows(a_rows, world_size), g.n))

    def global_gemm(self, a_rows: int, b_shape: Shape2, world_size: int) -> tuple[int, int, int]:
        """``(M, N, K)`` of a call with ``a_rows`` rows of ``A`` and ``B`` of ``b_shape`` per
        rank (the inverse of :meth:`operand_shapes`)."""
        w = world_size
        kb, nb = b_shape
        return (a_rows * w if self.gathers_input else a_rows,
                nb * w if self.split == "n" else nb, kb * w if self.split == "k" else kb)

    def chunk_blocks(self, *, m: int, n: int, k: int, world_size: int) -> tuple[int, int, int]:
        """How the rows the collective moves are grouped: ``(blocks, rows per block, elements
        per row)``: one block of all M rows of C (AllReduce), one per destination rank
        (ReduceScatter), one per source rank's X shard (AllGather)."""
        blocks = world_size if self.scatters_rows else 1
        return blocks, m // blocks, k if self.gathers_input else n

    def arena_regions(self, *, m: int, n: int, k: int, dtype_bytes: int) -> dict[str, int]:
        """The arena's data regions (name -> bytes) at the global shape."""
        size = {"mn": m * n, "mk": m * k}
        return {name: size[dims] * dtype_bytes for name, dims in self.regions}


GEMM_ALLREDUCE = TPPattern("gemm_allreduce", Collective.ALL_REDUCE, "k", "matmul_all_reduce",
                           None, (("p", "mn"), ("o", "mn"), ("r", "mn")))
GEMM_REDUCESCATTER = TPPattern("gemm_reducescatter", Collective.REDUCE_SCATTER, "k",
                               "matmul_reduce_scatter", "fused_matmul_reduce_scatter",
                               (("p", "mn"), ("r", "mn")))
ALLGATHER_GEMM = TPPattern("allgather_gemm", Collective.ALL_GATHER, "n", "all_gather_matmul",
                           "fused_all_gather_matmul", (("xf", "mk"),))

#: Every pattern, in the order listings and catalogs use.
TP_PATTERNS: tuple[TPPattern, ...] = (GEMM_ALLREDUCE, GEMM_REDUCESCATTER, ALLGATHER_GEMM)
#: Their names (the workloads' names).
TP_NAMES: tuple[str, ...] = tuple(p.name for p in TP_PATTERNS)
_REGISTRY = Registry(TPPattern, TP_PATTERNS, "pattern {name!r} is not a tensor-parallel pattern",
                     param="pattern")


def find(name: str | TPPattern | None) -> TPPattern | None:
    """The pattern named ``name`` (a pattern passes through); None for any other workload."""
    return _REGISTRY.find(name)


def tp_pattern(name: str | TPPattern, error: type[InputError] = InputError) -> TPPattern:
    """The pattern named ``name``, or ``error`` naming the closest one (the lookup every
    entry point does where a pattern name arrives)."""
    return _REGISTRY.get(name, error)
