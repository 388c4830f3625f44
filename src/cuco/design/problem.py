"""What a design-space point is judged against: a workload family and shape.

The design layer knows shapes but not how to compute them; workloads
(``cuco.workloads``) build a :class:`Problem` from themselves.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cuco.errors import ShapeError

Dtype = Literal["bf16", "fp16", "fp32"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# Workload families whose split of M/N/K over ranks is known to the design layer.
# Each entry says which global dimension is divided by the world size.
SPLIT_DIM: dict[str, str] = {
    "gemm_allreduce": "k",
    "gemm_reducescatter": "k",
    "allgather_gemm": "n",
}


class Problem(BaseModel):
    """A workload family with its global GEMM shape, dtype and world size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str = Field(description="workload family, e.g. 'gemm_allreduce'")
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    world_size: int = Field(ge=1)
    dtype: Dtype = "bf16"
    has_network: bool = Field(
        default=False, description="ranks span hosts (GIN needs a network)"
    )

    @model_validator(mode="after")
    def _divides(self) -> "Problem":
        split = SPLIT_DIM.get(self.workload)
        w = self.world_size
        dims = {"m": self.m, "n": self.n, "k": self.k}
        if split is not None and dims[split] % w:
            raise ShapeError(
                f"{self.workload}: {split.upper()}={dims[split]} is split over "
                f"{w} ranks but is not divisible by {w}; choose {split.upper()} a "
                f"multiple of {w} (e.g. {dims[split] - dims[split] % w or w})"
            )
        if self.workload in ("gemm_reducescatter", "allgather_gemm") and self.m % w:
            raise ShapeError(
                f"{self.workload}: M={self.m} rows are scattered/gathered over {w} "
                f"ranks but M is not divisible by {w}; choose M a multiple of {w}"
            )
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
