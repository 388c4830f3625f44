"""The MoE layer's expert GEMMs: one CUTLASS grouped GEMM over all local experts per projection.

``moe_grouped_gemm.cu.j2`` renders CUTLASS's Hopper ptr-array grouped GEMM as a launcher
library. Its problem shapes and pointers are device tables, so one build serves every
shape (gate/up and down projections, any hidden size and FFN width) and every routing:
a kernel fills the tables from the routing counts and no host synchronisation is needed.

:class:`GroupedGemm` is one such GEMM bound to fixed device tables: ``groups`` slots of
(M, N, K), A, B and D pointers, strides filled once (they depend on N and K only).
"""

from __future__ import annotations

import ctypes as c
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuco.kernels.collectives import KernelSource
from cuco.kernels.launcher_source import LAUNCHER_PARTS
from cuco.kernels.render import render

#: Configurations (name: tile, schedule), one build each; each serves every shape.
#: ``bench/moe_compute.py`` times them against each other.
CONFIGS: dict[str, tuple[tuple[int, int, int], str]] = {
    "cooperative_128x128x64": ((128, 128, 64), "cooperative"),
    "cooperative_128x256x64": ((128, 256, 64), "cooperative"),
    "pingpong_64x128x64": ((64, 128, 64), "pingpong"),
    "pingpong_128x128x64": ((128, 128, 64), "pingpong"),
}
#: The layer's pick per row regime (:func:`default_config`), from ``bench/results/moe_compute.json``
#: (b77b06f, 1 x H100): at decode counts (1-16 rows an expert) pingpong 64x128 was the fastest of
#: the four on all three expert shapes (1.08-1.11x torch._grouped_mm + SwiGLU), at prefill
#: counts (256+ rows) cooperative 128x256 (1.08-1.13x); cooperative 128x128, the earlier
#: single build, ran prefill at 0.85x.
DECODE_CONFIG = "pingpong_64x128x64"
PREFILL_CONFIG = "cooperative_128x256x64"
#: Mean rows an expert receives below which the decode pick is taken: a 64-row tile wastes
#: less of a short group, and a 128x256 tile needs many rows to fill its waves. Between the
#: measured regimes (16 and 256) the threshold is a model, not a measurement.
DECODE_ROWS = 128
DEFAULT_CONFIG = PREFILL_CONFIG


def default_config(rows_per_expert: float) -> str:
    """The configuration the layer builds for groups of about ``rows_per_expert`` rows."""
    return DECODE_CONFIG if rows_per_expert < DECODE_ROWS else PREFILL_CONFIG


#: bytes of one group's (M, N, K) entry, as the MoE kernels write it
SHAPE_BYTES = 12


def grouped_gemm_source(tile: tuple[int, int, int] = CONFIGS[DEFAULT_CONFIG][0],
                        schedule: str = CONFIGS[DEFAULT_CONFIG][1]) -> KernelSource:
    """The launcher source of the grouped GEMM (bf16, fp32 accumulation)."""
    tm, tn, tk = tile
    src = render("moe_grouped_gemm.cu.j2", cutlass_type="cutlass::bfloat16_t", tile_m=tm, tile_n=tn,
                 tile_k=tk, schedule=schedule, name=f"{schedule} t{tm}x{tn}x{tk}", **LAUNCHER_PARTS)
    return KernelSource(f"moe_grouped_gemm.{schedule}_{tm}x{tn}x{tk}", src, ("cutlass",),
                        ("cuco_gg_prepare", "cuco_gg_launch"))


def config_source(name: str) -> KernelSource:
    """The launcher source of configuration ``name`` (:data:`CONFIGS`)."""
    if name not in CONFIGS:
        raise ValueError(f"grouped GEMM configuration {name!r}: one of {', '.join(CONFIGS)}")
    tile, schedule = CONFIGS[name]
    return grouped_gemm_source(tile, schedule)


def build(compiler=None, config: str = DEFAULT_CONFIG) -> Path:
    """The launcher library's path (compiled once per configuration, then cached)."""
    from cuco.kernels import Compiler
    s = config_source(config)
    return (compiler or Compiler()).compile(s.source, needs=s.needs, name=s.name).path


def load(ctx, path: str | Path | None = None, config: str = DEFAULT_CONFIG):
    """The launcher library of this worker (``path``, else configuration ``config`` built if
    needed), its module loaded on the device."""
    key = ("moe_grouped_gemm", str(path) if path is not None else config)
    lib = ctx.scratch.get(key)
    if lib is None:
        lib = c.CDLL(str(path or build(config=config)))
        lib.cuco_gg_prepare.argtypes = [c.c_int, c.c_void_p, c.c_int, *([c.c_void_p] * 8), c.c_int]
        lib.cuco_gg_prepare.restype = c.c_void_p
        lib.cuco_gg_release.argtypes = [c.c_void_p]
        lib.cuco_gg_release.restype = None
        lib.cuco_gg_launch.argtypes = [c.c_int, c.c_void_p, c.c_void_p]
        lib.cuco_gg_launch.restype = c.c_int
        lib.cuco_gg_workspace_bytes.argtypes = [c.c_int, c.c_int]
        lib.cuco_gg_workspace_bytes.restype = c.c_ulonglong
        lib.cuco_gg_strides.argtypes = [c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_void_p, c.c_void_p]
        sizes = (c.c_int * 5)()
        lib.cuco_gg_sizes(sizes)
        if sizes[0] != SHAPE_BYTES:
            raise RuntimeError(f"grouped GEMM problem shapes are {sizes[0]} bytes, the MoE kernels "
                               f"write {SHAPE_BYTES}")
        lib.stride_bytes = tuple(sizes[1:4])
        rc = lib.cuco_gg_setup(ctx.device)
        if rc != 0:
            raise RuntimeError(f"loading the grouped GEMM failed (CUDA error {rc})")
        ctx.scratch[key] = lib
    return lib


@dataclass
class GroupedGemm:
    """``groups`` GEMMs of width ``n`` and depth ``k`` over device tables this object owns:
    ``shapes`` (int32 [groups, 3]) and ``a``, ``b``, ``d`` (uint64 [groups]) are filled on the
    device by whoever knows the sizes; :meth:`__call__` launches all groups at once."""

    lib: object
    device: int
    groups: int
    n: int
    k: int
    sms: int

    def __post_init__(self) -> None:
        self._params: dict[tuple[int, int], int] = {}  # (first, count) -> cuco_gg_prepare's block
        import cupy
        g = self.groups
        self.shapes = cupy.zeros((g, 3), dtype=cupy.int32)
        self.a = cupy.zeros(g, dtype=cupy.uint64)
        self.b = cupy.zeros(g, dtype=cupy.uint64)
        self.d = cupy.zeros(g, dtype=cupy.uint64)
        host = [np.zeros(g * nb, dtype=np.uint8) for nb in self.lib.stride_bytes]
        self.lib.cuco_gg_strides(g, self.n, self.k, *(h.ctypes.data for h in host))
        self.strides = [cupy.asarray(h) for h in host]
        self.workspace = cupy.zeros(max(1, int(self.lib.cuco_gg_workspace_bytes(g, self.sms))),
                                    dtype=cupy.uint8)

    def table_ptrs(self) -> tuple[int, int, int, int]:
        """Device addresses of the shapes, A, B and D tables (for the kernel that fills them)."""
        return (int(self.shapes.data.ptr), int(self.a.data.ptr), int(self.b.data.ptr),
                int(self.d.data.ptr))

    def __call__(self, stream_ptr: int, first: int = 0, count: int | None = None) -> None:
        """Groups ``[first, first + count)`` (all by default) on ``stream_ptr``; the first
        launch of a range prepares its parameters (and its workspace, on that stream)."""
        count = self.groups - first if count is None else count
        params = self._params.get((first, count))
        if params is None:
            sa, sb, sd = (int(s.data.ptr) for s in self.strides)
            sh, a, b, d = self.table_ptrs()
            params = self.lib.cuco_gg_prepare(self.device, stream_ptr, count, sh + 12 * first, a + 8 * first,
                                              sa, b + 8 * first, sb, d + 8 * first, sd,
                                              int(self.workspace.data.ptr), self.sms)
            if not params:
                raise RuntimeError(f"grouped GEMM groups [{first}, {first + count}) of width {self.n} and "
                                   f"depth {self.k}: CUTLASS cannot run them")
            self._params[(first, count)] = params
            # the parameters (this object's tables and workspace) live as long as this object
            weakref.finalize(self, self.lib.cuco_gg_release, params)
        rc = self.lib.cuco_gg_launch(self.device, stream_ptr, params)
        if rc != 0:
            raise RuntimeError(f"grouped GEMM launch failed (CUDA error {rc})")
