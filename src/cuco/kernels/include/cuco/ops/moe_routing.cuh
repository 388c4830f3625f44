// MoE routing primitives for one CTA: from a rank's (token, k) -> expert ids to where each
// pair's row lives. The layout they compute is cuco.workloads.moe.routing_tables (numpy), the
// one the CPU tests check against a brute-force build:
//   rank of pair p   = how many earlier pairs of this rank picked the same expert (stable);
//   owner's buffer   = expert-major: expert e's rows, then e+1's; inside one expert, the
//                      sources' rows in rank order; inside one source, its pairs in order.
// Each call is made by every thread of the CTA (they synchronise inside).
#pragma once
#include <cub/block/block_scan.cuh>
#include <cuco/device.cuh>

namespace cuco {
namespace moe {

template <int kExperts, int kWarps>
struct Routing {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPer = (kExperts + 1 + kThreads - 1) / kThreads;  // scan items per thread
  using Scan = cub::BlockScan<int, kThreads>;

  struct Storage {
    int cnt[kWarps][kExperts];  // per warp, then per-warp exclusive bases
    int count[kExperts];        // this rank's pairs per expert; later each expert's base row
    int start[kExperts + 1];    // exclusive prefix sums over experts
    typename Scan::TempStorage scan;
  };

  // out[0..kExperts] = exclusive prefix sums of in[0..kExperts) (out[kExperts] = the total).
  static __device__ void expert_starts(Storage& ss, const int* in, int* out) {
    int v[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = threadIdx.x * kPer + i;
      v[i] = e < kExperts ? in[e] : 0;
    }
    __syncthreads();
    Scan(ss.scan).ExclusiveSum(v, v);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = threadIdx.x * kPer + i;
      if (e <= kExperts) out[e] = v[i];
    }
    __syncthreads();
  }

  // dest[p] = rank of pair p among this rank's pairs of its expert; ss.count = pairs per expert.
  static __device__ void rank_pairs(Storage& ss, const int* ids, int pairs, int* dest) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < kWarps * kExperts; i += blockDim.x) (&ss.cnt[0][0])[i] = 0;
    __syncthreads();
    const int seg = (pairs + kWarps - 1) / kWarps, lo = warp * seg;
    const int hi = lo + seg < pairs ? lo + seg : pairs;
    for (int b = lo; b < hi; b += 32) {  // a warp ranks 32 pairs a step, in order
      const int p = b + lane;
      const int e = p < hi ? ids[p] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int before = __popc(same & ((1u << lane) - 1));
      const int prior = e >= 0 ? ss.cnt[warp][e] : 0;
      __syncwarp();
      if (e >= 0) {
        dest[p] = prior + before;
        if (before == 0) ss.cnt[warp][e] = prior + __popc(same);
      }
      __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kExperts; e += blockDim.x) {  // warps' bases, in warp order
      int s = 0;
      for (int w = 0; w < kWarps; ++w) {
        const int c = ss.cnt[w][e];
        ss.cnt[w][e] = s;
        s += c;
      }
      ss.count[e] = s;
    }
    __syncthreads();
    for (int p = lo + lane; p < hi; p += 32) dest[p] += ss.cnt[warp][ids[p]];
    __syncthreads();
  }

  // order[ss.start[e] + dest[p]] = p: this rank's pairs sorted by expert (stable).
  static __device__ void place(Storage& ss, const int* ids, int pairs, const int* dest, int* order) {
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) order[ss.start[ids[p]] + dest[p]] = p;
    __syncthreads();
  }

  // From every rank's counts ([ranks][kExperts], written by peers: read past the caches):
  // ss.count[e] = the row where this rank's pairs of expert e start in e's owner's buffer;
  // local_start[j] (j <= local) = where this rank's local expert j's rows start in its own.
  static __device__ void destinations(Storage& ss, const int* counts, int ranks, int me, int local,
                                      int* local_start) {
    __syncthreads();
    for (int e = threadIdx.x; e < kExperts; e += blockDim.x) {
      int total = 0, before = 0;
      for (int s = 0; s < ranks; ++s) {
        const int c = __ldcv(counts + (size_t)s * kExperts + e);
        total += c;
        before += s < me ? c : 0;
      }
      ss.cnt[0][e] = total;
      ss.count[e] = before;
    }
    __syncthreads();
    expert_starts(ss, ss.cnt[0], ss.start);  // over all experts; each owner's block rebased below
    for (int e = threadIdx.x; e < kExperts; e += blockDim.x)
      ss.count[e] += ss.start[e] - ss.start[(e / local) * local];
    for (int j = threadIdx.x; j <= local; j += blockDim.x)
      local_start[j] = ss.start[me * local + j] - ss.start[me * local];
    __syncthreads();
  }

  // dest[p] += ss.count[ids[p]]: a pair's rank becomes its row in its owner's buffer.
  static __device__ void offset(Storage& ss, const int* ids, int pairs, int* dest) {
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) dest[p] += ss.count[ids[p]];
  }
};

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

// A 16-byte load that bypasses L1 (a peer wrote the bytes since this SM last looked).
__device__ __forceinline__ uint4 load16_fresh(const void* p) {
  return __ldcv(reinterpret_cast<const uint4*>(p));
}

}  // namespace moe
}  // namespace cuco
