// The zig-zag split of context-parallel attention (mirrors cuco.workloads.cp: zigzag_chunk,
// pair_kind): the sequence is cut into 2W chunks, rank r holds chunks r and 2W-1-r (its
// halves 0 and 1). Used by the attention kernel (cp_attention.cuh) and by the communication
// kernel of every CP variant (cp_attention.cu.j2: which halves a peer needs).
#pragma once

namespace cuco {
namespace cp {

__device__ __forceinline__ int zigzag_chunk(int rank, int half, int W) { return half == 0 ? rank : 2 * W - 1 - rank; }

enum Pair { kSkip = 0, kFull = 1, kDiagonal = 2 };
// What query chunk qi does with key chunk kj: nothing (masked), all of it, or its causal part.
__device__ __forceinline__ int pair_kind(int qi, int kj, bool causal) {
  if (!causal) return kFull;
  return kj < qi ? kFull : (kj == qi ? kDiagonal : kSkip);
}

}  // namespace cp
}  // namespace cuco
