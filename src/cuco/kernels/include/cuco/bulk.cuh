// cuco/bulk.cuh -- TMA tensor stores from shared memory, as bulk groups of the issuing thread.
//
// A tile staged in shared memory goes to global memory through the SM's TMA unit, one box at a
// time, without a register or a load of the issuing warps: the epilogue of tiles whose output
// is this rank's own (tp_fused's allgather_gemm and its profile build). The tensor map is the
// host's (cuTensorMapEncodeTiled), passed in the kernel's __grid_constant__ parameters; a box is
// clipped at the map's edges. Writers of the staged tile make it visible to the TMA unit first
// (cutlass::arch::fence_view_async_shared, then a barrier).
#pragma once
#include <cstdint>

namespace cuco {

// One 2-D box of `map` at (x, y) (x the contiguous dimension), read from shared memory at `smem`.
__device__ __forceinline__ void tma_store_2d(const void* map, int x, int y, uint32_t smem) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
               :: "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem) : "memory");
}

// The stores issued since the last commit, as one bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// This thread's bulk groups but the last `Pending` have read their shared memory (it may be
// written again): 0, all of them; a ring of k staging slots waits with k - 1 before reusing one.
template <int Pending = 0>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(Pending) : "memory"); }

// This thread's bulk groups have written global memory.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

}  // namespace cuco
