// The symmetric arena through an NCCL window (LSA): every rank's buffers, reached with
// ncclGetLsaPointer. `at(off, r)` is rank r's byte `off` as this rank maps it.
#pragma once

#include <cstddef>
#include <nccl_device.h>

namespace cuco {

struct ArenaLsa {
  const ncclDevComm* comm;
  ncclWindow_t win;
  __device__ int rank() const { return comm->lsaRank; }
  __device__ int size() const { return comm->lsaSize; }
  __device__ char* at(size_t off, int r) const { return (char*)ncclGetLsaPointer(win, off, r); }
};

}  // namespace cuco
