"""Element-wise comparison of a candidate's output with an fp32 reference.

One kernel does every comparison, the full check of a checked call and the count after a
timed one alike. It reads the reference sealed (:class:`~cuco.runtime.sealed.SealedReference`)
and unseals each element in registers: no plaintext copy of the answer is ever written to
device memory, nor the differences it could be recovered from.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy

from cuco.runtime.sealed import KEY_BITS, MIX_SRC, SEAL_SRC, SealedReference, grid, key_words, siphash_host

_CHECK_SRC = r"""
#include <cuda_fp16.h>
""" + MIX_SRC + SEAL_SRC + r"""
template <typename S> __device__ __forceinline__ float as_float(S v);
template <> __device__ __forceinline__ float as_float<unsigned short>(unsigned short v) {
  return __uint_as_float(((unsigned)v) << 16);  // bf16 bits
}
template <> __device__ __forceinline__ float as_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float as_float<float>(float v) { return v; }

// Elements of `got` outside |got - ref| <= rtol*|ref| + atol (NaN counts), added to *bad;
// with `stats` (else null): the sums of squared differences (non-finite ones as 1e30) and of
// squared reference values into stats[0..1]; with `max_bits`, the largest difference.
template <typename S>
__device__ void check(const S* got, const unsigned* ref, unsigned long long n, float rtol, float atol,
                      unsigned long long k0, unsigned long long k1, unsigned long long* bad,
                      double* stats, unsigned* max_bits) {
  const bool sealed = (k0 | k1) != 0;
  unsigned long long local = 0;
  double sq_diff = 0.0, sq_ref = 0.0;
  float most = 0.0f;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const float r = __uint_as_float(sealed ? ref[i] ^ cuco_keystream(i, k0, k1) : ref[i]);
    const float d = fabsf(as_float<S>(got[i]) - r);
    if (!(d <= rtol * fabsf(r) + atol)) ++local;
    const float f = isfinite(d) ? d : 1e30f;
    sq_diff += (double)f * f;
    sq_ref += (double)r * r;
    most = fmaxf(most, f);
  }
  for (int o = 16; o > 0; o >>= 1) {
    local += __shfl_down_sync(0xffffffffu, local, o);
    sq_diff += __shfl_down_sync(0xffffffffu, sq_diff, o);
    sq_ref += __shfl_down_sync(0xffffffffu, sq_ref, o);
    most = fmaxf(most, __shfl_down_sync(0xffffffffu, most, o));
  }
  if ((threadIdx.x & 31) != 0) return;
  if (local) atomicAdd(bad, local);
  if (stats) {
    atomicAdd(stats, sq_diff);
    atomicAdd(stats + 1, sq_ref);
  }
  if (max_bits) atomicMax(max_bits, __float_as_uint(most));  // non-negative floats order as their bits
}
extern "C" {
#define CUCO_CHECK(name, S)                                                                        \
  __global__ void name(const S* g, const unsigned* r, unsigned long long n, float rt, float at,     \
                       unsigned long long k0, unsigned long long k1, unsigned long long* b,        \
                       double* st, unsigned* mx) {                                                 \
    check(g, r, n, rt, at, k0, k1, b, st, mx);                                                     \
  }
CUCO_CHECK(check_bf16, unsigned short)
CUCO_CHECK(check_fp16, __half)
CUCO_CHECK(check_fp32, float)

// The tag of one call's count and L2 sums (written by `check` just before, on this stream):
// SipHash-2-4 under the job's 128-bit key, which only this kernel's arguments hold, of
// (call index, count, the sums' bits). A kernel that later rewrites the count or the sums, or
// moves a row to another call, cannot write the tag that goes with them.
__global__ void tag_tally(const unsigned long long* bad, const double* stats, unsigned long long idx,
                          unsigned long long k0, unsigned long long k1, unsigned long long* tag) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long m[4] = {idx, *bad, (unsigned long long)__double_as_longlong(stats[0]),
                                   (unsigned long long)__double_as_longlong(stats[1])};
  *tag = cuco_siphash(m, 4, k0, k1);
}

// The keyed sums of sync regions: region v (blockIdx.y) of `regions` laid end to end from p,
// each `words` 8-byte words, adds SipHash-2-4 of (position, word) under the job's key into
// row[col + v]. Keyed, so no kernel can find a change that keeps a region's sum (an unkeyed
// sum of position hashes falls to a generalised birthday search).
__global__ void region_sums(const unsigned long long* p, unsigned long long words, unsigned long long k0,
                            unsigned long long k1, unsigned long long* row) {
  const unsigned long long* r = p + (unsigned long long)blockIdx.y * words;
  unsigned long long local = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < words;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const unsigned long long m[2] = {i, r[i]};
    local += cuco_siphash(m, 2, k0, k1);
  }
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(row + blockIdx.y, local);
}

// A snapshot row's tag: row[0] := its index, then SipHash-2-4 of the whole row (index and
// sums) under the key into *tag; a row copied to another index or rewritten fails it.
__global__ void tag_row(unsigned long long* row, unsigned long long n, unsigned long long idx,
                        unsigned long long k0, unsigned long long k1, unsigned long long* tag) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  row[0] = idx;
  *tag = cuco_siphash(row, (int)n, k0, k1);
}

// A fingerprint of n bytes: the sum of a hash of each byte's value and position, so a write
// that moves bytes around (and keeps their sum) still changes it.
__global__ void fingerprint(const unsigned char* p, unsigned long long n, unsigned long long* acc) {
  unsigned long long local = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    local += cuco_mix(i, 0x100u + p[i]);
  for (int o = 16; o > 0; o >>= 1) local += __shfl_down_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(acc, local);
}
}
"""
_check_module = None


def _module():
    import cupy
    global _check_module
    if _check_module is None:
        _check_module = cupy.RawModule(code=_CHECK_SRC, options=("--std=c++17",))
    return _check_module


def load_kernels() -> None:
    """Load the check kernels now (a module loads on its first launch, and a load waits for
    the device's running kernels: a process whose first check runs beside a spinning
    candidate kernel must not load it then): one check of each dtype on a few elements."""
    import cupy

    from cuco.runtime import dtypes
    ref = SealedReference.seal(cupy.ones(256, dtype=cupy.float32))
    for dtype in dtypes.STORAGE:
        got = dtypes.from_float32(cupy.ones(256, dtype=cupy.float32), dtype)
        compare(got, ref, dtype, 1e-3, 1e-3)
        slot, sums, tag = cupy.zeros(1, dtype=cupy.uint64), cupy.zeros(2, dtype=cupy.float64), cupy.zeros(1, dtype=cupy.uint64)
        count_bad_async(got, ref, dtype, 1e-3, 1e-3, slot, cupy.cuda.get_current_stream(), stats=sums)
        tag_tally_async(slot, sums, 0, 1, tag, cupy.cuda.get_current_stream())
    cupy.cuda.get_current_stream().synchronize()


def _launch(got_storage, ref, dtype: str, rtol: float, atol: float, bad, stats, max_bits, stream) -> None:
    sealed = ref if isinstance(ref, SealedReference) else SealedReference.plain(ref)
    n = int(got_storage.size)
    if n != sealed.size:
        raise ValueError(f"output has {n} elements, reference {sealed.size}")
    blocks, threads = grid(n)
    _module().get_function(f"check_{dtype}")(
        (blocks,), (threads,),
        (got_storage, sealed.bits, numpy.uint64(n), numpy.float32(rtol), numpy.float32(atol),
         *(numpy.uint64(w) for w in key_words(sealed.key)), bad,
         stats if stats is not None else numpy.uint64(0),
         max_bits if max_bits is not None else numpy.uint64(0)), stream=stream)


def compare(got_storage, ref, dtype: str, rtol: float, atol: float) -> dict[str, Any]:
    """Every element must satisfy ``|got - ref| <= rtol * |ref| + atol``; NaN never passes.
    ``ref``: a :class:`SealedReference` or a plain fp32 array.

    Returns ``correct``, ``bad_elements``, ``rel_l2_error`` and ``max_abs_error``.
    """
    import cupy
    bad = cupy.zeros(1, dtype=cupy.uint64)
    stats = cupy.zeros(2, dtype=cupy.float64)
    max_bits = cupy.zeros(1, dtype=cupy.uint32)
    _launch(got_storage.reshape(-1), ref, dtype, rtol, atol, bad, stats, max_bits,
            cupy.cuda.get_current_stream())
    n_bad = int(bad.get()[0])
    return {"correct": n_bad == 0, "bad_elements": n_bad, "rel_l2_error": rel_l2(*stats.get().tolist()),
            "max_abs_error": float(max_bits.get().view(numpy.float32)[0])}


def count_bad_async(got_storage, ref, dtype: str, rtol: float, atol: float, slot, stream,
                    stats=None) -> None:
    """Enqueue on ``stream`` a count of the elements of ``got`` that fail the tolerance of
    :func:`compare`, added to the uint64 device scalar ``slot``: nothing waits for it, so
    every timed call's output can be verified without the host pausing the GPU. ``stats``
    (two float64 on the device, zeroed): the sums of squared differences and of squared
    reference values are added there, for the call's relative L2 error (:func:`rel_l2`)."""
    _launch(got_storage.reshape(-1), ref, dtype, rtol, atol, slot, stats, None, stream)


def tag_tally_async(slot, stats, idx: int, key: int, tag, stream) -> None:
    """Enqueue on ``stream`` the tag of call ``idx``'s count (the uint64 device scalar
    ``slot``) and sums (``stats``, two float64) under the 128-bit ``key``, into the uint64
    device scalar ``tag``: the host reads all three only after the whole schedule, and
    :func:`untampered` tells whether they are still what the check wrote."""
    _module().get_function("tag_tally")(
        (1,), (1,), (slot, stats, numpy.uint64(idx), *(numpy.uint64(w) for w in key_words(key)), tag),
        stream=stream)


def untampered(indices, counts, sums, tags, key: int) -> numpy.ndarray:
    """For each call index in ``indices``: whether its count, sums and tag (as read back
    from the device) still agree under ``key``."""
    rows = numpy.asarray(indices, dtype=numpy.int64).reshape(-1)
    sum_bits = numpy.ascontiguousarray(sums, dtype=numpy.float64)[rows].view(numpy.uint64)
    words = numpy.column_stack([rows.astype(numpy.uint64), numpy.asarray(counts, dtype=numpy.uint64)[rows],
                                sum_bits.reshape(-1, 2)])
    return siphash_host(words, key) == numpy.asarray(tags, dtype=numpy.uint64)[rows]


#: Blocks per sync region a snapshot's sum kernel runs (each region a row of the grid).
_REGION_BLOCKS = 64


def region_sums_async(ptr: int, regions: int, region_bytes: int, key: int, row, col: int, stream) -> None:
    """Enqueue on ``stream`` the keyed sums of ``regions`` sync regions of ``region_bytes``
    each (a multiple of 8) laid end to end from the device address ``ptr``, added into
    ``row[col:col + regions]`` (uint64, zeroed first by the caller)."""
    if region_bytes % 8 or regions < 1:
        raise ValueError(f"{regions} regions of {region_bytes} bytes: whole 8-byte words, at least one")
    _module().get_function("region_sums")(
        (_REGION_BLOCKS, regions), (256,),
        (numpy.uint64(ptr), numpy.uint64(region_bytes // 8), *(numpy.uint64(w) for w in key_words(key)),
         row[col:col + regions]), stream=stream)


def tag_row_async(row, idx: int, key: int, tag, stream) -> None:
    """Enqueue on ``stream`` the tag of snapshot ``idx``: ``row[0]`` set to ``idx``, then
    SipHash-2-4 of the whole row under ``key`` into the uint64 device scalar ``tag``."""
    _module().get_function("tag_row")(
        (1,), (1,), (row, numpy.uint64(row.size), numpy.uint64(idx), *(numpy.uint64(w) for w in key_words(key)),
                     tag), stream=stream)


def region_sums_host(data: bytes | numpy.ndarray, regions: int, region_bytes: int, key: int) -> numpy.ndarray:
    """What :func:`region_sums_async` adds up, on the host (tests): uint64 per region."""
    words = numpy.frombuffer(bytes(data), dtype=numpy.uint64).reshape(regions, region_bytes // 8)
    pos = numpy.arange(words.shape[1], dtype=numpy.uint64)
    out = numpy.zeros(regions, dtype=numpy.uint64)
    with numpy.errstate(over="ignore"):
        for v in range(regions):
            out[v] = siphash_host(numpy.column_stack([pos, words[v]]), key).sum(dtype=numpy.uint64)
    return out


def rows_untampered(rows, tags, key: int) -> numpy.ndarray:
    """For each snapshot row (index in word 0, then its sums): whether it still matches
    its tag under ``key`` (a row another index's copy, or rewritten, does not)."""
    rows = numpy.asarray(rows, dtype=numpy.uint64).reshape(len(tags), -1)
    index = numpy.arange(len(tags), dtype=numpy.uint64)
    return (rows[:, 0] == index) & (siphash_host(rows, key) == numpy.asarray(tags, dtype=numpy.uint64))


class Tally:
    """One job's per-call counts of bad elements, L2 sums and their tags (device rows, one a
    schedule call), under a 128-bit key that only the tag kernels' launch arguments hold:
    what the worker's inline checker and the verifier process each keep the same way."""

    def __init__(self, calls: int, stream):
        import cupy
        self.calls, self.stream = calls, stream
        self.key = secrets.randbits(KEY_BITS)
        with stream:  # on the job's stream: zeroed before any count lands
            self.counts = cupy.zeros(max(calls, 1), dtype=cupy.uint64)
            self.sums = cupy.zeros((max(calls, 1), 2), dtype=cupy.float64)  # each call's L2 sums
            self.tags = cupy.zeros(max(calls, 1), dtype=cupy.uint64)  # each call's count and sums, tagged

    def count(self, idx: int, got_storage, ref, dtype: str, rtol: float, atol: float) -> None:
        """Call ``idx``'s count and sums, enqueued on the stream, then tagged."""
        # zeroed here, after the call: a count seeded earlier (say, minus the elements a call
        # will get wrong) is gone before the check adds to it; the tag then seals what it wrote
        slot, sums = self.counts[idx:idx + 1], self.sums[idx]
        with self.stream:
            slot.fill(0)
            sums.fill(0)
        count_bad_async(got_storage, ref, dtype, rtol, atol, slot, self.stream, stats=sums)
        tag_tally_async(slot, sums, idx, self.key, self.tags[idx:idx + 1], self.stream)

    def read(self) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        """``(counts, sums, intact)`` of the job's calls, read back once the stream is done
        (a checked call's row, never counted, reads as not intact: callers skip it)."""
        self.stream.synchronize()
        n = self.calls
        counts, sums, tags = self.counts.get()[:n], self.sums.get()[:n], self.tags.get()[:n]
        intact = untampered(range(n), counts, sums, tags, self.key) if n else numpy.zeros(0, dtype=bool)
        return counts, sums, intact


def rel_l2(sq_diff: float, sq_ref: float) -> float:
    """Relative L2 error from the two sums a check adds up."""
    return math.sqrt(sq_diff) / (math.sqrt(sq_ref) or 1.0)


def fingerprint(array) -> int:
    """A 64-bit fingerprint of an array's bytes that any change of a byte's value or
    position changes (with overwhelming probability), computed on the current stream."""
    import cupy
    raw = cupy.ascontiguousarray(array).view(cupy.uint8).reshape(-1)
    acc = cupy.zeros(1, dtype=cupy.uint64)
    n = int(raw.size)
    blocks, threads = grid(n)
    _module().get_function("fingerprint")((blocks,), (threads,), (raw, numpy.uint64(n), acc))
    return int(acc.get()[0])
