"""What every fused call of context-parallel attention shares, whatever computes it
(``core=own``: :class:`~cuco.workloads.cp.CPRunner`; a library core:
:class:`~cuco.workloads.cp.library.LibraryRunner`): the start of a call (arrival counters
reset, every peer told it may write into this rank's slots, the persistent comm kernel of
``cp_attention.cu.j2`` launched on a side stream behind that) and its end (the compute stream
waits for the side stream)."""

from __future__ import annotations

import numpy as np

from cuco.runtime.arena import own_layout
from cuco.runtime.timing import spin
from cuco.workloads.pipeline import OPEN_SLOT, THREADS


class FusedCall:
    """The shared half of a CP runner; a subclass computes between :meth:`_start` and
    :meth:`_finish` on ``ctx.stream``."""

    stress_us = 0.0
    #: kernels of the rendered source the runner launches (the attention's own aside)
    COMM_KERNELS = ("comm_kernel", "set_peer_flag")

    def live_slots(self):
        """The slots of its sync region this variant's kernels write (the evaluator holds
        the rest at zero between calls: :class:`cuco.runtime.arena.LiveSlots`)."""
        return self.wl.live_slots(self.layout, self.d)

    def _setup(self, ctx, wl, d, cubin: str, arena, inputs, out) -> None:
        """What every CP runner holds: the plan's chunks, the comm kernels, the side stream,
        the K and V base address of every slot (this rank's inputs; the peers' in the arena)."""
        import cupy
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.output = out
        self.layout = own_layout(arena, wl.layout())
        self.rows = wl.chunk_rows(d)
        self.n = wl.shard // self.rows
        self.f = {name: ctx.function(cubin, name) for name in self.COMM_KERNELS}
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        w, me = wl.world_size, ctx.rank
        step = wl.shard * wl.row_elems * wl.esz
        kvg = arena.ptr + self.layout.data["kvg"]
        self.kv_bases = ([int(inputs["k"].data.ptr) if p == me else kvg + 2 * p * step for p in range(w)],
                         [int(inputs["v"].data.ptr) if p == me else kvg + (2 * p + 1) * step
                          for p in range(w)])
        self.done = cupy.cuda.Event(disable_timing=True)
        self.start = cupy.cuda.Event(disable_timing=True)

    def _settle_modules(self) -> None:
        """The stress spin loaded and both streams idle: CUDA loads a kernel's module lazily,
        and a first load beside a spinning kernel can hang."""
        spin(self.comm_stream, 0.0)
        self.ctx.stream.synchronize()
        self.comm_stream.synchronize()

    def _start(self, transfers: bool = True) -> None:
        """The call's start: this rank's arrival counters reset, every peer told it may write
        into our slots, and (``transfers``) :meth:`_transfer` behind that."""
        import cupy
        ctx, a, wl, s = self.ctx, self.arena, self.wl, self.ctx.stream
        a.epoch += 1
        e = np.uint64(a.epoch)
        flags = np.uint64(self.layout.flags)
        me, W = ctx.rank, wl.world_size
        # arrival counters restart at zero, then every sender may write into our slots
        cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags, 0, W * self.n * 8, s.ptr)
        open_slot = np.int32(OPEN_SLOT + me)
        for r in range(W):
            if r != me:
                self.f["set_peer_flag"]((1,), (1,), (*a.args(ctx), flags, open_slot, np.int32(r), e),
                                        stream=s)
        self.start.record(s)
        if transfers:
            self._transfer(self.start)

    def _transfer(self, after) -> None:
        """The comm kernel on the side stream, behind the event ``after`` of the compute stream."""
        a, ctx, cs = self.arena, self.ctx, self.comm_stream
        cs.wait_event(after)
        if self.stress_us:  # checked calls: the transfers start late, so a missing wait reads poison
            spin(cs, self.stress_us)
        flags, e = np.uint64(self.layout.flags), np.uint64(a.epoch)
        self.f["comm_kernel"]((self.d.comm_ctas,), (THREADS,),
                              (*a.args(ctx), self.inputs["k"], self.inputs["v"],
                               np.uint64(self.layout.data["kvg"]), flags, e), stream=cs)

    def _finish(self) -> None:
        """The call ends when the side stream's work has too."""
        self.done.record(self.comm_stream)
        self.ctx.stream.wait_event(self.done)
