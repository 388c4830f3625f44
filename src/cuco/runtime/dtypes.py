"""bf16/fp16/fp32 buffers on CuPy (which has no bfloat16: bf16 lives in uint16)."""

from __future__ import annotations

STORAGE = {"bf16": "uint16", "fp16": "float16", "fp32": "float32"}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
NAN_BITS = {"bf16": 0x7FC0}


def empty(n: int, dtype: str):
    import cupy
    return cupy.empty(n, dtype=STORAGE[dtype])


def from_float32(x, dtype: str):
    """fp32 CuPy array -> storage of ``dtype`` (bf16 rounded to nearest even)."""
    import cupy
    if dtype == "bf16":
        bits = x.astype(cupy.float32).view(cupy.uint32)
        rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
        return rounded.astype(cupy.uint16)
    return x.astype(STORAGE[dtype])


def to_float32(x, dtype: str):
    import cupy
    if dtype == "bf16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32)
    return x.astype(cupy.float32)


def random(n: int, dtype: str, seed: int):
    """Normal(0, 1) values in ``dtype`` storage, from ``seed`` (never zeros)."""
    import cupy
    rs = cupy.random.RandomState(seed)
    return from_float32(rs.standard_normal(n, dtype=cupy.float32), dtype)


def poison(x, dtype: str) -> None:
    """Fill with NaN so an element nobody wrote fails the check."""
    if dtype == "bf16":
        x.fill(NAN_BITS["bf16"])
    else:
        x.fill(float("nan"))
