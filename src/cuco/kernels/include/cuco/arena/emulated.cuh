// What an emulated world (W ranks as W processes sharing one GPU, cuco.runtime.emulated)
// hands its kernels in place of NCCL's device objects: a communicator of IPC-mapped flag
// arrays and a window that is a table of every rank's base. A handle is emulated when its
// low bit is set (real NCCL windows are aligned), so one build serves both worlds: the LSA
// arena (cuco/arena/lsa.cuh) and the GIN type (cuco/gin.cuh) branch on that bit uniformly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <cuco/nccl_lsa.cuh>

namespace cuco {

constexpr int kEmuMaxRanks = 8;

// An emulated world's communicator (layout shared with cuco/runtime/emulated.py).
struct EmuComm {
  int rank;
  int size;
  int barriers;                           // barrier indices each rank keeps
  int pad;
  uint64_t* epochs;                       // [barriers]: this rank's count of each barrier
  uint64_t* inbox[kEmuMaxRanks];          // rank r's [size][barriers] arrivals, as mapped here
};

// An emulated world's window: every rank's base, as this rank maps it (CUDA IPC).
struct EmuWindow {
  char* base[kEmuMaxRanks];
};

__device__ __forceinline__ bool is_emulated(ncclWindow_t win) {
  return (reinterpret_cast<uintptr_t>(win) & 1) != 0;
}

__device__ __forceinline__ const EmuWindow& emu_window(ncclWindow_t win) {
  return *reinterpret_cast<const EmuWindow*>(reinterpret_cast<uintptr_t>(win) & ~uintptr_t(1));
}

// Every thread of the CTA calls it; returns once CTA-barrier `index` of every rank has
// arrived, with this CTA's earlier writes visible to them and theirs to it (acq_rel): the
// semantics of an ncclLsaBarrierSession / GIN world barrier of ncclCoopCta, as a flag
// exchange in IPC memory.
__device__ __forceinline__ void emu_barrier(const EmuComm& e, int index) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t epoch = e.epochs[index] + 1;  // only CTA `index` of this rank touches it
    e.epochs[index] = epoch;
    __threadfence_system();  // the CTA's writes (ordered by __syncthreads) before the arrivals
    for (int r = 0; r < e.size; ++r)
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(e.inbox[r][(size_t)e.rank * e.barriers + index])
          .store(epoch, cuda::memory_order_release);
    for (int r = 0; r < e.size; ++r) {
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system> f(e.inbox[e.rank][(size_t)r * e.barriers + index]);
      while (f.load(cuda::memory_order_acquire) < epoch) {
      }
    }
  }
  __syncthreads();
}

}  // namespace cuco
