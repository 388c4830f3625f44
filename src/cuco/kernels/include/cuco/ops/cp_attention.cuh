// Context-parallel flash attention over a zig-zag split (cuco/ops/cp_mma.cuh for the tensor cores).
//
// The sequence is cut into 2W chunks of C tokens; rank r holds chunks r and 2W-1-r (its "halves"
// 0 and 1), so under a causal mask every rank does the same work. K/V of every rank sit in W
// "slots" ([2C, H, D] each, slot r = rank r's shard). A work item is one q tile (kBr rows of one
// half) of one head; it walks the K/V tiles it needs slot by slot (own slot first, then
// me-1, me-2, ... : the order peers' data arrives in), skipping every chunk the mask empties,
// keeps the online-softmax state (O accumulator, row max, row sum) in registers across all of
// them and writes the normalised output once.
//
// A fused call runs in two phases over the same items: first every item over the local slot
// (no waits: that hides the transfer), its state parked in a scratch buffer in fragment order;
// then every item that has remote tiles resumes its state and walks the peers' slots, waiting on
// each transfer chunk's arrival flag before its first tile. The host program runs one phase
// over all slots of an all-gathered buffer, with no flags: the same kernel.
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include <cuco/ops/cp_mma.cuh>
#include <cuco/ops/cp_split.cuh>

namespace cuco {
namespace cp {

enum Phase { kAll = 0, kLocal = 1, kRemote = 2 };

// The K/V tiles one q tile needs in one phase, in order: slot index 0 is this rank, index k is
// rank me-k; each slot's halves 0 and 1 are segments of whole kBc-token tiles.
template <int kBr, int kBc>
struct TileWalk {
  int me, W, C, qi, q0c;  // q0c: the q tile's first row within its chunk
  bool causal;
  int seg, end, t;        // segment = slot index * 2 + half; tile t within it

  __device__ TileWalk(int me_, int W_, int C_, int qi_, int q0c_, bool causal_, Phase ph)
      : me(me_), W(W_), C(C_), qi(qi_), q0c(q0c_), causal(causal_), t(0) {
    seg = ph == kRemote ? 2 : 0;
    end = ph == kLocal ? 2 : 2 * W;
    settle();
  }
  __device__ int slot(int s) const { return (me - s / 2 + W) % W; }
  __device__ int kind(int s) const { return pair_kind(qi, zigzag_chunk(slot(s), s % 2, W), causal); }
  __device__ int tiles(int s) const {
    const int k = kind(s);
    return k == kFull ? C / kBc : (k == kDiagonal ? (q0c + kBr) / kBc : 0);
  }
  __device__ void settle() {
    while (seg < end && t >= tiles(seg)) { ++seg; t = 0; }
  }
  __device__ bool valid() const { return seg < end; }
  __device__ void advance() { ++t; settle(); }
  __device__ int cur_slot() const { return slot(seg); }
  __device__ int token() const { return (seg % 2) * C + t * kBc; }  // first key, slot-relative
  __device__ int key_in_chunk() const { return t * kBc; }
  // Does any key of this tile lie after a query of the q tile (a diagonal tile)?
  __device__ bool masked() const { return kind(seg) == kDiagonal && t * kBc + kBc - 1 > q0c; }
};

// What one call of the kernel reads and writes.
template <typename T>
struct Args {
  const T* q;              // [2C, H, D] this rank's queries (halves 0 and 1)
  T* out;                  // [2C, H, D]
  const uint64_t* slots;   // [2W] device addresses: K of slot r at [r], V at [W + r]
  const uint64_t* flags;   // arrival counters [slot * n_chunks + c]; null: nothing to wait for
  uint64_t need;           // a chunk has arrived when its counter reaches this
  int chunk_rows;          // tokens per transfer chunk (a multiple of kBc)
  int n_chunks;            // transfer chunks per slot
  float4* scratch;         // parked state of every item (two-phase calls)
  int me, W, C;
};

template <typename T, int kD, int kHeads, bool kCausal>
struct Attention {
  static constexpr int kBr = 128, kBc = 64, kWarps = 8, kThreads = kWarps * 32;
  static constexpr int kNt = kBc / 8;  // n8 tiles of S per warp
  static constexpr int kOt = kD / 8;   // n8 tiles of O per warp
  static constexpr int kKs = kD / 16;  // k16 steps of Q K^T
  static constexpr size_t kLd = (size_t)kHeads * kD;  // elements between tokens
  static constexpr size_t kSmemBytes = (size_t)(kBr + 4 * kBc) * kD * sizeof(T);
  //: float4s of parked state per item: kOt O tiles and (m, m, l, l) per thread
  static constexpr size_t kParked = (size_t)(kOt + 1) * kThreads;
  static_assert(kD % 16 == 0 && kD <= 256, "head_dim");

  struct State {
    float o[kOt][4];
    float m[2], l[2];  // rows g and g + 8 of this warp's 16; l: this thread's partial sum
  };

  const Args<T>& a;
  T* sQ;
  T* sK;  // two buffers of [kBc, kD]
  T* sV;

  __device__ int items() const { return (2 * a.C / kBr) * kHeads; }

  // Item -> (q row of this rank's shard, head): the later half's tiles (more keys) first.
  __device__ void item_at(int item, int& row0, int& head, int& half) const {
    const int per_half = a.C / kBr, qt = item / kHeads;
    head = item % kHeads;
    half = qt < per_half ? 1 : 0;
    row0 = half * a.C + (qt % per_half) * kBr;
  }

  __device__ TileWalk<kBr, kBc> walk(int row0, int half, Phase ph) const {
    return TileWalk<kBr, kBc>(a.me, a.W, a.C, zigzag_chunk(a.me, half, a.W), row0 - half * a.C, kCausal, ph);
  }

  // ---- waiting for a peer's chunk --------------------------------------------------------
  // Before the first tile of each transfer chunk of a peer: thread 0 polls its counter, the
  // CTA goes on together (uniform: every thread tracks the same last chunk).
  __device__ void wait_ready(const TileWalk<kBr, kBc>& w, int& last) const {
    if (a.flags == nullptr || w.cur_slot() == a.me) return;
    const int idx = w.cur_slot() * a.n_chunks + w.token() / a.chunk_rows;
    if (idx == last) return;
    last = idx;
    if (threadIdx.x == 0) {
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system> f(*const_cast<uint64_t*>(a.flags + idx));
      while (f.load(cuda::memory_order_acquire) < a.need) {
      }
      __threadfence();
    }
    __syncthreads();
  }

  __device__ void load_kv(const TileWalk<kBr, kBc>& w, int head, int buf) const {
    const size_t off = (size_t)w.token() * kLd + (size_t)head * kD;
    const T* k = reinterpret_cast<const T*>(a.slots[w.cur_slot()]) + off;
    const T* v = reinterpret_cast<const T*>(a.slots[a.W + w.cur_slot()]) + off;
    load_tile<T, kBc, kD, kThreads>(sK + buf * kBc * kD, k, kLd);
    load_tile<T, kBc, kD, kThreads>(sV + buf * kBc * kD, v, kLd);
    cp_async_commit();
  }

  // ---- the state ---------------------------------------------------------------------------
  __device__ static void init(State& st) {
#pragma unroll
    for (int j = 0; j < kOt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[j][e] = 0.f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
  }
  __device__ void park(const State& st, int item) const {
    float4* p = a.scratch + item * kParked + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kOt; ++j) p[j * kThreads] = make_float4(st.o[j][0], st.o[j][1], st.o[j][2], st.o[j][3]);
    p[kOt * kThreads] = make_float4(st.m[0], st.m[1], st.l[0], st.l[1]);
  }
  __device__ void resume(State& st, int item) const {
    const float4* p = a.scratch + item * kParked + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kOt; ++j) {
      const float4 v = p[j * kThreads];
      st.o[j][0] = v.x, st.o[j][1] = v.y, st.o[j][2] = v.z, st.o[j][3] = v.w;
    }
    const float4 v = p[kOt * kThreads];
    st.m[0] = v.x, st.m[1] = v.y, st.l[0] = v.z, st.l[1] = v.w;
  }

  // The normalised rows of this warp, written once.
  __device__ void finish(State& st, int row0, int head) const {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = st.l[r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = 1.f / l;
      T* dst = a.out + (size_t)(row0 + warp * 16 + g + 8 * r) * kLd + (size_t)head * kD + 2 * t;
#pragma unroll
      for (int j = 0; j < kOt; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8) = pack2<T>(st.o[j][2 * r] * inv, st.o[j][2 * r + 1] * inv);
    }
  }

  // ---- one K/V tile: S = Q K^T, online softmax, O += P V --------------------------------------
  __device__ static float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }

  __device__ void attend_tile(State& st, const uint32_t (&qf)[kKs][4], const T* k, const T* v, bool mask,
                              int q0c, int k0c) const {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    float s[kNt][4];
#pragma unroll
    for (int j = 0; j < kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKs; ++ks)
#pragma unroll
      for (int n2 = 0; n2 < kNt / 2; ++n2) {
        uint32_t b[4];
        load_b_nk<kD>(b, k, n2 * 16, ks * 16);
        mma16816<T>(s[2 * n2], qf[ks], b[0], b[1]);
        mma16816<T>(s[2 * n2 + 1], qf[ks], b[2], b[3]);
      }
    if (mask) {  // keys after the query (both chunk-relative) do not count
#pragma unroll
      for (int j = 0; j < kNt; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qrow = q0c + warp * 16 + g + (e >= 2 ? 8 : 0), key = k0c + j * 8 + 2 * t + (e & 1);
          if (key > qrow) s[j][e] = -INFINITY;
        }
    }
    const float sl2 = 1.4426950408889634f * rsqrtf((float)kD);  // log2(e) / sqrt(D)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = st.m[r];
#pragma unroll
      for (int j = 0; j < kNt; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx * sl2;  // a row with no key yet
      const float alpha = exp2_approx(st.m[r] * sl2 - base);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        s[j][2 * r] = exp2_approx(fmaf(s[j][2 * r], sl2, -base));
        s[j][2 * r + 1] = exp2_approx(fmaf(s[j][2 * r + 1], sl2, -base));
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      st.l[r] = st.l[r] * alpha + sum;
      st.m[r] = mx;
#pragma unroll
      for (int j = 0; j < kOt; ++j) st.o[j][2 * r] *= alpha, st.o[j][2 * r + 1] *= alpha;
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t p[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int d2 = 0; d2 < kOt / 2; ++d2) {
        uint32_t b[4];
        load_b_kn<kD>(b, v, kk * 16, d2 * 16);
        mma16816<T>(st.o[2 * d2], p, b[0], b[1]);
        mma16816<T>(st.o[2 * d2 + 1], p, b[2], b[3]);
      }
    }
  }

  // ---- one item over one phase's tiles ------------------------------------------------------
  __device__ void walk_tiles(State& st, int row0, int head, int half, Phase ph) const {
    TileWalk<kBr, kBc> w = walk(row0, half, ph);
    if (!w.valid()) return;
    int last = -1;
    load_tile<T, kBr, kD, kThreads>(sQ, a.q + (size_t)row0 * kLd + (size_t)head * kD, kLd);
    wait_ready(w, last);
    load_kv(w, head, 0);
    cp_async_wait_all();
    __syncthreads();
    uint32_t qf[kKs][4];
#pragma unroll
    for (int ks = 0; ks < kKs; ++ks) load_a<kD>(qf[ks], sQ, (threadIdx.x / 32) * 16, ks * 16);
    const int q0c = row0 - half * a.C;
    for (int buf = 0;; buf ^= 1) {
      const bool mask = w.masked();
      const int k0c = w.key_in_chunk();
      w.advance();
      const bool more = w.valid();
      if (more) {
        wait_ready(w, last);
        load_kv(w, head, buf ^ 1);
      }
      attend_tile(st, qf, sK + buf * kBc * kD, sV + buf * kBc * kD, mask, q0c, k0c);
      if (!more) break;
      cp_async_wait_all();
      __syncthreads();
    }
    __syncthreads();  // every warp is done with sQ, sK and sV before the next item loads
  }

  // One phase over every item of this CTA (static round robin over a persistent grid).
  __device__ void run(Phase ph) const {
    for (int item = blockIdx.x; item < items(); item += gridDim.x) {
      int row0, head, half;
      item_at(item, row0, head, half);
      const bool remote = walk(row0, half, kRemote).valid();
      State st;
      if (ph == kRemote) {
        if (!remote) continue;
        resume(st, item);
      } else {
        init(st);
      }
      walk_tiles(st, row0, head, half, ph);
      if (ph == kLocal && remote) park(st, item);
      else finish(st, row0, head);
    }
  }
};

}  // namespace cp
}  // namespace cuco
