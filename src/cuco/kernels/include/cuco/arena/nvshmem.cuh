// The symmetric arena on NVSHMEM's heap: this PE's base of it; peers through nvshmem_ptr.
// `at(off, r)` is PE r's byte `off` as this PE maps it. Beside it, NVSHMEM's calls that an
// issuer makes together, picked by the issuer's type (cuco/issuer.cuh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuco/nvshmem_device.cuh>

#include <cuco/issuer.cuh>

namespace cuco {

struct ArenaNvshmem {
  char* base;
  __device__ int rank() const { return nvshmem_my_pe(); }
  __device__ int size() const { return nvshmem_n_pes(); }
  __device__ char* at(size_t off, int r) const { return (char*)nvshmem_ptr(base + off, r); }
};

// NVSHMEM's put of `bytes` to PE `pe` with a signal (`sig_op` of `value` on `sig` there, after
// the bytes), made by one issuer: each thread its own, a warp's threads together (_warp), a
// CTA's together (_block).
__device__ __forceinline__ void put_signal_nbi(IssuerThread, void* dst, const void* src, size_t bytes,
                                               uint64_t* sig, uint64_t value, int sig_op, int pe) {
  nvshmem_putmem_signal_nbi(dst, src, bytes, sig, value, sig_op, pe);
}
__device__ __forceinline__ void put_signal_nbi(IssuerWarp, void* dst, const void* src, size_t bytes,
                                               uint64_t* sig, uint64_t value, int sig_op, int pe) {
  nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, sig, value, sig_op, pe);
}
__device__ __forceinline__ void put_signal_nbi(IssuerCta, void* dst, const void* src, size_t bytes,
                                               uint64_t* sig, uint64_t value, int sig_op, int pe) {
  nvshmemx_putmem_signal_nbi_block(dst, src, bytes, sig, value, sig_op, pe);
}

}  // namespace cuco
