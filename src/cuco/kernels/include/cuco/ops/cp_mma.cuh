// Tensor-core building blocks of the context-parallel attention kernel (sm_80+ mma.sync):
// 16-byte async copies into swizzled shared tiles, ldmatrix fragment loads and the
// m16n8k16 product with fp32 accumulation. One idea each; cuco/ops/cp_attention.cuh composes them.
//
// Fragment layouts (g = lane / 4, t = lane % 4), as PTX documents for m16n8k16:
//   A (16x16, row): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8, f32):  c0 c1 (g, 2t..2t+1)  c2 c3 (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace cuco {
namespace cp {

// ---- shared tiles: rows of kD elements, 16-byte chunks XOR-swizzled by row % 8 ----------
// Eight consecutive rows of one logical chunk land in eight different bank groups, so
// ldmatrix (8 row addresses per matrix) and cp.async rows are conflict-free.
template <int kD>
__device__ __forceinline__ int swz(int row, int col) {
  return row * kD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, L2 only (.cg: data a peer stored over NVLink is never read
// through a stale L1 line).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Rows [0, kRows) of a [rows, kD] tile whose row r starts at src + r * ld (elements), into a
// swizzled shared tile; every thread of the CTA (kThreads) takes its share of 16-byte chunks.
template <typename T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile(T* dst, const T* src, size_t ld) {
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    cp_async16(dst + swz<kD>(r, c), src + r * ld + c);
  }
}

// ---- fragments ------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// A fragment of rows [0, 16) x cols [k0, k0 + 16) of a swizzled tile (row-major operand).
template <int kD, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + swz<kD>(row0 + lane % 16, k0 + (lane / 16) * 8));
}
// B fragments of two n8 tiles (rows n0.. n0+16 of a [n, k] tile: K for Q K^T), k0.. k0+16:
// b[0..1] for rows n0..n0+8, b[2..3] for n0+8..n0+16.
template <int kD, typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, tile + swz<kD>(n0 + (lane / 16) * 8 + lane % 8, k0 + ((lane / 8) & 1) * 8));
}
// B fragments of two n8 tiles from a [k, n] tile (V for P V): rows k0..k0+16, cols n0..n0+16;
// b[0..1] for cols n0..n0+8, b[2..3] for n0+8..n0+16.
template <int kD, typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, tile + swz<kD>(k0 + lane % 16, n0 + (lane / 16) * 8));
}

// ---- the product: c += a b (16x8x16, fp32 accumulate) ------------------------------------
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one register of two T (the lower column in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace cp
}  // namespace cuco
