"""Stream memory operations of the CUDA driver: a stream waits for, or writes, an 8-byte flag
in stream order, with no kernel (no SM is held while it waits).

``wait_value`` blocks the stream's later work until ``*addr >= value`` (64-bit, cyclic
compare); ``write_value`` stores ``value`` at ``addr`` once the stream's earlier work is done,
with a memory fence before the store, so a peer that sees the flag also sees what the stream
copied before it. Both take device addresses, a peer's included (an NVLink mapping).
"""

from __future__ import annotations

import ctypes
import functools

#: CU_STREAM_WAIT_VALUE_GEQ and CU_STREAM_WRITE_VALUE_DEFAULT (fence, then write).
WAIT_GEQ = 0
WRITE_FENCED = 0


@functools.lru_cache(maxsize=1)
def _driver() -> dict[str, ctypes._CFuncPtr]:
    lib = ctypes.CDLL("libcuda.so.1")
    out = {}
    for name in ("cuStreamWaitValue64", "cuStreamWriteValue64"):
        try:
            fn = getattr(lib, name + "_v2")  # what cuda.h's name maps to since CUDA 11.7
        except AttributeError:
            fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
        fn.restype = ctypes.c_int
        out[name] = fn
    return out


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc} (801: this GPU or driver has no "
                           "64-bit stream memory operations; use a kernel issuer instead)")


def wait_value(stream_ptr: int, addr: int, value: int) -> None:
    """Later work of the stream waits until the 8 bytes at ``addr`` reach ``value``."""
    _check(_driver()["cuStreamWaitValue64"](stream_ptr, addr, value, WAIT_GEQ),
           "cuStreamWaitValue64")


def write_value(stream_ptr: int, addr: int, value: int) -> None:
    """After the stream's earlier work (fenced), ``value`` is stored at ``addr``."""
    _check(_driver()["cuStreamWriteValue64"](stream_ptr, addr, value, WRITE_FENCED),
           "cuStreamWriteValue64")
