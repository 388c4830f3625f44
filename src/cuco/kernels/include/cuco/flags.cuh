// Epoch flags: 8-byte slots whose value is the call (epoch) that last raised them. A writer
// publishes its data with a release store, or adds to a counter; a reader polls with acquire
// loads until the slot reaches the epoch it needs. System scope: peers write these over NVLink.
#pragma once

#include <cstdint>
#include <cuda/atomic>

namespace cuco {

__device__ __forceinline__ void flag_set(uint64_t* f, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*f).store(v, cuda::memory_order_release);
}

__device__ __forceinline__ void flag_add(uint64_t* f, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*f).fetch_add(v, cuda::memory_order_release);
}

// Returns once the slot holds at least `v`.
__device__ __forceinline__ void flag_wait(uint64_t* f, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> r(*f);
  while (r.load(cuda::memory_order_acquire) < v) {
  }
}

}  // namespace cuco
