// Per-call state kept on the device, so that a CUDA graph that captured a launch replays it
// correctly: nothing a call needs changes between calls on the host side.
//
// A call's epoch (the value its flags carry) is one more than the last call's, which lives in
// a rank-local slot of the arena next to an arrival count. One thread of every CTA reads the
// last epoch and then arrives; the CTA that arrives last stores the new epoch back and resets
// the count. Every CTA has read by then (its read precedes its arrival), and the next launch
// on the stream starts after this one ends, so it reads the new value. Every rank makes the
// same calls, so their counters stay in step; the host seeds them (cuco.runtime.arena).
//
// The arrival is an atomic on one address that every CTA of the grid makes at once: about a
// microsecond before the last one returns (bench/logs/gemm_overhead_probe_w1_h200_26cf46d.log).
// So a CTA need not wait for it: call_pending() before a CTA barrier and call_take() by one
// thread after it let the others go on, and call_epoch() waits where the epoch is first used
// (in a GEMM's epilogue, long after). call_begin() is the waiting form, for a CTA whose first
// act needs the epoch.
#pragma once

#include <cstdint>
#include <cuda/atomic>

namespace cuco {

// This CTA's copy of the call's epoch (shared memory: no register held across the mainloop).
static __shared__ uint64_t call_epoch_of_cta;

// This CTA's epoch slot: 0 until call_take() stored the epoch (epochs start at 1).
__device__ __forceinline__ cuda::atomic_ref<uint64_t, cuda::thread_scope_block> call_epoch_slot() {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_block>(call_epoch_of_cta);
}

// One thread, before a CTA barrier that every reader of call_epoch() passes after: the epoch
// is not taken yet (shared memory holds whatever an earlier CTA left there).
__device__ __forceinline__ void call_pending() { call_epoch_slot().store(0, cuda::memory_order_relaxed); }

// One thread of the CTA, once: read the last call's epoch, give this call's to the CTA, and
// arrive. Slots at `state`: [0] the last call's epoch, [1] CTAs of this call that have read it.
__device__ __forceinline__ void call_take(char* state) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device> last(*reinterpret_cast<uint64_t*>(state));
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device> arrived(*reinterpret_cast<uint64_t*>(state + 8));
  const uint64_t epoch = last.load(cuda::memory_order_relaxed) + 1;
  call_epoch_slot().store(epoch, cuda::memory_order_relaxed);
  const uint64_t ctas = (uint64_t)gridDim.x * gridDim.y * gridDim.z;
  if (arrived.fetch_add(1, cuda::memory_order_acq_rel) == ctas - 1) {  // every CTA has read
    arrived.store(0, cuda::memory_order_relaxed);
    last.store(epoch, cuda::memory_order_relaxed);
  }
}

// The waiting form: every thread of the CTA calls it once, first thing; it ends with a CTA barrier.
__device__ __forceinline__ void call_begin(char* state) {
  if (threadIdx.x == 0) call_take(state);
  __syncthreads();
}

// The epoch of the call in progress: after call_begin(), or after call_pending() and the
// barrier that follows it, once call_take() has stored it (waited for here: the value alone
// is passed, so a relaxed read is enough).
__device__ __forceinline__ uint64_t call_epoch() {
  uint64_t epoch;
  while ((epoch = call_epoch_slot().load(cuda::memory_order_relaxed)) == 0) {
  }
  return epoch;
}

}  // namespace cuco
