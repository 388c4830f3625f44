// Where a rank's receive buffer (the arena's kvg region) holds the K and V of every rank
// (mirrors cuco.workloads.cp.receive_layout; a CPU test runs both). Rows are tokens of H x D
// elements.
//
// By rank (peer_calls=per_peer, core=own): slot src holds src's K shard (2C rows: its halves 0
// and 1) then its V shard, so one peer's K is contiguous.
// Grouped (peer_calls=grouped and all_keys): all K first, then all V, each ordered by the
// distance pos = (dst - src) mod W (the order dst attends its peers in): every peer's half 0
// at pos 1, 2, ..., W-1, then every peer's half 1 at pos W-1, ..., 1, then dst's own halves 0
// and 1 (pos 0: copied there by the host's all_keys plan, never sent). Every peer's K is then
// one run of rows (non-causal), every rank's K with the own shard after it, and under the
// causal zig-zag mask the peers before dst (half 0, pos 1..dst) and those after it (both
// halves, pos dst+1..W-1) are one run each.
#pragma once

namespace cuco {
namespace cp {

// First K row of half `half` of rank src's shard in rank dst's buffer (chunk: C rows).
__host__ __device__ inline long long receive_row(int dst, int src, int half, int W, int chunk, bool grouped) {
  if (!grouped) return (long long)src * 4 * chunk + (long long)half * chunk;
  const int pos = ((dst - src) % W + W) % W;
  if (pos == 0) return (long long)(2 * W - 2 + half) * chunk;
  return (long long)(half == 0 ? pos - 1 : 2 * W - 2 - pos) * chunk;
}

// Rows from a K row to the V row of the same token.
__host__ __device__ inline long long v_rows_after_k(int W, int chunk, bool grouped) {
  return grouped ? 2LL * W * chunk : 2LL * chunk;
}

}  // namespace cp
}  // namespace cuco
