// CUTLASS's own Hopper GEMM (GemmUniversal: TMA + wgmma mainloop, its TMA-store epilogue,
// persistent tile scheduler), built per configuration by bench/cutlass_stock_probe.py: what
// the library's stock kernel runs at the shapes where cuco's in-kernel mainloop trails cuBLAS
// (issue #37). C[m, n] = A[m, k] B[k, n], all row-major, as cuco's profile build computes it.
// Configuration macros: TILE_M, TILE_N (CUTLASS's tile: with SWAP, M is our n), CLUSTER_M,
// PINGPONG (0: cooperative), SWAP (1: C^T = B^T A^T), STAGES (0: as many as fit).
#if SWAP
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <cuda_runtime.h>

using namespace cute;
using T = cutlass::bfloat16_t;
#if SWAP
using LayoutA = cutlass::layout::ColumnMajor;  // B^T: n x k, n contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // A^T: k x m, k contiguous
using LayoutC = cutlass::layout::ColumnMajor;  // C^T: n x m, n contiguous
#else
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::RowMajor;
using LayoutC = cutlass::layout::RowMajor;
#endif
using TileShape = Shape<Int<TILE_M>, Int<TILE_N>, _64>;
using ClusterShape = Shape<Int<CLUSTER_M>, _1, _1>;
#if PINGPONG
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#endif
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, LayoutC, 8, T, LayoutC, 8, EpilogueSchedule>::CollectiveOp;
#if STAGES
using Stages = cutlass::gemm::collective::StageCount<STAGES>;
#else
using Stages = cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>;
#endif
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LayoutA, 8, T, LayoutB, 8, float,
    TileShape, ClusterShape, Stages, KernelSchedule>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

extern "C" int stock_stages() { return (int)Mainloop::DispatchPolicy::Stages; }
extern "C" int stock_smem() { return (int)sizeof(typename Kernel::SharedStorage); }

// One call on `stream`; the arguments (and TMA descriptors) are rebuilt only when a pointer or
// the shape changes. swizzle: the scheduler's tile-order swizzle (1, 2, 4 or 8).
extern "C" int stock_gemm(const void* a, const void* b, void* c, int m, int n, int k, int swizzle, void* stream) {
  static Gemm gemm;
  static const void* key[3] = {};
  static int shape[4] = {};
  static void* workspace = nullptr;
  static size_t workspace_bytes = 0;
  if (key[0] != a || key[1] != b || key[2] != c || shape[0] != m || shape[1] != n || shape[2] != k || shape[3] != swizzle) {
#if SWAP
    const int M = n, N = m;
    const T* pa = (const T*)b; const T* pb = (const T*)a;
#else
    const int M = m, N = n;
    const T* pa = (const T*)a; const T* pb = (const T*)b;
#endif
    auto sa = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(M, k, 1));
    auto sb = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(N, k, 1));
    auto sd = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(M, N, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, k, 1},
                                  {pa, sa, pb, sb}, {{1.0f, 0.0f}, nullptr, sd, (T*)c, sd}};
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    args.hw_info = hw;
    args.scheduler.max_swizzle_size = swizzle;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    const size_t need = Gemm::get_workspace_size(args);
    if (need > workspace_bytes) {
      if (workspace) cudaFree(workspace);
      if (cudaMalloc(&workspace, need) != cudaSuccess) return -2;
      workspace_bytes = need;
    }
    if (gemm.initialize(args, workspace, (cudaStream_t)stream) != cutlass::Status::kSuccess) return -3;
    key[0] = a; key[1] = b; key[2] = c;
    shape[0] = m; shape[1] = n; shape[2] = k; shape[3] = swizzle;
  }
  return gemm.run((cudaStream_t)stream) == cutlass::Status::kSuccess ? 0 : -4;
}
