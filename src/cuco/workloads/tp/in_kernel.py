"""Launch an ``epilogue`` or ``dedicated_ctas`` fused variant inside a worker.

One call is one launch of one persistent kernel (CUTLASS mainloop, communication
in the same kernel) on ``ctx.stream``, with the same arguments every call (the call's
epoch is kept on the device: ``cuco/calls.cuh``), so a CUDA graph can capture it. The
kernel is a shared object whose host function builds the TMA descriptors
(:mod:`cuco.kernels.tp`). Buffers that peers write live in the symmetric arena, like
the side-stream variants'.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from cuco.design import Directives, placement_rules
from cuco.kernels import fused_launch
from cuco.kernels.tp import split_counter_bytes, split_workspace_bytes
from cuco.runtime.arena import Arena, arena_view, own_layout
from cuco.runtime.emulated import persistent_sms
from cuco.workloads.base import Buffers
from cuco.workloads.tp.side_stream import SideStreamRunner
from cuco.workloads.tp.sync_slots import in_kernel_live

if TYPE_CHECKING:
    from cuco.workloads.tp.workload import GemmWorkload


def runner_class(d: Directives) -> type:
    """The launch code of ``d``'s placement: :class:`InKernelRunner` for the one-kernel
    placements, :class:`~cuco.workloads.tp.side_stream.SideStreamRunner` otherwise."""
    return InKernelRunner if d.placement.in_kernel else SideStreamRunner


class InKernelRunner:
    """``runner()`` performs one fused call of one in-kernel variant on ``ctx.stream``."""

    def __init__(self, ctx, wl: "GemmWorkload", d: Directives, library: str, arena: Arena,
                 inputs: Buffers, out):
        python = placement_rules.chunk_epilogue_refusal(type(wl).__name__, d.placement) \
            if wl.has_chunk_epilogue() else None
        if python:  # the workload's check refuses it first; a runner built directly, here
            raise ValueError(python)
        import cupy
        self.ctx, self.wl, self.d, self.arena = ctx, wl, d, arena
        self.pattern = wl.tp
        #: Unused: the kernel's arguments are the same in checked and timed calls; checked
        #: calls are stressed from outside (:mod:`cuco.runtime.stress`).
        self.stress_us = 0.0
        self.layout = lay = own_layout(arena, wl.layout())
        self.lib = ctx.launcher(library)
        # persistent: one CTA per SM (the tile buffers fill its smem), this rank's share of them
        self.grid = persistent_sms()
        if d.placement.own_comm_ctas and d.comm_ctas >= self.grid:
            raise ValueError(f"comm_ctas={d.comm_ctas} leaves no SM of {self.grid} for the GEMM")
        # this rank's m, n, k (its pattern's): the build takes any that tiles
        self.gemm = wl.tp.local_gemm(m=wl.m, n=wl.n, k=wl.k, world_size=wl.world_size)
        self.inputs, self.out = inputs, out
        if self.pattern.output_in_arena:
            rows, cols = wl.output_shape()
            self.output = arena_view(arena, lay.data["o"], rows * cols, wl.dtype)
        else:
            self.output = out
        w = ctx.world_size
        if arena.backend == "nvshmem":
            bases = [ctx.nvshmem.peer_ptr(arena.ptr, r) for r in range(w)]
            self.a0 = self.a1 = None
        else:  # LSA: the kernel maps peers through the window; only our base is used here
            bases = [arena.ptr if r == ctx.rank else 0 for r in range(w)]
            self.a0, self.a1 = ctx.devcomm.ptr, arena.window.handle
        self.bases = (ctypes.c_void_p * w)(*bases)
        data = lay.data["xf"] if self.pattern.gathers_input else lay.data["r"]
        # the last: the call state the kernel advances itself, so no argument changes between
        # calls (a CUDA graph may capture one and replay it)
        self.offsets = dict(data_off=data, stage_off=lay.data.get("p", 0), out_off=lay.data.get("o", 0),
                            flag_off=lay.in_kernel_flags, calls_off=lay.calls)
        # split-K: this runner's own workspace (arrival counters and fp32 partial tiles; the
        # kernel leaves the counters at zero), None for every other build
        ws = split_workspace_bytes(wl.pattern_problem, d)
        self.workspace = cupy.zeros(ws, dtype=cupy.uint8) if ws else None
        #: where its arrival counters end and the fp32 partial tiles begin
        self.counter_bytes = split_counter_bytes(wl.pattern_problem, d)
        self.offsets.update(workspace=int(self.workspace.data.ptr) if ws else None, workspace_bytes=ws)

    def live_slots(self):
        """The slots of its sync region this variant's kernels write (the evaluator holds
        the rest at zero: :class:`cuco.runtime.arena.LiveSlots`)."""
        return in_kernel_live(self.layout, self.pattern, self.wl.pattern_problem, self.d, self.ctx.rank)

    def poisoned_each_call(self) -> list:
        """Memory a call writes before it reads and that outlives it: a split-K build's
        fp32 partial tiles (each unit stores its own before the tile's last one reads them),
        poisoned before every call so nothing a kernel kept there reaches the next."""
        return [] if self.workspace is None else [self.workspace[self.counter_bytes:]]

    def zero_after_each_call(self) -> list:
        """Memory a call leaves at zero: a split-K build's arrival counters (the unit that
        counts a tile's last slice resets it); anything else there is state kept between
        calls."""
        return [] if self.workspace is None else [self.workspace[:self.counter_bytes]]

    def __call__(self) -> None:
        ctx = self.ctx
        # AllReduce writes its result into the arena: no `out` needed
        rc = self.lib.cuco_fused_launch(*fused_launch.pack(
            device=ctx.device, stream=ctx.stream.ptr, grid=self.grid, **self.gemm._asdict(),
            raster_group=self.d.raster_group, x=int(self.inputs["x"].data.ptr), w=int(self.inputs["w"].data.ptr),
            out=0 if self.out is None else int(self.out.data.ptr), a0=self.a0, a1=self.a1, peers=self.bases,
            me=ctx.rank, **self.offsets))
        if rc != 0:
            raise RuntimeError(f"fused kernel launch failed with CUDA error {rc}")
