"""ctypes bindings to NCCL: communicators, symmetric windows, host collectives,
and the device communicator (``ncclDevComm``) through a small compiled shim.

Loads the ``libnccl.so.2`` that :func:`cuco.kernels.toolchain.nccl` found, so
kernels and the library agree on the device-API structs.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from cuco.errors import CucoError, LibraryConflict, LibraryNotFound
from cuco.kernels import toolchain
from cuco.kernels.compiler import SHIM_DIR, Compiler

# ncclDataType_t / ncclRedOp_t values (stable since NCCL 2.x)
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "fp16": 6, "fp32": 7, "fp64": 8, "bf16": 9}
SUM = 0
#: ncclRedOp_t values
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
WIN_COLL_SYMMETRIC = 1
UNIQUE_ID_BYTES = 128


class NcclError(CucoError):
    pass


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The ``libnccl.so.2`` of :func:`cuco.kernels.toolchain.nccl`, loaded once per process
    (``RTLD_GLOBAL``, so the device-communicator shim binds to the same copy). Refuses
    (:class:`~cuco.errors.LibraryConflict`) where another libnccl is already mapped, and
    where the loaded binary's version is not that of the headers kernels are built with."""
    inst = toolchain.nccl()
    if not inst.so.exists():
        raise LibraryNotFound(f"{inst.so} missing; reinstall with `pip install --force-reinstall "
                              "nvidia-nccl-cu13` or point CUCO_NCCL_HOME at a complete NCCL")
    toolchain.check_nccl_loadable(inst)
    cdll = ctypes.CDLL(str(inst.so), mode=ctypes.RTLD_GLOBAL)
    v = ctypes.c_int()
    if cdll.ncclGetVersion(ctypes.byref(v)) != 0:
        raise LibraryConflict(f"ncclGetVersion failed in {inst.so}; is it a real libnccl?")
    got = toolchain.version_string(v.value)
    if got != inst.version:
        raise LibraryConflict(
            f"{inst.so} reports NCCL {got} but the headers beside it ({inst.include}) are "
            f"{inst.version}; kernels built against them would misread the device structs. "
            "Fix: reinstall that NCCL so headers and library match (`pip install "
            "--force-reinstall nvidia-nccl-cu13`), or point CUCO_NCCL_HOME at a consistent root")
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    cdll.ncclGetErrorString.restype = ctypes.c_char_p
    cdll.ncclGetLastError.restype = ctypes.c_char_p
    cdll.ncclGetLastError.argtypes = [vp]
    cdll.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i, _UniqueId, i]
    cdll.ncclCommDestroy.argtypes = [vp]
    cdll.ncclCommFinalize.argtypes = [vp]
    cdll.ncclMemAlloc.argtypes = [ctypes.POINTER(vp), sz]
    cdll.ncclMemFree.argtypes = [vp]
    cdll.ncclCommWindowRegister.argtypes = [vp, vp, sz, ctypes.POINTER(vp), i]
    cdll.ncclCommWindowDeregister.argtypes = [vp, vp]
    cdll.ncclAllReduce.argtypes = [vp, vp, sz, i, i, vp, vp]
    cdll.ncclAllGather.argtypes = [vp, vp, sz, i, vp, vp]
    cdll.ncclReduceScatter.argtypes = [vp, vp, sz, i, i, vp, vp]
    cdll.ncclSend.argtypes = [vp, sz, i, i, vp, vp]
    cdll.ncclRecv.argtypes = [vp, sz, i, i, vp, vp]
    return cdll


def check(rc: int, what: str, comm: int | None = None) -> None:
    if rc != 0:
        lib = library()
        msg = lib.ncclGetErrorString(rc).decode()
        last = lib.ncclGetLastError(comm).decode() if comm else ""
        raise NcclError(f"{what} failed: {msg} (code {rc}){': ' + last if last else ''}")


def version() -> int:
    v = ctypes.c_int()
    check(library().ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return v.value


def in_process() -> dict[str, str]:
    """Load cuco's NCCL here (no GPU needed) and say which one this process now has:
    ``so`` (the file mapped, as /proc/self/maps names it), ``version`` (``ncclGetVersion``),
    ``headers`` (the include directory kernels are built against), ``origin``, ``pid``."""
    import os

    inst = toolchain.nccl()
    library()
    mapped = toolchain.loaded_nccl()
    return {"so": str(mapped[0]) if mapped else "", "version": toolchain.version_string(version()),
            "headers": str(inst.include), "header_version": inst.version, "origin": inst.origin,
            "pid": str(os.getpid())}


def in_process_job(ctx: object) -> dict[str, str]:
    """:func:`in_process` as a worker job (``WorkerGroup(1, gpu=False).run(in_process_job)``)."""
    return in_process()


def get_unique_id() -> bytes:
    uid = _UniqueId()
    check(library().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES))


@dataclass
class Window:
    """A symmetric buffer: device pointer, size and its registered window handle."""

    ptr: int
    size: int
    handle: int


class Communicator:
    """One rank's NCCL communicator; call from the process that owns the GPU."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int, *, emulated: bool = False):
        uid = _UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, UNIQUE_ID_BYTES)
        comm = ctypes.c_void_p()
        check(library().ncclCommInitRank(ctypes.byref(comm), world_size, uid, rank),
              f"ncclCommInitRank(rank {rank} of {world_size})")
        self.ptr: int = comm.value
        self.rank, self.world_size = rank, world_size
        #: ranks sharing one GPU (:mod:`cuco.runtime.emulated`): windows are IPC-mapped
        #: buffers, since NCCL registers no LSA peers across the hosts those ranks claim
        self.emulated = emulated
        self.windows: list = []

    # ---- symmetric memory -------------------------------------------------------------
    def alloc_window(self, size: int) -> Window:
        """``ncclMemAlloc`` + symmetric window registration (collective: all ranks, same size)."""
        lib = library()
        size = -(-size // 4096) * 4096
        if self.emulated:
            import cupy
            from cuco.runtime.emulated import EmuWindow
            ew = EmuWindow.allocate(self, cupy.cuda.get_current_stream(), size)
            self.windows.append(ew)
            return ew  # type: ignore[return-value]
        ptr = ctypes.c_void_p()
        check(lib.ncclMemAlloc(ctypes.byref(ptr), size), f"ncclMemAlloc({size})", self.ptr)
        win = ctypes.c_void_p()
        check(lib.ncclCommWindowRegister(self.ptr, ptr, size, ctypes.byref(win), WIN_COLL_SYMMETRIC),
              "ncclCommWindowRegister", self.ptr)
        w = Window(ptr.value, size, win.value)
        self.windows.append(w)
        return w

    def free_window(self, w: Window) -> None:
        if self.emulated:
            w.free()  # type: ignore[attr-defined]
            self.windows.remove(w)
            return
        lib = library()
        check(lib.ncclCommWindowDeregister(self.ptr, w.handle), "ncclCommWindowDeregister", self.ptr)
        check(lib.ncclMemFree(w.ptr), "ncclMemFree", self.ptr)
        self.windows.remove(w)

    # ---- host collectives (the references) -------------------------------------------
    def all_reduce(self, send: int, recv: int, count: int, dtype: str, stream: int,
                   op: str = "sum") -> None:
        check(library().ncclAllReduce(send, recv, count, DTYPES[dtype], OPS[op], self.ptr, stream),
              "ncclAllReduce", self.ptr)

    def all_gather(self, send: int, recv: int, count: int, dtype: str, stream: int) -> None:
        check(library().ncclAllGather(send, recv, count, DTYPES[dtype], self.ptr, stream),
              "ncclAllGather", self.ptr)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: str, stream: int) -> None:
        check(library().ncclReduceScatter(send, recv, count, DTYPES[dtype], SUM, self.ptr, stream),
              "ncclReduceScatter", self.ptr)

    def group(self):
        return _Group()

    def send(self, buf: int, count: int, dtype: str, peer: int, stream: int) -> None:
        check(library().ncclSend(buf, count, DTYPES[dtype], peer, self.ptr, stream), "ncclSend", self.ptr)

    def recv(self, buf: int, count: int, dtype: str, peer: int, stream: int) -> None:
        check(library().ncclRecv(buf, count, DTYPES[dtype], peer, self.ptr, stream), "ncclRecv", self.ptr)

    def destroy(self) -> None:
        if self.ptr:
            for w in list(self.windows):
                self.free_window(w)
            library().ncclCommDestroy(self.ptr)
            self.ptr = 0


class _Group:
    def __enter__(self):
        check(library().ncclGroupStart(), "ncclGroupStart")

    def __exit__(self, *exc):
        check(library().ncclGroupEnd(), "ncclGroupEnd")


@functools.lru_cache(maxsize=4)
def _devcomm_shim(arch: str) -> ctypes.CDLL:
    lib = toolchain.nccl()
    so = Compiler(arch=arch).build_shared(
        (SHIM_DIR / "nccl_devcomm.cu").read_text(), name="nccl_devcomm", needs=("nccl",),
        link=[f"-L{lib.lib}", "-l:libnccl.so.2", f"-Xlinker=-rpath,{lib.lib}"])
    library()  # NCCL first, globally, so the shim binds to the same copy
    shim = ctypes.CDLL(str(so))
    shim.cuco_devcomm_create.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    shim.cuco_devcomm_destroy.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return shim


class DevComm:
    """An ``ncclDevComm`` created on the host and copied to device memory.

    ``lsa_barriers`` must be at least the number of CTAs that open a barrier
    session with distinct indices.
    """

    def __init__(self, comm: Communicator, *, lsa_barriers: int = 256, gin_signals: int = 0,
                 gin_counters: int = 0, gin_force: bool = False, arch: str = "sm_90a"):
        import cupy
        import numpy

        shim = _devcomm_shim(arch)
        size = shim.cuco_devcomm_size()
        self.host = ctypes.create_string_buffer(size)
        rc = shim.cuco_devcomm_create(comm.ptr, lsa_barriers, gin_signals, gin_counters,
                                      int(gin_force), self.host)
        check(rc, f"ncclDevCommCreate(lsaBarrierCount={lsa_barriers})", comm.ptr)
        self.comm, self.lsa_barriers = comm, lsa_barriers
        self.device = cupy.empty(size, dtype=cupy.uint8)
        self.device.set(numpy.frombuffer(self.host.raw, dtype=numpy.uint8))
        self._shim = shim

    @property
    def ptr(self) -> int:
        return int(self.device.data.ptr)

    def destroy(self) -> None:
        if self._shim is not None:
            self._shim.cuco_devcomm_destroy(self.comm.ptr, self.host)
            self._shim = None
