// Per-call state kept on the device, so that a CUDA graph that captured a launch replays it
// correctly: nothing a call needs changes between calls on the host side.
//
// A call's epoch (the value its flags carry) is one more than the last call's, which lives in
// a rank-local slot of the arena next to an arrival count. Thread 0 of every CTA reads the
// last epoch and then arrives; the CTA that arrives last stores the new epoch back and resets
// the count. Every CTA has read by then (its read precedes its arrival), and the next launch
// on the stream starts after this one ends, so it reads the new value. Every rank makes the
// same calls, so their counters stay in step; the host seeds them (cuco.runtime.arena).
#pragma once

#include <cstdint>
#include <cuda/atomic>

namespace cuco {

// This CTA's copy of the call's epoch (shared memory: no register held across the mainloop).
static __shared__ uint64_t call_epoch_of_cta;

// Slots at `state`: [0] the last call's epoch, [1] CTAs of this call that have read it.
// Every thread of the CTA calls it once, first thing; it ends with a CTA barrier.
__device__ __forceinline__ void call_begin(char* state) {
  if (threadIdx.x == 0) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device> last(*reinterpret_cast<uint64_t*>(state));
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device> arrived(*reinterpret_cast<uint64_t*>(state + 8));
    const uint64_t epoch = last.load(cuda::memory_order_relaxed) + 1;
    call_epoch_of_cta = epoch;
    const uint64_t ctas = (uint64_t)gridDim.x * gridDim.y * gridDim.z;
    if (arrived.fetch_add(1, cuda::memory_order_acq_rel) == ctas - 1) {  // every CTA has read
      arrived.store(0, cuda::memory_order_relaxed);
      last.store(epoch, cuda::memory_order_relaxed);
    }
  }
  __syncthreads();
}

// The epoch of the call in progress (after call_begin).
__device__ __forceinline__ uint64_t call_epoch() { return call_epoch_of_cta; }

}  // namespace cuco
