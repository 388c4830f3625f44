"""Keep the answer out of a candidate's reach.

A candidate kernel is given its inputs, its output and its arena, but nothing stops it
from reading other device memory by pointer arithmetic. The evaluator's fp32 references
live on the same device (every timed call is verified there), usually at a fixed offset
from the inputs, so a kernel that copied the reference into its output would pass every
check without computing anything. Two measures close that path:

* :class:`SealedReference`: the device holds a reference only *sealed*, each element's
  fp32 bits XORed with a keystream (SipHash-2-4 of its index) under a 128-bit key that lives
  in this process's memory and in the check kernels' launch arguments alone. Read from
  device memory, it is noise, and one known element does not give the key away.
* :func:`scrubbed_allocations`: buffers made while inputs and references are computed
  come from an allocator that zeroes each one before giving it back to the driver, so the
  reference's temporaries (the unsealed result, partial sums) leave no copy in free memory.

The same keyed hash makes the verifier's bytes poison (:func:`fill_keyed_bytes`): noise under
a key drawn per call, which no kernel can predict or tell from random bytes.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

import numpy

#: A cheap position hash (fingerprints: no secret there): ``cuco_mix(i, salt)``.
MIX_SRC = r"""
__device__ __forceinline__ unsigned cuco_mix(unsigned long long i, unsigned key) {
  unsigned h = (unsigned)((i * 0x9E3779B97F4A7C15ull) >> 32) ^ key;
  h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
  return h;
}
"""

#: The keystream that seals a reference: element ``i`` holds ``bits(ref[i]) ^
#: keystream(i, k0, k1)``, the low 32 bits of SipHash-2-4 of ``i`` under the 128-bit key
#: (k0, k1). SipHash is a keyed PRF: one element whose plain value a kernel computed
#: honestly tells it nothing about the key (a 32-bit key and a public mix, as before, were
#: brute-forced from one element in about 2^31 tries). Used by every kernel that seals or
#: reads a reference (one definition, here).
SEAL_SRC = r"""
__device__ __forceinline__ unsigned long long cuco_rotl(unsigned long long x, int b) {
  return (x << b) | (x >> (64 - b));
}
__device__ __forceinline__ void cuco_sipround(unsigned long long& v0, unsigned long long& v1,
                                              unsigned long long& v2, unsigned long long& v3) {
  v0 += v1; v1 = cuco_rotl(v1, 13); v1 ^= v0; v0 = cuco_rotl(v0, 32);
  v2 += v3; v3 = cuco_rotl(v3, 16); v3 ^= v2;
  v0 += v3; v3 = cuco_rotl(v3, 21); v3 ^= v0;
  v2 += v1; v1 = cuco_rotl(v1, 17); v1 ^= v2; v2 = cuco_rotl(v2, 32);
}
// SipHash-2-4 (64-bit) of n whole 8-byte words under the key (k0, k1): the keystream below,
// and the tags that make the verifier's per-call counts tamper-evident (runtime/checking.py).
__device__ __forceinline__ unsigned long long cuco_siphash(const unsigned long long* m, int n,
                                                           unsigned long long k0, unsigned long long k1) {
  unsigned long long v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
  unsigned long long v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  for (int j = 0; j < n; ++j) {
    v3 ^= m[j]; cuco_sipround(v0, v1, v2, v3); cuco_sipround(v0, v1, v2, v3); v0 ^= m[j];
  }
  const unsigned long long b = ((unsigned long long)(8 * n) & 0xffull) << 56;  // the length block
  v3 ^= b; cuco_sipround(v0, v1, v2, v3); cuco_sipround(v0, v1, v2, v3); v0 ^= b;
  v2 ^= 0xff;
  cuco_sipround(v0, v1, v2, v3); cuco_sipround(v0, v1, v2, v3);
  cuco_sipround(v0, v1, v2, v3); cuco_sipround(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}
__device__ __forceinline__ unsigned cuco_keystream(unsigned long long i, unsigned long long k0,
                                                   unsigned long long k1) {
  return (unsigned)cuco_siphash(&i, 1, k0, k1);  // one 8-byte block, the index: its low 32 bits
}
"""

#: Keyed noise: bytes ``8j .. 8j+7`` of an ``n``-byte buffer are SipHash-2-4 of ``j`` under the
#: 128-bit key, little-endian (:func:`keyed_bytes_host` on the host); 8-byte stores where the
#: buffer is aligned, byte stores elsewhere and in a short last word.
KEYED_BYTES_SRC = r"""
__device__ __forceinline__ void cuco_keyed_word(unsigned char* p, unsigned long long n, unsigned long long j,
                                                unsigned long long k0, unsigned long long k1) {
  const unsigned long long h = cuco_siphash(&j, 1, k0, k1);
  if (((unsigned long long)p & 7ull) == 0 && 8 * j + 8 <= n) {
    *(unsigned long long*)(p + 8 * j) = h;
  } else {
    for (int b = 0; b < 8 && 8 * j + b < n; ++b) p[8 * j + b] = (unsigned char)(h >> (8 * b));
  }
}
"""

_SEAL_SRC = SEAL_SRC + KEYED_BYTES_SRC + r"""
extern "C" __global__ void cuco_seal(unsigned* bits, unsigned long long n, unsigned long long k0,
                                     unsigned long long k1) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    bits[i] ^= cuco_keystream(i, k0, k1);
}

extern "C" __global__ void cuco_keyed_bytes(unsigned char* p, unsigned long long n, unsigned long long k0,
                                            unsigned long long k1) {
  for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; j < (n + 7) / 8;
       j += (unsigned long long)gridDim.x * blockDim.x)
    cuco_keyed_word(p, n, j, k0, k1);
}
"""
_seal_module = None
KEY_BITS = 128


def _seal_kernels():
    import cupy
    global _seal_module
    if _seal_module is None:
        _seal_module = cupy.RawModule(code=_SEAL_SRC, options=("--std=c++17",))
    return _seal_module


def mix_host(index, key: int) -> numpy.ndarray:
    """``cuco_mix`` on the host (the fingerprints' position hash)."""
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


def key_words(key: int) -> tuple[int, int]:
    """The 128-bit ``key`` as the kernels take it: (k0, k1), 64 bits each."""
    return key & (2**64 - 1), key >> 64


def keystream_host(index, key: int) -> numpy.ndarray:
    """The keystream at the element indices ``index`` on the host (what ``cuco_keystream``
    gives on the device): the low 32 bits of :func:`siphash_host` of each index."""
    return siphash_host(numpy.asarray(index, dtype=numpy.uint64).reshape(-1, 1), key).astype(numpy.uint32)


def siphash_host(words, key: int) -> numpy.ndarray:
    """SipHash-2-4 (64-bit) under the 128-bit ``key`` of each row of ``words`` (an n x L
    array of 8-byte words, little-endian: the message is 8 L bytes), vectorised over rows;
    what ``cuco_siphash`` gives on the device."""
    u = numpy.uint64
    k0, k1 = (u(w) for w in key_words(key))
    m = numpy.asarray(words, dtype=numpy.uint64)

    def rotl(x, b):
        return (x << u(b)) | (x >> u(64 - b))

    with numpy.errstate(over="ignore"):
        v0 = numpy.full(m.shape[0], k0 ^ u(0x736F6D6570736575), dtype=numpy.uint64)
        v1 = numpy.full(m.shape[0], k1 ^ u(0x646F72616E646F6D), dtype=numpy.uint64)
        v2 = numpy.full(m.shape[0], k0 ^ u(0x6C7967656E657261), dtype=numpy.uint64)
        v3 = numpy.full(m.shape[0], k1 ^ u(0x7465646279746573), dtype=numpy.uint64)

        def rounds(n):
            nonlocal v0, v1, v2, v3
            for _ in range(n):
                v0 = v0 + v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)  # noqa: E702
                v2 = v2 + v3; v3 = rotl(v3, 16); v3 ^= v2  # noqa: E702
                v0 = v0 + v3; v3 = rotl(v3, 21); v3 ^= v0  # noqa: E702
                v2 = v2 + v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)  # noqa: E702

        for j in range(m.shape[1]):
            v3 ^= m[:, j]
            rounds(2)
            v0 ^= m[:, j]
        b = u(((8 * m.shape[1]) & 0xFF) << 56)
        v3 ^= b
        rounds(2)
        v0 ^= b
        v2 ^= u(0xFF)
        rounds(4)
        return v0 ^ v1 ^ v2 ^ v3


def keyed_bytes_host(n: int, key: int) -> numpy.ndarray:
    """The ``n`` bytes :func:`fill_keyed_bytes` writes under the 128-bit ``key``, on the host."""
    words = siphash_host(numpy.arange(-(-n // 8), dtype=numpy.uint64).reshape(-1, 1), key)
    return words.astype("<u8").view(numpy.uint8)[:n]


def fill_keyed_bytes(x, key: int) -> None:
    """Overwrite the CuPy array ``x`` with keyed noise (:func:`keyed_bytes_host`'s bytes, in
    ``x``'s C order) on the current stream: for a C-contiguous ``x`` one kernel, no allocation,
    no host wait. Without the 128-bit ``key``, which stays in this process and the launch's
    arguments, the bytes cannot be told from random ones nor predicted."""
    import cupy
    if not x.flags.c_contiguous:  # a strided view: through a contiguous buffer of its shape
        tmp = cupy.empty(x.shape, dtype=x.dtype)
        fill_keyed_bytes(tmp, key)
        x[...] = tmp
        return
    n = int(x.nbytes)
    if n == 0:
        return
    blocks, threads = grid(-(-n // 8))
    k0, k1 = key_words(key)
    _seal_kernels().get_function("cuco_keyed_bytes")((blocks,), (threads,), (
        x.view(cupy.uint8), numpy.uint64(n), numpy.uint64(k0), numpy.uint64(k1)))


def grid(n: int) -> tuple[int, int]:
    """Blocks and threads of a grid-stride pass over ``n`` elements."""
    return max(1, min(4096, -(-n // 1024))), 256


@dataclass(frozen=True)
class SealedReference:
    """An fp32 reference as the device keeps it: ``bits`` (uint32, the reference's shape),
    sealed with the 128-bit ``key`` (0: a plain reference, e.g. a benchmark's own check). ``amax`` is
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
        if ref.dtype != cupy.float32 or not ref.flags.c_contiguous:
            raise ValueError("a reference is a C-contiguous float32 array")
        amax = float(cupy.abs(ref).max()) if ref.size else 0.0
        key = secrets.randbits(KEY_BITS) | 1
        bits = ref.view(cupy.uint32)
        n = int(bits.size)
        k0, k1 = key_words(key)
        _seal_kernels().get_function("cuco_seal")(grid(n)[:1], grid(n)[1:], (
            bits, numpy.uint64(n), numpy.uint64(k0), numpy.uint64(k1)))
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
            bits = bits ^ keystream_host(numpy.arange(bits.size), self.key)
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
