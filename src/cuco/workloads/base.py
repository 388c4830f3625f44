"""Workload: one compute + communication pattern with its shapes, dtype and world size.

A workload owns everything that does not depend on how a candidate fuses the
two halves: per-rank input generation from a seed, the host-driven reference
(vendor GEMM, then the NCCL collective launched from the host), a
higher-precision reference for correctness, a tolerance, and the pieces of the
lower bound ``max(t_compute, t_comm)``. GPU methods run inside a worker
(``ctx`` is a :class:`cuco.runtime.WorkerContext`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from cuco.design import Problem, check_workload, register_workload
from cuco.errors import UnknownId
from cuco.design.problem import Dtype
from cuco.runtime.peaks import Work

EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}

Buffers = dict[str, Any]


class Workload(ABC):
    """Base class of built-in and user workloads.

    Subclasses set :attr:`family` and implement the abstract methods. The
    per-rank shapes must be divisible as the family requires; a shape that does
    not divide raises :class:`cuco.ShapeError` at construction.
    """

    family: ClassVar[str]
    #: The built-in family whose fused templates this workload reuses (its own
    #: family for the built-ins). A user workload that is "GEMM + something, then
    #: AllReduce" sets ``pattern = "gemm_allreduce"`` and adds a :meth:`chunk_epilogue`.
    pattern: ClassVar[str | None] = None

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "family" in cls.__dict__:  # a user workload's name is a known one from now on
            register_workload(cls.family)

    def __init__(self, m: int, n: int, k: int, world_size: int, dtype: Dtype = "bf16"):
        self.problem = Problem(workload=self.family, m=m, n=n, k=k, world_size=world_size,
                               dtype=dtype)
        _ = self.pattern_problem  # a shape its pattern cannot split is refused here, with the fix

    # ---- description (CPU) ------------------------------------------------------------
    @property
    def m(self) -> int:
        return self.problem.m

    @property
    def n(self) -> int:
        return self.problem.n

    @property
    def k(self) -> int:
        return self.problem.k

    @property
    def world_size(self) -> int:
        return self.problem.world_size

    @property
    def dtype(self) -> str:
        return self.problem.dtype

    @property
    def label(self) -> str:
        return self.problem.label

    @property
    def pattern_name(self) -> str:
        return self.pattern or self.family

    @property
    def pattern_problem(self) -> Problem:
        """This shape under the family whose templates and chunk plans it uses."""
        return self.in_pattern(self.problem)

    def in_pattern(self, problem: Problem) -> Problem:
        """``problem`` (this workload's, or a smaller one) under its pattern's family,
        validated, so a shape the pattern cannot split is refused with the fix."""
        if problem.workload == self.pattern_name:
            return problem
        return Problem(**{**problem.model_dump(), "workload": self.pattern_name})

    @abstractmethod
    def local_gemm(self) -> tuple[int, int, int]:
        """(m, n, k) of the GEMM each rank runs in the host-driven program."""

    @abstractmethod
    def output_shape(self) -> tuple[int, int]:
        """Shape of each rank's final output."""

    def flops_per_rank(self) -> int:
        m, n, k = self.local_gemm()
        return 2 * m * n * k

    def link_bytes_per_rank(self) -> int:
        """Bytes each rank must receive from its peers in one call (0: unknown)."""
        return 0

    def work(self) -> Work:
        """What one rank must do in one call: its GEMM, each operand and result through
        HBM once, and what it receives (the physical floor of :mod:`cuco.evaluate.floor`)."""
        m, n, k = self.local_gemm()
        esz = self.problem.dtype_bytes
        return Work(self.flops_per_rank(), (m * k + k * n + m * n) * esz, self.link_bytes_per_rank())

    def tolerance(self) -> tuple[float, float]:
        """``(rtol, atol_factor)``: an element passes if
        ``|out - ref| <= rtol * |ref| + atol_factor * max|ref|``.

        Each partial product is rounded once to the dtype and, for reductions,
        the sum of ``world_size`` of them once more: ``rtol = (w + 1) * eps``.
        Where partials cancel, their rounding errors (up to ``eps/2`` of a
        partial, and partials reach ``max|ref|``) stay: the absolute part is
        ``eps * w * max|ref|``, grown with ``sqrt(K)`` for fp32
        accumulation-order differences. A kernel that drops or doubles one
        rank's contribution errs by about ``rms(ref)``, far above it.
        """
        eps = EPS[self.dtype]
        w = self.world_size
        return (w + 1) * eps, eps * (w + math.sqrt(self.k / 65536.0))

    # ---- GPU side (inside a worker) -------------------------------------------------
    @abstractmethod
    def make_inputs(self, ctx, seed: int) -> Buffers:
        """This rank's inputs in the workload dtype (storage arrays), from ``seed``."""

    @abstractmethod
    def reference(self, ctx, inputs: Buffers):
        """This rank's expected output in fp32: fp32 GEMM + fp32 NCCL collective."""

    @abstractmethod
    def host_sequence(self, ctx, inputs: Buffers, out) -> Callable[[], None]:
        """The host-driven program: vendor GEMM, then the NCCL collective from the host."""

    @abstractmethod
    def gemm_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The GEMM alone (the compute half of the bound)."""

    @abstractmethod
    def comm_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The host NCCL collective alone (the communication half of the bound)."""

    def chunk_epilogue(self, ctx, inputs: Buffers, ptr: int, row0: int, rows: int, stream) -> None:
        """Work on ``rows`` rows of the local GEMM output starting at row ``row0`` (at
        device address ``ptr``), enqueued on ``stream`` right after their GEMM and
        before the communication may read them. None for the built-ins; a user
        workload adds bias, activation, scaling here (and in its host sequence)."""

    @classmethod
    def has_chunk_epilogue(cls) -> bool:
        """Whether this workload adds Python work between chunks (the one-kernel
        placements cannot run it)."""
        return cls.chunk_epilogue is not Workload.chunk_epilogue

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label}, world_size={self.world_size})"


REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    REGISTRY[cls.family] = cls
    return cls


def get(family: str) -> type[Workload]:
    """The registered class of ``family`` (an unknown name is refused with the closest one)."""
    check_workload(family)
    try:
        return REGISTRY[family]
    except KeyError:
        raise UnknownId(f"unknown workload {family!r} for the evaluator: no Workload class is "
                        "registered for it (a pipeline workload, or a class without "
                        f"@cuco.workloads.register); registered: {', '.join(sorted(REGISTRY))}") from None
