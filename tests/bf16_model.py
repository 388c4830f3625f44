"""bf16 rounding in NumPy, for CPU tests that model what a kernel or NCCL computes (the device
side is ``cuco.runtime.dtypes.from_float32``, in CuPy)."""

from __future__ import annotations

import numpy as np


def bf16_bits(x) -> np.ndarray:
    """fp32 to bf16 (round to nearest, ties to even), as 16-bit patterns in uint32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)


def from_bf16_bits(b) -> np.ndarray:
    """16-bit patterns to the fp32 values they stand for."""
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def bf16(x) -> np.ndarray:
    """fp32 rounded to the nearest bf16, as fp32."""
    return from_bf16_bits(bf16_bits(x))
