// Who issues a transfer, as a type: the issuer dimension of the design space in the style
// of the NCCL device API's ncclCoopThread / ncclCoopWarp / ncclCoopCta. A template picks one
// (`using Issuer = cuco::IssuerWarp;`) and writes its loops and waits once:
//   Issuer::for_units(n, f)  the units of [0, n) this thread moves
//   Issuer::part(), parts()  this issuer's index and how many there are in the grid
//   Issuer::wait(poll)       the issuer's poller runs `poll`, then the issuer goes on together
//   Issuer::leads()          whether this thread speaks for its issuer (signals, counters)
//   Issuer::wait_in<N>(poll, sync)  the same wait inside a group of N threads of a CTA (a
//                            multiple of 32; thread i of the group is threadIdx.x % N), whose
//                            own barrier `sync` ends it: warp specialised kernels (tp_fused)
#pragma once

#include <cstddef>

#include "cuco_device.cuh"

namespace cuco {

// Every thread is an issuer: units strided over the grid, every thread polls.
struct IssuerThread {
  template <typename F>
  static __device__ __forceinline__ void for_units(size_t n, F f) {
    for (size_t i = global_thread(); i < n; i += global_stride()) f(i);
  }
  static __device__ __forceinline__ size_t part() { return global_thread(); }
  static __device__ __forceinline__ size_t parts() { return global_stride(); }
  template <typename F>
  static __device__ __forceinline__ void wait(F poll) { poll(); }
  static __device__ __forceinline__ bool leads() { return true; }
  template <int N, typename F, typename Sync>
  static __device__ __forceinline__ void wait_in(F poll, Sync sync) {
    poll();
    sync();
  }
};

// A warp is an issuer: 32 consecutive units per step, lane 0 polls for the warp.
struct IssuerWarp {
  template <typename F>
  static __device__ __forceinline__ void for_units(size_t n, F f) {
    const size_t warp = global_thread() / 32, nwarps = global_stride() / 32;
    const int lane = threadIdx.x % 32;
    for (size_t seg = warp; seg * 32 < n; seg += nwarps)
      if (seg * 32 + lane < n) f(seg * 32 + lane);
  }
  static __device__ __forceinline__ size_t part() { return global_thread() / 32; }
  static __device__ __forceinline__ size_t parts() { return global_stride() / 32; }
  template <typename F>
  static __device__ __forceinline__ void wait(F poll) {
    if (threadIdx.x % 32 == 0) poll();
    __syncwarp();
  }
  static __device__ __forceinline__ bool leads() { return threadIdx.x % 32 == 0; }
  template <int N, typename F, typename Sync>
  static __device__ __forceinline__ void wait_in(F poll, Sync sync) {
    const int tid = threadIdx.x % N;
    if (tid % 32 == 0) poll();
    sync();
  }
};

// A CTA is an issuer: one contiguous slice per CTA, thread 0 polls for the CTA.
struct IssuerCta {
  template <typename F>
  static __device__ __forceinline__ void for_units(size_t n, F f) {
    const size_t per = ceil_div(n, gridDim.x), lo = blockIdx.x * per;
    const size_t hi = lo + per < n ? lo + per : n;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) f(i);
  }
  static __device__ __forceinline__ size_t part() { return blockIdx.x; }
  static __device__ __forceinline__ size_t parts() { return gridDim.x; }
  template <typename F>
  static __device__ __forceinline__ void wait(F poll) {
    if (threadIdx.x == 0) poll();
    __syncthreads();
  }
  static __device__ __forceinline__ bool leads() { return threadIdx.x == 0; }
  template <int N, typename F, typename Sync>
  static __device__ __forceinline__ void wait_in(F poll, Sync sync) {
    const int tid = threadIdx.x % N;
    if (tid == 0) poll();
    sync();
  }
};

}  // namespace cuco
