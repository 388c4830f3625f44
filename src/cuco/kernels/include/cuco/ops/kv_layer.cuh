// The element-wise and row-wise steps of a pre-norm transformer layer (the KV-transfer
// workload's prefill compute); the GEMMs around them are cuBLAS. Each reads and writes T
// (bf16, fp16 or float: the fp32 twin of the layer is the reference) and works in fp32.
#pragma once

#include <cuco/device.cuh>

namespace cuco {
namespace kv {

constexpr int kRowThreads = 256;  // threads of the row kernels (one CTA per row)

// Sum (or max) over the CTA of one value per thread; every thread gets the result.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op) {
  __shared__ float part[kRowThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // `part` may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < kRowThreads / 32; ++w) v = op(v, part[w]);
  return v;
}
struct Sum { __device__ float operator()(float a, float b) const { return a + b; } };
struct Max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

// y[row] = x[row] / sqrt(mean(x[row]^2) + eps)  (RMSNorm; its gain is folded into the next
// projection's weights). One CTA per row of `cols`.
template <typename T>
__device__ void rmsnorm_row(const T* x, T* y, int cols, float eps) {
  const T* xr = x + (size_t)blockIdx.x * cols;
  T* yr = y + (size_t)blockIdx.x * cols;
  float ss = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = to_float(xr[j]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_reduce(ss, Sum{}) / cols + eps);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = from_float<T>(to_float(xr[j]) * inv);
}

// Causal softmax of one query's scores: p[j] = exp(scale s[j] - m) / sum over j <= q, and 0 for
// the keys after it (query q = blockIdx.x, keys [0, cols)). Scores are fp32.
template <typename T>
__device__ void causal_softmax_row(const float* s, T* p, int cols, float scale) {
  const int q = blockIdx.x;
  const float* sr = s + (size_t)q * cols;
  T* pr = p + (size_t)q * cols;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= q; j += blockDim.x) m = fmaxf(m, scale * sr[j]);
  m = block_reduce(m, Max{});
  float sum = 0.f;
  for (int j = threadIdx.x; j <= q; j += blockDim.x) sum += expf(scale * sr[j] - m);
  const float inv = 1.f / block_reduce(sum, Sum{});
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    pr[j] = from_float<T>(j <= q ? expf(scale * sr[j] - m) * inv : 0.f);
}

// SwiGLU: out[r, f] = silu(gu[r, f]) * gu[r, ffn + f] (gate and up side by side in one row).
template <typename T>
__device__ void swiglu(const T* gu, T* out, size_t rows, int ffn) {
  for (size_t i = global_thread(); i < rows * ffn; i += global_stride()) {
    const size_t r = i / ffn, f = i % ffn;
    const float g = to_float(gu[r * 2 * ffn + f]), u = to_float(gu[r * 2 * ffn + ffn + f]);
    out[i] = from_float<T>(g / (1.f + expf(-g)) * u);
  }
}

}  // namespace kv
}  // namespace cuco
