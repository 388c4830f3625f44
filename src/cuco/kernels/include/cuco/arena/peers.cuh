// The symmetric arena as a table of base pointers, one per rank, mapped by the host
// (nvshmem_ptr of every PE's arena): kernels built without NVSHMEM's device library reach
// their peers through it. `at(off, r)` is rank r's byte `off` as this rank maps it.
#pragma once

#include <cstddef>

namespace cuco {

template <int kMaxRanks>
struct ArenaPeers {
  char* base[kMaxRanks];  // this rank's mapping of every rank's arena
  int me;
  __device__ int rank() const { return me; }
  __device__ char* at(size_t off, int r) const { return base[r] + off; }
};

}  // namespace cuco
