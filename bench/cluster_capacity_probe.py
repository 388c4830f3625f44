"""How many thread-block clusters of 2 (and 4) the GPU runs at once for a kernel of one CTA per
SM (384 threads, the fused kernel's), by its shared memory (issue #37).

    python bench/cluster_capacity_probe.py

The in-kernel mainloops in clusters along M (cluster_m=2) size their persistent grid by
cuOccupancyMaxActiveClusters (_launch_cubin.cu.j2's cluster_grid): where fewer than 66 pairs
fit on 132 SMs (a GPC holds whole clusters), a GEMM of 128 tiles runs in two passes. A probe:
it prints a table and writes nothing to bench/results.
"""

from __future__ import annotations

import ctypes

from cuco.errors import run_script
from cuco.runtime import check_gpus

SMEM_KIB = (48, 100, 150, 200, 220, 226)
THREADS = 384
CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint), ("y", ctypes.c_uint),
                ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("n_attrs", ctypes.c_uint)]


def max_active_clusters(cuda, fn_ptr: int, smem: int, cluster: int, grid: int) -> int:
    attr = LaunchAttribute(id=CLUSTER_DIMENSION, x=cluster, y=1, z=1)
    cfg = LaunchConfig(gx=grid, gy=1, gz=1, bx=THREADS, by=1, bz=1, smem=smem, stream=None,
                       attrs=ctypes.pointer(attr), n_attrs=1)
    n = ctypes.c_int(0)
    rc = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(fn_ptr), ctypes.byref(cfg))
    return n.value if rc == 0 else -rc


def main(argv: list[str] | None = None) -> int:
    check_gpus(1, None, need_p2p=False)
    import cupy
    cuda = ctypes.CDLL("libcuda.so.1")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    src = 'extern "C" __global__ void probe() { extern __shared__ char s[]; if (threadIdx.x == 0) s[0] = 1; }'
    print(f"{sms} SMs; {THREADS} threads a CTA; max active clusters (CTAs in them) by dynamic shared memory")
    print(f"{'smem KiB':>9} {'clusters of 1':>14} {'clusters of 2':>14} {'clusters of 4':>14}")
    for kib in SMEM_KIB:
        k = cupy.RawKernel(src, "probe")
        k.max_dynamic_shared_size_bytes = kib * 1024
        k.compile()
        ptr = k.kernel.ptr
        cells = []
        for c in (1, 2, 4):
            n = max_active_clusters(cuda, ptr, kib * 1024, c, sms // c * c)
            cells.append(f"{n} ({n * c})" if n >= 0 else f"error {-n}")
        print(f"{kib:>9} " + " ".join(f"{x:>14}" for x in cells))
    return 0


if __name__ == "__main__":
    run_script(main)
