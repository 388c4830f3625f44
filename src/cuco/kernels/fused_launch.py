"""The in-kernel launcher's C entry point (``cuco_fused_launch``), as one table.

``tp_fused.cu.j2`` renders its parameter list from :data:`ARGS`, the runtime declares the
ctypes ``argtypes`` from it (:func:`argtypes`), and callers pass their arguments by name
through :func:`pack`: the three cannot drift apart, and a missing or misspelt argument is
an error before the launch, not a wrong pointer inside it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

#: The C function a fused launcher library exports (beside cuco_fused_setup / _smem_bytes).
ENTRY = "cuco_fused_launch"


@dataclass(frozen=True)
class Arg:
    """One parameter: its name, its C type and the ctypes type that passes it."""

    name: str
    c_type: str
    ctype: Any


_OFFSET = ("unsigned long long", ctypes.c_ulonglong)  # a byte offset into the symmetric arena

#: ``cuco_fused_launch``'s parameters, in order. This rank's GEMM is ``m x n x k``, its tiles
#: walked in groups of ``raster_group`` m-tiles (launch arguments: one build serves every
#: shape and tile order). ``peers``: every rank's arena base as this rank maps it
#: (``peers[me]``, the local base). LSA: ``a0`` = the device ``ncclDevComm*``, ``a1`` = the
#: window; NVSHMEM: both null. The offsets are into the symmetric arena. ``workspace``: this
#: rank's own device buffer of ``workspace_bytes`` for a split-K build
#: (:func:`cuco.kernels.tp.split_workspace_bytes` at the shape; zeroed once, before its first
#: call: the kernel leaves it so), null and 0 for every other build; the last two, so an
#: artifact built before they existed ignores them.
ARGS: tuple[Arg, ...] = (
    Arg("device", "int", ctypes.c_int),
    Arg("stream", "void*", ctypes.c_void_p),
    Arg("grid", "int", ctypes.c_int),
    Arg("m", "int", ctypes.c_int),
    Arg("n", "int", ctypes.c_int),
    Arg("k", "int", ctypes.c_int),
    Arg("raster_group", "int", ctypes.c_int),
    Arg("x", "const void*", ctypes.c_void_p),
    Arg("w", "const void*", ctypes.c_void_p),
    Arg("out", "void*", ctypes.c_void_p),
    Arg("a0", "const void*", ctypes.c_void_p),
    Arg("a1", "void*", ctypes.c_void_p),
    Arg("peers", "void* const*", ctypes.POINTER(ctypes.c_void_p)),
    Arg("me", "int", ctypes.c_int),
    Arg("data_off", *_OFFSET),
    Arg("stage_off", *_OFFSET),
    Arg("out_off", *_OFFSET),
    Arg("flag_off", *_OFFSET),
    Arg("calls_off", *_OFFSET),
    Arg("workspace", "void*", ctypes.c_void_p),
    Arg("workspace_bytes", "unsigned long long", ctypes.c_ulonglong),
)
NAMES = tuple(a.name for a in ARGS)


def c_params(indent: int = 0, width: int = 110) -> str:
    """The C parameter list (``int device, void* stream, ...``), wrapped before ``width``
    columns, continuation lines indented by ``indent`` spaces."""
    lines, line = [], ""
    for i, a in enumerate(ARGS):
        item = f"{a.c_type} {a.name}" + ("," if i < len(ARGS) - 1 else "")
        if line and indent + len(line) + 1 + len(item) > width:
            lines.append(line)
            line = item
        else:
            line = f"{line} {item}" if line else item
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def argtypes() -> list[Any]:
    """The ctypes ``argtypes`` of :data:`ENTRY`."""
    return [a.ctype for a in ARGS]


def pack(**values: Any) -> tuple[Any, ...]:
    """``values`` (every parameter, by name) in :data:`ARGS`' order; a missing or unknown
    name is a ``TypeError`` naming it."""
    missing = [n for n in NAMES if n not in values]
    unknown = sorted(set(values) - set(NAMES))
    if missing or unknown:
        raise TypeError(f"{ENTRY}: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"no parameter {', '.join(unknown)}" if unknown else "") if part))
    return tuple(values[n] for n in NAMES)
