// The symmetric arena on NVSHMEM's heap: this PE's base of it; peers through nvshmem_ptr.
// `at(off, r)` is PE r's byte `off` as this PE maps it.
#pragma once

#include <cstddef>
#include <nvshmem.h>
#include <nvshmemx.h>

namespace cuco {

struct ArenaNvshmem {
  char* base;
  __device__ int rank() const { return nvshmem_my_pe(); }
  __device__ int size() const { return nvshmem_n_pes(); }
  __device__ char* at(size_t off, int r) const { return (char*)nvshmem_ptr(base + off, r); }
};

}  // namespace cuco
