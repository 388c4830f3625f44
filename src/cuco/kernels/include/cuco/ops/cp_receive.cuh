// Where a rank's receive buffer (the arena's kvg region) holds its peers' K and V (mirrors
// cuco.workloads.cp.receive_layout; a CPU test runs both). Rows are tokens of H x D elements.
//
// By rank (peer_calls=per_peer, core=own): slot src holds src's K shard (2C rows: its halves 0
// and 1) then its V shard, so one peer's K is contiguous.
// Grouped (peer_calls=grouped): all K first, then all V, each ordered by the distance
// pos = (dst - src) mod W (1..W-1, the order dst attends its peers in): every peer's half 0
// at pos 1, 2, ..., W-1, then every peer's half 1 at pos W-1, ..., 1. Every peer's K is then
// one run of rows (non-causal), and under the causal zig-zag mask the peers before dst
// (half 0, pos 1..dst) and those after it (both halves, pos dst+1..W-1) are one run each.
#pragma once

namespace cuco {
namespace cp {

// First K row of half `half` of rank src's shard in rank dst's buffer (chunk: C rows).
__host__ __device__ inline long long receive_row(int dst, int src, int half, int W, int chunk, bool grouped) {
  if (!grouped) return (long long)src * 4 * chunk + (long long)half * chunk;
  const int pos = ((dst - src) % W + W) % W;
  return (long long)(half == 0 ? pos - 1 : 2 * W - 2 - pos) * chunk;
}

// Rows from a K row to the V row of the same token.
__host__ __device__ inline long long v_rows_after_k(int W, int chunk, bool grouped) {
  return grouped ? (long long)(W - 1) * 2 * chunk : 2LL * chunk;
}

}  // namespace cp
}  // namespace cuco
