"""What a design-space point is judged against: a workload family and shape.

The design layer knows shapes but not how to compute them; workloads
(``cuco.workloads``) build a :class:`Problem` from themselves.
"""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cuco.errors import InputError, ShapeError

Dtype = Literal["bf16", "fp16", "fp32"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# Workload families whose split of M/N/K over ranks is known to the design layer.
# Each entry says which global dimension is divided by the world size.
SPLIT_DIM: dict[str, str] = {
    "gemm_allreduce": "k",
    "gemm_reducescatter": "k",
    "allgather_gemm": "n",
}

# Every workload name cuco knows: the built-in families, and each user ``Workload``
# subclass's ``family`` (added by ``cuco.workloads`` when the class is defined).
WORKLOADS: set[str] = {*SPLIT_DIM, "moe", "kv_transfer", "cp_attention"}


def register_workload(name: str) -> None:
    """Make ``name`` a known workload (``cuco.workloads.Workload`` subclasses do this)."""
    WORKLOADS.add(name)


def check_workload(name: str) -> str:
    """``name`` if it is a known workload, else :class:`InputError` with the closest
    match. The one check every entry point (Problem, search, tune, export, the CLI) uses."""
    if name in WORKLOADS:
        return name
    close = difflib.get_close_matches(str(name), sorted(WORKLOADS), n=1, cutoff=0.6)
    known = ", ".join(sorted(WORKLOADS))
    if close:
        raise InputError(f"unknown workload {name!r} (known: {known})", param="workload",
                         fix=close[0], guess=True)
    raise InputError(f"unknown workload {name!r}; choose one of {known}", param="workload",
                     fix=sorted(SPLIT_DIM)[1])


def check_count(param: str, value: int, what: str, example: int) -> int:
    """``value`` if it is an integer >= 1, else :class:`InputError` naming ``param``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{param} {value!r} is not a number of {what} (it must be >= 1)",
                         param=param, fix=example)
    return value


class Problem(BaseModel):
    """A workload family with its global GEMM shape, dtype and world size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str = Field(description="workload family, e.g. 'gemm_allreduce'")
    m: int
    n: int
    k: int
    world_size: int
    dtype: Dtype = "bf16"
    has_network: bool = Field(
        default=False, description="ranks span hosts (GIN needs a network)"
    )

    @field_validator("workload")
    @classmethod
    def _known(cls, v: str) -> str:
        return check_workload(v)

    @field_validator("m", "n", "k")
    @classmethod
    def _positive_dim(cls, v: int, info) -> int:
        if v < 1:
            raise ShapeError(f"{info.field_name.upper()}={v} is not a matrix dimension (it must be "
                             f">= 1)", param=info.field_name, fix=8192)
        return v

    @field_validator("world_size")
    @classmethod
    def _ranks(cls, v: int) -> int:
        return check_count("world_size", v, "GPUs (ranks)", 2)

    @model_validator(mode="after")
    def _divides(self) -> "Problem":
        split = SPLIT_DIM.get(self.workload)
        w = self.world_size
        dims = {"m": self.m, "n": self.n, "k": self.k}
        if split is not None and dims[split] % w:
            fix = dims[split] - dims[split] % w or w
            raise ShapeError(
                f"{self.workload}: {split.upper()}={dims[split]} is split over "
                f"{w} ranks but is not divisible by {w}; choose {split.upper()} a "
                f"multiple of {w} (e.g. {fix})", param=split, fix=fix)
        if self.workload in ("gemm_reducescatter", "allgather_gemm") and self.m % w:
            fix = self.m - self.m % w or w
            raise ShapeError(
                f"{self.workload}: M={self.m} rows are scattered/gathered over {w} "
                f"ranks but M is not divisible by {w}; choose M a multiple of {w}", param="m", fix=fix)
        return self

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def label(self) -> str:
        """Case label used in result files: ``gemm_allreduce/M8192K8192N8192/bf16``."""
        return f"{self.workload}/M{self.m}K{self.k}N{self.n}/{self.dtype}"

    def output_shape_per_rank(self) -> tuple[int, int]:
        """Rows x cols of the output tile each rank's GEMM produces."""
        w = self.world_size
        if self.workload == "allgather_gemm":
            return self.m, self.n // w
        return self.m, self.n

    def output_bytes_per_rank(self) -> int:
        rows, cols = self.output_shape_per_rank()
        return rows * cols * self.dtype_bytes
