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
#include <cuco/nccl_lsa.cuh>

#include <cuco/arena/emulated.cuh>

namespace cuco {

struct ArenaLsa {
  const ncclDevComm* comm;
  ncclWindow_t win;

  __device__ __forceinline__ bool emulated() const { return is_emulated(win); }
  __device__ __forceinline__ const EmuComm& emu() const { return *reinterpret_cast<const EmuComm*>(comm); }

  __device__ __forceinline__ int rank() const { return emulated() ? emu().rank : comm->lsaRank; }
  __device__ __forceinline__ int size() const { return emulated() ? emu().size : comm->lsaSize; }
  __device__ __forceinline__ char* at(size_t off, int r) const {
    return emulated() ? emu_window(win).base[r] + off : (char*)ncclGetLsaPointer(win, off, r);
  }

  // Every thread of the CTA calls it; returns once CTA-barrier `index` of every rank has
  // arrived, with this CTA's earlier writes visible to them and theirs to it (acq_rel).
  __device__ __forceinline__ void barrier(int index) const {
    if (emulated()) {
      emu_barrier(emu(), index);
      return;
    }
    ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), *comm, ncclTeamTagLsa(), (uint32_t)index};
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
  }
};

}  // namespace cuco
