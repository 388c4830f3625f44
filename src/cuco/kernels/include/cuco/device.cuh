// Small device helpers shared by every cuco kernel template: one idea each.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace cuco {

// ---- 16-byte vectors ----------------------------------------------------------
__device__ __forceinline__ uint4 load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}

// ---- element conversions ------------------------------------------------------
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }

// ---- fp32 accumulation of one 16-byte vector of T ------------------------------
template <typename T>
struct Acc16 {
  static constexpr int N = 16 / sizeof(T);
  float v[N];
  __device__ __forceinline__ Acc16() {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = 0.f;
  }
  __device__ __forceinline__ void add(uint4 raw) {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += to_float(e[i]);
  }
  // weighted: v += w * raw (a top-k combine's sum)
  __device__ __forceinline__ void add(float w, uint4 raw) {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += w * to_float(e[i]);
  }
  __device__ __forceinline__ uint4 pack() const {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = from_float<T>(v[i]);
    return raw;
  }
};

// ---- index arithmetic ---------------------------------------------------------
__device__ __forceinline__ size_t global_thread() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() { return (size_t)gridDim.x * blockDim.x; }
__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace cuco
