// The symmetric arena through an NCCL window (LSA): every rank's buffers, reached with
// ncclGetLsaPointer. `at(off, r)` is rank r's byte `off` as this rank maps it; `barrier(i)`
// meets CTA-barrier `i` of every rank (an ncclLsaBarrierSession of ncclCoopCta).
//
// The same build also runs in an emulated world (W ranks as W processes sharing one GPU,
// cuco.runtime.emulated): NCCL offers no LSA peers across the "hosts" those ranks claim, so
// the runtime passes, in place of the ncclDevComm and the window, an EmuComm and an
// EmuWindow whose handle carries a tag bit. Every rank's window is then a table of base
// pointers mapped through CUDA IPC, and the barrier is a flag exchange in IPC memory with the
// same acquire/release semantics. One uniform branch per call decides; kernels never see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <nccl_device.h>

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

struct ArenaLsa {
  const ncclDevComm* comm;
  ncclWindow_t win;

  __device__ __forceinline__ bool emulated() const { return (reinterpret_cast<uintptr_t>(win) & 1) != 0; }
  __device__ __forceinline__ const EmuComm& emu() const { return *reinterpret_cast<const EmuComm*>(comm); }
  __device__ __forceinline__ const EmuWindow& emu_window() const {
    return *reinterpret_cast<const EmuWindow*>(reinterpret_cast<uintptr_t>(win) & ~uintptr_t(1));
  }

  __device__ __forceinline__ int rank() const { return emulated() ? emu().rank : comm->lsaRank; }
  __device__ __forceinline__ int size() const { return emulated() ? emu().size : comm->lsaSize; }
  __device__ __forceinline__ char* at(size_t off, int r) const {
    return emulated() ? emu_window().base[r] + off : (char*)ncclGetLsaPointer(win, off, r);
  }

  // Every thread of the CTA calls it; returns once CTA-barrier `index` of every rank has
  // arrived, with this CTA's earlier writes visible to them and theirs to it (acq_rel).
  __device__ __forceinline__ void barrier(int index) const {
    if (!emulated()) {
      ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), *comm, ncclTeamTagLsa(), (uint32_t)index};
      bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
      return;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const EmuComm& e = emu();
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
};

}  // namespace cuco
