"""Element-wise comparison of a candidate's output with an fp32 reference."""

from __future__ import annotations

from typing import Any

from cuco.runtime import dtypes


def compare(got_storage, ref32, dtype: str, rtol: float, atol: float) -> dict[str, Any]:
    """Every element must satisfy ``|got - ref| <= rtol * |ref| + atol``; NaN never passes.

    Returns ``correct``, ``bad_elements``, ``rel_l2_error`` and ``max_abs_error``.
    """
    import cupy
    got = dtypes.to_float32(got_storage.reshape(-1), dtype)
    ref = ref32.reshape(-1)
    if got.size != ref.size:
        raise ValueError(f"output has {got.size} elements, reference {ref.size}")
    diff = cupy.abs(got - ref)
    bad = int(cupy.count_nonzero(~(diff <= rtol * cupy.abs(ref) + atol)))
    denom = float(cupy.linalg.norm(ref)) or 1.0
    finite = cupy.nan_to_num(diff, nan=1e30, posinf=1e30)
    return {"correct": bad == 0, "bad_elements": bad,
            "rel_l2_error": float(cupy.linalg.norm(finite)) / denom,
            "max_abs_error": float(finite.max()) if finite.size else 0.0}


_COUNT_SRC = r"""
#include <cuda_fp16.h>
template <typename S> __device__ __forceinline__ float as_float(S v);
template <> __device__ __forceinline__ float as_float<unsigned short>(unsigned short v) {
  return __uint_as_float(((unsigned)v) << 16);  // bf16 bits
}
template <> __device__ __forceinline__ float as_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float as_float<float>(float v) { return v; }

// Elements of `got` outside |got - ref| <= rtol*|ref| + atol (NaN counts), added to *bad.
template <typename S>
__device__ void count_bad(const S* got, const float* ref, unsigned long long n, float rtol, float atol,
                          unsigned long long* bad) {
  unsigned long long local = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const float r = ref[i], d = fabsf(as_float<S>(got[i]) - r);
    if (!(d <= rtol * fabsf(r) + atol)) ++local;
  }
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(bad, local);
}
extern "C" {
__global__ void count_bad_bf16(const unsigned short* g, const float* r, unsigned long long n, float rt,
                               float at, unsigned long long* b) { count_bad(g, r, n, rt, at, b); }
__global__ void count_bad_fp16(const __half* g, const float* r, unsigned long long n, float rt, float at,
                               unsigned long long* b) { count_bad(g, r, n, rt, at, b); }
__global__ void count_bad_fp32(const float* g, const float* r, unsigned long long n, float rt, float at,
                               unsigned long long* b) { count_bad(g, r, n, rt, at, b); }
}
"""
_count_module = None


def count_bad_async(got_storage, ref32, dtype: str, rtol: float, atol: float, slot, stream) -> None:
    """Enqueue on ``stream`` a count of the elements of ``got`` that fail the tolerance of
    :func:`compare`, added to the uint64 device scalar ``slot``: nothing waits for it, so
    every timed call's output can be verified without the host pausing the GPU."""
    import cupy
    import numpy
    global _count_module
    if _count_module is None:
        _count_module = cupy.RawModule(code=_COUNT_SRC, options=("--std=c++17",))
    n = got_storage.size
    if n != ref32.size:
        raise ValueError(f"output has {n} elements, reference {ref32.size}")
    fn = _count_module.get_function(f"count_bad_{dtype}")
    blocks = max(1, min(4096, -(-n // 1024)))
    fn((blocks,), (256,), (got_storage, ref32, numpy.uint64(n), numpy.float32(rtol),
                           numpy.float32(atol), slot), stream=stream)
