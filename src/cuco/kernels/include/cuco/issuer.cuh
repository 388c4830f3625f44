// Who issues a transfer, as a type: the issuer dimension of the design space in the style
// of the NCCL device API's ncclCoopThread / ncclCoopWarp / ncclCoopCta. A template picks one
// (`using Issuer = cuco::IssuerWarp;`) and writes its loops, waits and calls once:
//   Issuer::for_units(n, f)  the units of [0, n) this thread moves
//   Issuer::part(), parts()  this issuer's index and how many there are in the grid
//   Issuer::wait(poll)       the issuer's poller runs `poll`, then the issuer goes on together
//   Issuer::leads()          whether this thread speaks for its issuer (signals, counters)
//   Issuer::wait_in<N>(poll, sync)  the same wait inside a group of N threads of a CTA (a
//                            multiple of 32; thread i of the group is threadIdx.x % N), whose
//                            own barrier `sync` ends it: warp specialised kernels (tp_fused)
//   Issuer::first_in_cta()   whether this thread belongs to its CTA's first issuer (a CTA
//                            whose transfers one issuer makes: GIN puts)
//   Issuer::coop             NCCL's cooperative group of one issuer, what NCCL's device calls
//                            take (ncclGin::put, ...); complete where <nccl_device.h> is included
// Calls that other libraries scope by issuer take the issuer itself (cuco/arena/nvshmem.cuh:
// put_signal_nbi(Issuer{}, ...) is NVSHMEM's per-thread, _warp or _block call).
#pragma once

#include <cstddef>

#include <cuco/device.cuh>

// NCCL's cooperative groups (nccl_device/coop.h: ncclCoopThread is ncclCoopTile<1>,
// ncclCoopWarp ncclCoopTile<32>), declared so that an issuer can name its own without
// including NCCL: kernels built without NCCL (NVSHMEM's) include this header too.
template <int nThreadsPow2>
struct ncclCoopTile;
struct ncclCoopCta;

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
  static __device__ __forceinline__ bool first_in_cta() { return threadIdx.x == 0; }
  using coop = ncclCoopTile<1>;  // ncclCoopThread
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
  static __device__ __forceinline__ bool first_in_cta() { return threadIdx.x < 32; }
  using coop = ncclCoopTile<32>;  // ncclCoopWarp
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
  static __device__ __forceinline__ bool first_in_cta() { return true; }
  using coop = ncclCoopCta;
};

}  // namespace cuco
