"""Keep the answer out of a candidate's reach.

A candidate kernel is given its inputs, its output and its arena, but nothing stops it
from reading other device memory by pointer arithmetic. The evaluator's fp32 references
live on the same device (every timed call is verified there), usually at a fixed offset
from the inputs, so a kernel that copied the reference into its output would pass every
check without computing anything. Two measures close that path:

* :class:`SealedReference`: the device holds a reference only *sealed*, each element's
  fp32 bits XORed with a keystream drawn from a key that lives in this process's memory
  and in the check kernels' launch arguments alone. Read from device memory, it is noise.
* :func:`scrubbed_allocations`: buffers made while inputs and references are computed
  come from an allocator that zeroes each one before giving it back to the driver, so the
  reference's temporaries (the unsealed result, partial sums) leave no copy in free memory.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

import numpy

#: The keystream: element ``i`` of a sealed reference holds ``bits(ref[i]) ^ mix(i, key)``.
#: Used by every kernel that seals or reads a reference (one definition, here).
MIX_SRC = r"""
__device__ __forceinline__ unsigned cuco_mix(unsigned long long i, unsigned key) {
  unsigned h = (unsigned)((i * 0x9E3779B97F4A7C15ull) >> 32) ^ key;
  h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
  return h;
}
"""

_SEAL_SRC = MIX_SRC + r"""
extern "C" __global__ void cuco_seal(unsigned* bits, unsigned long long n, unsigned key) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    bits[i] ^= cuco_mix(i, key);
}
"""
_seal_module = None


def mix_host(index, key: int) -> numpy.ndarray:
    """The keystream at the element indices ``index`` on the host (the numbers ``cuco_mix``
    gives on the device)."""
    i = numpy.asarray(index, dtype=numpy.uint64)
    with numpy.errstate(over="ignore"):
        h = ((i * numpy.uint64(0x9E3779B97F4A7C15)) >> numpy.uint64(32)).astype(numpy.uint32)
        h ^= numpy.uint32(key)
        h ^= h >> numpy.uint32(16)
        h *= numpy.uint32(0x7FEB352D)
        h ^= h >> numpy.uint32(15)
        h *= numpy.uint32(0x846CA68B)
        h ^= h >> numpy.uint32(16)
    return h


def grid(n: int) -> tuple[int, int]:
    """Blocks and threads of a grid-stride pass over ``n`` elements."""
    return max(1, min(4096, -(-n // 1024))), 256


@dataclass(frozen=True)
class SealedReference:
    """An fp32 reference as the device keeps it: ``bits`` (uint32, the reference's shape),
    sealed with ``key`` (0: a plain reference, e.g. a benchmark's own check). ``amax`` is
    ``max |ref|``, taken before sealing, for the tolerance."""

    bits: Any
    key: int
    amax: float

    @property
    def size(self) -> int:
        return int(self.bits.size)

    @classmethod
    def seal(cls, ref) -> "SealedReference":
        """Seal ``ref`` (an fp32 CuPy array) in place, with a fresh key."""
        import cupy
        global _seal_module
        if ref.dtype != cupy.float32 or not ref.flags.c_contiguous:
            raise ValueError("a reference is a C-contiguous float32 array")
        amax = float(cupy.abs(ref).max()) if ref.size else 0.0
        key = secrets.randbits(32) | 1
        if _seal_module is None:
            _seal_module = cupy.RawModule(code=_SEAL_SRC, options=("--std=c++17",))
        bits = ref.view(cupy.uint32)
        n = int(bits.size)
        _seal_module.get_function("cuco_seal")(grid(n)[:1], grid(n)[1:], (bits, numpy.uint64(n),
                                                                          numpy.uint32(key)))
        return cls(bits, key, amax)

    @classmethod
    def plain(cls, ref) -> "SealedReference":
        """An unsealed fp32 reference (a caller's own check, nothing to hide)."""
        import cupy
        ref = cupy.ascontiguousarray(ref, dtype=cupy.float32)
        return cls(ref.view(cupy.uint32), 0, float("nan"))

    def to_host(self) -> numpy.ndarray:
        """The reference in fp32 on the host (unsealed there, never on the device)."""
        bits = self.bits.get().reshape(-1)
        if self.key:
            bits = bits ^ mix_host(numpy.arange(bits.size), self.key)
        return bits.view(numpy.float32).reshape(self.bits.shape)


@contextlib.contextmanager
def scrubbed_allocations():
    """CuPy allocations inside this block come straight from the driver, and each is
    zeroed (the device idle first) before it goes back: a reference's temporaries leave
    nothing a later kernel could read in free memory. For inputs and references, made once
    per seed per worker, not for hot paths."""
    import cupy
    rt = cupy.cuda.runtime
    sizes: dict[int, int] = {}

    def malloc(size: int, device: int) -> int:
        ptr = rt.malloc(max(size, 1))
        sizes[ptr] = size
        return ptr

    def free(ptr: int, device: int) -> None:
        size = sizes.pop(ptr, 0)
        with cupy.cuda.Device(device):
            rt.deviceSynchronize()  # the buffer's last user (on any stream) is done with it
            if size:
                rt.memset(ptr, 0, size)
                rt.deviceSynchronize()
            rt.free(ptr)

    allocator = cupy.cuda.memory.PythonFunctionAllocator(malloc, free)
    with cupy.cuda.using_allocator(allocator.malloc):
        yield
