// Merge of partial attention outputs by their log-sum-exps (the library route of
// context-parallel attention: one library call per phase, each over some of the keys).
//
// Each partial i covers `rows` consecutive rows of the shard from `row0` (as `batch_rows`-row
// entries of a batch) and gives, per row and head, its normalised output O_i (in T) and
// L_i = log(sum of exp(scaled scores)) over its keys (fp32). The merged output of a row is
//   O = sum_i exp(L_i - M) O_i / sum_i exp(L_i - M),  M = max_i L_i,
// accumulated in fp32 and written once as T into out [rows, heads, kD].
// cuco.workloads.cp.library (PART, parts_table) writes the table this reads.
#pragma once

#include <stdint.h>

#include <cuco/device.cuh>

namespace cuco {
namespace merge {

constexpr int kMaxParts = 16;

struct Part {
  uint64_t o, lse;                 // device addresses of the partial's output and log-sum-exp
  int64_t o_sb, o_ss, o_sh;        // output strides (elements): batch entry, row, head
  int64_t l_sb, l_ss, l_sh;        // log-sum-exp strides: batch entry, row, head
  int32_t row0, rows, batch_rows, pad;
};
struct Parts {  // passed by value: the table of one merge
  Part p[kMaxParts];
  int32_t n, pad[3];
};
static_assert(sizeof(Part) == 80, "Part: cuco.workloads.cp.library.PART");
static_assert(sizeof(Parts) == 80 * kMaxParts + 16, "Parts: cuco.workloads.cp.library.parts_dtype");

// Where row `row` of the shard sits in partial `p` (false: p does not cover it).
__device__ __forceinline__ bool locate(const Part& p, int row, int64_t& b, int64_t& s) {
  const int r = row - p.row0;
  if (r < 0 || r >= p.rows) return false;
  b = r / p.batch_rows;
  s = r % p.batch_rows;
  return true;
}

// Every (row, head) of `rows` x `heads`, kD / (16 / sizeof(T)) threads each (one 16-byte
// vector of the head dim per thread); grid-stride over items.
template <typename T, int kD>
__device__ __forceinline__ void merge_rows(const Parts& ps, T* out, int rows, int heads) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kLanes = kD / kVec;
  static_assert(kD % kVec == 0 && (256 % kLanes) == 0, "head_dim");
  const size_t items = (size_t)rows * heads;
  const int lane = threadIdx.x % kLanes;
  for (size_t it = global_thread() / kLanes; it < items; it += global_stride() / kLanes) {
    const int row = (int)(it / heads), h = (int)(it % heads);
    float m = -INFINITY;
    for (int i = 0; i < ps.n; ++i) {
      int64_t b, s;
      if (!locate(ps.p[i], row, b, s)) continue;
      const float* l = reinterpret_cast<const float*>(ps.p[i].lse);
      m = fmaxf(m, l[b * ps.p[i].l_sb + s * ps.p[i].l_ss + h * ps.p[i].l_sh]);
    }
    Acc16<T> acc;
    float sum = 0.f;
    for (int i = 0; i < ps.n; ++i) {
      const Part& p = ps.p[i];
      int64_t b, s;
      if (!locate(p, row, b, s)) continue;
      const float wgt = __expf(reinterpret_cast<const float*>(p.lse)[b * p.l_sb + s * p.l_ss + h * p.l_sh] - m);
      sum += wgt;
      const T* o = reinterpret_cast<const T*>(p.o) + b * p.o_sb + s * p.o_ss + h * p.o_sh + lane * kVec;
      acc.add(wgt, load16(o));
    }
    const float inv = 1.f / sum;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc.v[e] *= inv;
    store16(out + ((size_t)row * heads + h) * kD + lane * kVec, acc.pack());
  }
}

}  // namespace merge
}  // namespace cuco
