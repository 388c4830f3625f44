"""Row-major GEMMs through cuBLAS ``gemmEx`` on raw pointers (CuPy has no bf16 dtype).

Used for the host-driven references, the GEMM-alone baseline and the compute
half of ``side_stream`` variants. Accumulation is always fp32
(``CUBLAS_COMPUTE_32F``; no TF32).
"""

from __future__ import annotations

import numpy as np

CUDA_TYPES = {"bf16": 14, "fp16": 2, "fp32": 0}  # cudaDataType_t
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
GEMM_DEFAULT = -1

_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


def gemm(a: int, b: int, c: int, m: int, n: int, k: int, dtype: str, stream, *,
         lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
         accumulate: bool = False, out_dtype: str | None = None,
         trans_b: bool = False) -> None:
    """``C[m, n] (+)= A[m, k] @ B[k, n]``, all row-major, pointers to device memory.

    cuBLAS is column-major, so this computes ``C^T = B^T A^T``. ``out_dtype="fp32"``
    keeps C in fp32: with bf16/fp16 operands every product is exact in fp32 and the
    sum is fp32, so this is an fp32 reference at tensor-core speed. ``trans_b``: B is
    given as ``[n, k]`` (row-major) and ``C = A @ B^T``.
    """
    import cupy
    from cupy_backends.cuda.libs import cublas

    t = CUDA_TYPES[dtype]
    tc = CUDA_TYPES[out_dtype or dtype]
    handle = cupy.cuda.device.get_cublas_handle()
    with stream:
        cublas.gemmEx(handle, 1 if trans_b else 0, 0, n, m, k, _ONE.ctypes.data, b, t,
                      ldb or (k if trans_b else n), a, t, lda or k,
                      (_ONE if accumulate else _ZERO).ctypes.data, c, tc, ldc or n,
                      COMPUTE_32F, GEMM_DEFAULT)
