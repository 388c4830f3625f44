"""Row-major GEMMs through cuBLASLt with an explicit algorithm (ctypes, no build step).

CuPy binds cuBLAS but not cuBLASLt, and cuBLASLt's C API is small and stable, so this
calls the ``libcublasLt`` that CuPy's cuBLAS already mapped into the process (never a
second copy). :class:`LtGemm` asks the heuristic for its top algorithms for one shape;
the host baseline (:mod:`cuco.runtime.host_gemm`) times each and keeps the fastest.
Accumulation is fp32 (``CUBLAS_COMPUTE_32F``), as in :mod:`cuco.runtime.cublas`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from cuco.errors import LibraryNotFound
from cuco.runtime.cublas import COMPUTE_32F, CUDA_TYPES

PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
#: Workspace offered to the heuristic (what torch gives cuBLASLt on Hopper).
WORKSPACE_BYTES = 32 << 20


class Algo(ctypes.Structure):
    """``cublasLtMatmulAlgo_t``: opaque, 8 x uint64."""
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``."""
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


def _mapped(prefix: str) -> Path | None:
    """The file of a library whose name starts with ``prefix`` mapped into this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.count("/") else ""
        if Path(path).name.startswith(prefix):
            return Path(path)
    return None


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The ``libcublasLt`` CuPy's cuBLAS loaded (cuBLAS depends on it)."""
    import cupy
    cupy.cuda.device.get_cublas_handle()  # maps libcublas and with it libcublasLt
    so = _mapped("libcublasLt.so")
    if so is None:
        raise LibraryNotFound("libcublasLt is not loaded beside CuPy's cuBLAS; install the "
                              "cuBLAS of your CUDA (`pip install nvidia-cublas`) so CuPy and "
                              "cuBLASLt come from one copy")
    lib = ctypes.CDLL(str(so))
    vp, u64, i64, i, sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), i, i]
    lib.cublasLtMatmulDescDestroy.argtypes = [vp]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), i, u64, u64, i64]
    lib.cublasLtMatrixLayoutDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, i,
                                                   ctypes.POINTER(HeuristicResult), ctypes.POINTER(i)]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [ctypes.POINTER(Algo), i, vp, sz,
                                                         ctypes.POINTER(sz)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp,
                                   ctypes.POINTER(Algo), vp, sz, vp]
    return lib


#: ``cublasLtMatmulAlgoConfigAttributes_t``: what :func:`describe` reads of an algorithm, and
#: the bytes of each (cublasLt.h).
CONFIG_ATTRIBUTES = {"algo_id": (0, 4), "tile": (1, 4), "split_k": (2, 4), "reduction": (3, 4),
                     "swizzle": (4, 4), "stages": (6, 4), "cluster": (8, 2)}


@functools.lru_cache(maxsize=1)
def enum_names() -> dict[str, dict[int, str]]:
    """The names of cuBLASLt's tile, stages and cluster-shape enumerators (``{'tile': {19:
    '128x128'}, ...}``) from ``cublasLt.h`` where one is found beside the CUDA toolkit or the
    ``nvidia`` wheels, else empty: :func:`describe` then gives the numbers alone."""
    import re
    import sys
    roots = [Path(p) / "nvidia" for p in sys.path if p] + [Path("/usr/local/cuda")]
    for root in roots:
        for header in (*root.glob("*/include/cublasLt.h"), root / "include" / "cublasLt.h"):
            if header.is_file():
                text = header.read_text(errors="replace")
                return {key: {int(v): name for name, v in re.findall(rf"CUBLASLT_{prefix}_(\w+) = (\d+)", text)}
                        for key, prefix in (("tile", "MATMUL_TILE"), ("stages", "MATMUL_STAGES"),
                                            ("cluster", "CLUSTER_SHAPE"))}
    return {}


def describe(result: "HeuristicResult") -> dict[str, object]:
    """What cuBLASLt says of one heuristic algorithm: its tile, split-K slices, reduction
    scheme, swizzle, stages and cluster shape (names where :func:`enum_names` has them)."""
    lib = library()
    out: dict[str, object] = {}
    for key, (attr, size) in CONFIG_ATTRIBUTES.items():
        buf = (ctypes.c_uint8 * 8)()
        written = ctypes.c_size_t()
        rc = lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(result.algo), attr,
                                                      ctypes.cast(buf, ctypes.c_void_p), size,
                                                      ctypes.byref(written))
        if rc != 0:
            continue
        value = int.from_bytes(bytes(buf)[:size], "little", signed=key == "split_k")
        out[key] = enum_names().get(key, {}).get(value, value)
    out["waves"] = round(float(result.waves_count), 3)
    return out


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise CublasLtError(f"{what} failed with cublasStatus_t {rc}")


@functools.lru_cache(maxsize=1)
def handle() -> int:
    h = ctypes.c_void_p()
    check(library().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h.value


_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


class LtGemm:
    """``C[m, n] = A[m, k] @ B[k, n]`` (row-major, device pointers) for one shape and dtype.

    cuBLASLt is column-major, so it computes ``C^T = B^T A^T`` with no transposes.
    :meth:`candidates` are the heuristic's top algorithms (each needs at most
    :data:`WORKSPACE_BYTES`); :meth:`run` launches one of them on a stream.
    """

    def __init__(self, m: int, n: int, k: int, dtype: str, out_dtype: str | None = None):
        import cupy
        lib = library()
        self.m, self.n, self.k, self.dtype = m, n, k, dtype
        t, tc = CUDA_TYPES[dtype], CUDA_TYPES[out_dtype or dtype]
        self.desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, CUDA_TYPES["fp32"]),
              "cublasLtMatmulDescCreate")
        self.layouts = []
        for typ, rows, cols, ld in ((t, n, k, n), (t, k, m, k), (tc, n, m, n)):  # B^T, A^T, C^T
            lay = ctypes.c_void_p()
            check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), typ, rows, cols, ld),
                  "cublasLtMatrixLayoutCreate")
            self.layouts.append(lay)
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)

    def candidates(self, count: int = 8) -> list[HeuristicResult]:
        """Up to ``count`` algorithms, the heuristic's best first."""
        lib = library()
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(WORKSPACE_BYTES)
            check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES,
                                                           ctypes.byref(ws), ctypes.sizeof(ws)),
                  "cublasLtMatmulPreferenceSetAttribute")
            results = (HeuristicResult * count)()
            got = ctypes.c_int()
            a, b, c = self.layouts
            check(lib.cublasLtMatmulAlgoGetHeuristic(handle(), self.desc, a, b, c, c, pref, count,
                                                     results, ctypes.byref(got)),
                  f"cublasLtMatmulAlgoGetHeuristic({self.m}x{self.n}x{self.k} {self.dtype})")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        return [results[j] for j in range(got.value) if results[j].state == 0]

    def run(self, algo: HeuristicResult, a: int, b: int, c: int, stream_ptr: int) -> None:
        """One GEMM with ``algo`` on the stream ``stream_ptr``."""
        lay_a, lay_b, lay_c = self.layouts
        check(library().cublasLtMatmul(handle(), self.desc, _ONE.ctypes.data, b, lay_a, a, lay_b,
                                       _ZERO.ctypes.data, c, lay_c, c, lay_c, ctypes.byref(algo.algo),
                                       int(self.workspace.data.ptr), WORKSPACE_BYTES, stream_ptr),
              "cublasLtMatmul")

    def __del__(self) -> None:
        try:
            lib = library()
            for lay in self.layouts:
                lib.cublasLtMatrixLayoutDestroy(lay)
            lib.cublasLtMatmulDescDestroy(self.desc)
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass
