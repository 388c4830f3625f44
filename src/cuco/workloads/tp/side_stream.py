"""Launch a ``side_stream`` fused variant inside a worker.

One call: the communication kernel starts on a second stream; the compute
stream runs the GEMM chunk by chunk (waiting for a chunk's arrival first for
AllGather+GEMM, raising its flag afterwards for the reductions); the compute
stream then waits for the communication stream. Buffers that peers read or
write live in the symmetric arena (:mod:`cuco.runtime.arena`: an NCCL window, or
NVSHMEM symmetric memory).

``backend=gin`` runs in an emulated world (:class:`cuco.runtime.emulated.EmuGin`): its
puts are completed by a proxy CTA (``gin_proxy``) on a third stream, launched before the
communication kernel and stopped by a flag the communication stream sets after it; the
call ends when both are done. Its receive slots are the arena's ``r`` region.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cuco.design import Backend, Directives
from cuco.design.tiles import CHUNK_GEOM_BYTES, ChunkPlan, pack_chunk_geom
from cuco.kernels.tp import THREADS
from cuco.runtime.arena import Arena, arena_view, own_layout
from cuco.runtime.cublas import gemm
from cuco.runtime.timing import spin
from cuco.workloads.base import Buffers
from cuco.workloads.tp.sync_slots import side_stream_live

if TYPE_CHECKING:
    from cuco.workloads.tp.workload import GemmWorkload


class SideStreamRunner:
    """``runner()`` performs one fused call of one variant on ``ctx.stream``."""

    def __init__(self, ctx, wl: "GemmWorkload", d: Directives, cubin: str, arena: Arena,
                 inputs: Buffers, out):
        import cupy
        self.ctx, self.wl, self.d, self.arena = ctx, wl, d, arena
        self.plan = ChunkPlan.for_problem(wl.pattern_problem, d)
        #: the plan as the kernels take it, by value (``cuco::ChunkGeom``): CuPy passes a
        #: host array of one element by value, its bytes the struct's
        self.geom = np.frombuffer(pack_chunk_geom(self.plan), dtype=np.dtype((np.void, CHUNK_GEOM_BYTES)))
        self.pattern = wl.tp
        #: > 0 during correctness runs: the compute stream sleeps this long before
        #: each chunk's GEMM, so a consumer that reads a chunk before its flag says
        #: so meets NaN poison every time instead of stale data some of the time.
        self.stress_us = 0.0
        self.layout = own_layout(arena, wl.layout())
        self.comm = ctx.function(cubin, "comm_kernel")
        self.signal = ctx.function(cubin, "signal_chunk")
        self.wait = ctx.function(cubin, "wait_chunk")
        streams = ctx.scratch.setdefault("side_streams", {})
        if "comm" not in streams:
            streams["comm"] = cupy.cuda.Stream(non_blocking=True)
        self.comm_stream = streams["comm"]
        #: backend=gin: the emulated NIC beside the communication kernel, and where the
        #: puts land (the reductions' receive slots; AllGather puts into XF itself)
        self.proxy = ctx.function(cubin, "gin_proxy") if d.backend is Backend.GIN else None
        if self.proxy is not None:
            streams.setdefault("gin_proxy", cupy.cuda.Stream(non_blocking=True))
            self.proxy_stream = streams["gin_proxy"]
            self.proxy_done = cupy.cuda.Event(disable_timing=True)
        self.sync_off = self.layout.data.get("r", self.layout.bar) if self.proxy else self.layout.bar
        self.inputs, self.out = inputs, out
        # where the result lands: the all-reduced output stays in the arena (every rank's O)
        if self.pattern.output_in_arena:
            rows, cols = wl.output_shape()
            self.output = arena_view(arena, self.layout.data["o"], rows * cols, wl.dtype)
        else:
            self.output = out
        self.start, self.done = cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True)
        self._warm_gemm()

    def live_slots(self):
        """The slots of its sync region this variant's kernels write (the evaluator holds
        the rest at zero: :class:`cuco.runtime.arena.LiveSlots`)."""
        return side_stream_live(self.layout, self.pattern, self.plan, self.d, self.ctx.world_size)

    def _warm_gemm(self) -> None:
        """Run the chunk-shaped GEMMs, the epilogue and the stress spin once alone, so
        no first launch (module loading, which waits for running kernels; library
        heuristics) ever happens while the communication kernel spins."""
        wl, plan = self.wl, self.plan
        m, n, k = wl.local_gemm()
        x, w = int(self.inputs["x"].data.ptr), int(self.inputs["w"].data.ptr)
        dst = self.arena.ptr + self.layout.data["p"] if "p" in self.layout.data else int(self.out.data.ptr)
        for rows in sorted({plan.rows, plan.last_rows}):  # a ragged plan's short chunk too
            gemm(x, w, dst, rows, n, k, wl.dtype, self.ctx.stream)
            wl.chunk_epilogue(self.ctx, self.inputs, dst, 0, rows, self.ctx.stream)
        spin(self.ctx.stream, 0.0)
        self.ctx.stream.synchronize()

    def __call__(self) -> None:
        ctx, a, wl, plan, lay = self.ctx, self.arena, self.wl, self.plan, self.layout
        s, cs = ctx.stream, self.comm_stream
        a.epoch += 1
        e = np.uint64(a.epoch)
        base = a.ptr
        u64 = np.uint64
        self.start.record(s)
        cs.wait_event(self.start)
        if self.proxy is not None:
            self.proxy_stream.wait_event(self.start)
            self.proxy((1,), (256,), (*a.args(ctx), e), stream=self.proxy_stream)
        grid, block = (self.d.comm_ctas,), (THREADS,)
        esz = plan.dtype_bytes
        x, w = int(self.inputs["x"].data.ptr), int(self.inputs["w"].data.ptr)
        m, n, k = wl.local_gemm()
        if not self.pattern.gathers_input:
            # the reduced result goes to the arena's O (all-reduce) or this rank's `out`
            dest = u64(lay.data["o"]) if self.pattern.output_in_arena else self.out
            self.comm(grid, block, (*a.args(ctx), self.geom, u64(lay.data["p"]), dest, u64(lay.flags),
                                    u64(self.sync_off), e), stream=cs)
            for chunk in plan.order():
                if self.stress_us:
                    spin(s, self.stress_us)
                dst = base + lay.data["p"] + chunk.row * n * esz
                gemm(x + chunk.row * k * esz, w, dst, chunk.rows, n, k, wl.dtype, s)
                wl.chunk_epilogue(ctx, self.inputs, dst, chunk.row, chunk.rows, s)
                self.signal((1,), (1,), (*a.args(ctx), u64(lay.flags), np.int32(chunk.index), e),
                            stream=s)
        else:  # allgather_gemm: own shard first from X itself, then peers' as they arrive
            self.comm(grid, block, (*a.args(ctx), self.geom, self.inputs["x"], u64(lay.data["xf"]),
                                    u64(lay.flags), u64(self.sync_off), e), stream=cs)
            a.counts[: plan.chunks_per_block] += self.d.comm_ctas
            me, W = ctx.rank, ctx.world_size
            o = int(self.out.data.ptr)
            for step in range(W):
                src = (me + step) % W
                for c in range(plan.chunks_per_block):
                    row, rows = src * plan.block_rows + c * plan.rows, plan.rows_of(c)
                    if self.stress_us:
                        spin(s, self.stress_us)
                    if src == me:
                        a_ptr = x + c * plan.rows * k * esz
                    else:
                        self.wait((1,), (1,), (*a.args(ctx), self.geom, u64(lay.flags), np.int32(src),
                                               np.int32(c), u64(int(a.counts[c]))), stream=s)
                        a_ptr = base + lay.data["xf"] + row * k * esz
                    gemm(a_ptr, w, o + row * n * esz, rows, n, k, wl.dtype, s)
                    wl.chunk_epilogue(ctx, self.inputs, o + row * n * esz, row, rows, s)
        if self.proxy is not None:  # the proxy drains the queue, then ends
            ctx.gin.stop_proxy(cs)
            self.proxy_done.record(self.proxy_stream)
            s.wait_event(self.proxy_done)
        self.done.record(cs)
        s.wait_event(self.done)
