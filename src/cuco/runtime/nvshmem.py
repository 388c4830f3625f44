"""NVSHMEM from Python: unique-id bootstrap, symmetric memory as CuPy arrays,
module registration, finalize — through a small host shim over
``libnvshmem_host.so.3`` (no MPI, no nvshmem4py).
"""

from __future__ import annotations

import ctypes
import functools
import os

from cuco.errors import CucoError, EnvironmentProblem
from cuco.kernels import toolchain
from cuco.kernels.compiler import SHIM_DIR, Compiler

DEFAULT_HEAP = 4 << 30


class NvshmemError(CucoError):
    pass


class SymmetricHeapTooSmall(EnvironmentProblem):
    pass


def prepare_env(env: dict[str, str], heap_bytes: int = DEFAULT_HEAP) -> dict[str, str]:
    """Variables NVSHMEM reads at start: plugin path, heap size, no NVLS."""
    lib = str(toolchain.nvshmem().lib)
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    if lib not in paths:
        env["LD_LIBRARY_PATH"] = ":".join([lib, *paths])
    env.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap_bytes))
    env["NVSHMEM_DISABLE_NVLS"] = "1"
    env.setdefault("NVSHMEM_BOOTSTRAP", "UID")
    return env


@functools.lru_cache(maxsize=4)
def shim(arch: str = "sm_90a") -> ctypes.CDLL:
    lib = toolchain.nvshmem()
    so = Compiler(arch=arch).build_shared(
        (SHIM_DIR / "nvshmem_host.cu").read_text(), name="nvshmem_host", needs=("nvshmem",),
        link=[f"-L{lib.lib}", "-l:libnvshmem_host.so.3", f"-Xlinker=-rpath,{lib.lib}"])
    s = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    s.cuco_nvshmem_malloc.restype = ctypes.c_void_p
    s.cuco_nvshmem_malloc.argtypes = [ctypes.c_size_t]
    s.cuco_nvshmem_free.argtypes = [ctypes.c_void_p]
    s.cuco_nvshmem_ptr.restype = ctypes.c_void_p
    s.cuco_nvshmem_ptr.argtypes = [ctypes.c_void_p, ctypes.c_int]
    s.cuco_nvshmem_cumodule_init.argtypes = [ctypes.c_void_p]
    s.cuco_nvshmem_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    s.cuco_nvshmem_get_uid.argtypes = [ctypes.c_void_p]
    return s


def get_unique_id(arch: str = "sm_90a") -> bytes:
    s = shim(arch)
    buf = ctypes.create_string_buffer(s.cuco_nvshmem_uid_size())
    rc = s.cuco_nvshmem_get_uid(buf)
    if rc != 0:
        raise NvshmemError(f"nvshmemx_get_uniqueid failed (code {rc})")
    return buf.raw


class Nvshmem:
    """This process's NVSHMEM PE. Create in every rank with the same unique id."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int, arch: str = "sm_90a"):
        if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
            prepare_env(os.environ)  # type: ignore[arg-type]
        self._s = shim(arch)
        rc = self._s.cuco_nvshmem_init(rank, world_size, unique_id)
        if rc != 0:
            raise NvshmemError(
                f"nvshmemx_hostlib_init_attr failed (code {rc}) on rank {rank}; check that "
                f"LD_LIBRARY_PATH holds {toolchain.nvshmem().lib} before the process starts")
        self.rank, self.world_size = self._s.cuco_nvshmem_my_pe(), self._s.cuco_nvshmem_n_pes()
        self.heap_bytes = int(os.environ.get("NVSHMEM_SYMMETRIC_SIZE", DEFAULT_HEAP))
        self._live: list[int] = []
        self._modules: set[int] = set()

    def malloc(self, nbytes: int) -> int:
        ptr = self._s.cuco_nvshmem_malloc(nbytes)
        if not ptr:
            raise SymmetricHeapTooSmall(
                f"nvshmem_malloc({nbytes}) failed: the symmetric heap "
                f"({self.heap_bytes / 2**30:.1f} GiB) is too small; set NVSHMEM_SYMMETRIC_SIZE "
                f"larger (e.g. {max(2 * nbytes, 1 << 30)}) before the workers start")
        self._live.append(ptr)
        return ptr

    def array(self, shape, dtype):
        """A symmetric CuPy array (memory owned by NVSHMEM, freed by :meth:`free`)."""
        import cupy
        import numpy

        nbytes = int(numpy.prod(shape)) * numpy.dtype(dtype).itemsize
        ptr = self.malloc(max(nbytes, 1))
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, self)
        return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def free(self, ptr: int) -> None:
        self._s.cuco_nvshmem_free(ptr)
        self._live.remove(ptr)

    def register_module(self, module_ptr: int) -> None:
        """``nvshmemx_cumodule_init`` — required before the module's first launch."""
        if module_ptr in self._modules:
            return
        rc = self._s.cuco_nvshmem_cumodule_init(module_ptr)
        if rc != 0:
            raise NvshmemError(f"nvshmemx_cumodule_init failed (code {rc}); was the cubin "
                               "device-linked against libnvshmem_device?")
        self._modules.add(module_ptr)

    def peer_ptr(self, ptr: int, pe: int) -> int:
        """This PE's load/store address of symmetric ``ptr`` on ``pe`` (``nvshmem_ptr``)."""
        out = self._s.cuco_nvshmem_ptr(ptr, pe)
        if not out:
            raise NvshmemError(f"PE {pe} is not reachable by loads and stores from PE "
                               f"{self.rank} (nvshmem_ptr returned null): in-kernel "
                               "placements need NVLink peers")
        return out

    def barrier_all(self) -> None:
        self._s.cuco_nvshmem_barrier_all()

    def finalize(self) -> None:
        for p in list(self._live):
            self.free(p)
        self._s.cuco_nvshmem_finalize()
