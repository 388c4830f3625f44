"""The fused MoE call on one host (``moe.cu.j2``: LSA stores or NVSHMEM puts), and the steps
every fused MoE call shares (its routing tables, the expert tables, one group's grouped
GEMMs); the GIN call (:mod:`cuco.workloads.moe.gin`) runs the same steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cuco.design import Directives
from cuco.kernels.collectives import MAX_RANKS
from cuco.runtime.arena import own_layout
from cuco.runtime.timing import spin
from cuco.workloads.base import Buffers
from cuco.workloads.moe import host as moe_host
from cuco.workloads.pipeline import OPEN_SLOT, THREADS

if TYPE_CHECKING:
    from cuco.workloads.moe.workload import MoE

#: Threads of the combine kernel's CTAs, and at most how many CTAs it runs.
COMBINE_THREADS, COMBINE_CTAS = 256, 528


def combine_grid_limit(ctx) -> int:
    """The most CTAs the combine may have. Its CTAs spin until every rank's expert outputs are
    ready, so in an emulated world, where the W ranks' combines share one GPU, it is held to
    what a rank may spin on (:func:`~cuco.runtime.emulated.spinning_grid_limit`): the early
    ranks' combines must not hold every SM while the last rank's grouped GEMMs wait for one
    (with experts left empty, so ranks finish far apart, W = 8 on 1 x H100 hung:
    ``bench/logs/tests_moe_programs_emulated_w8_hang_h100_34685ae.log``). A GPU of its own
    keeps :data:`COMBINE_CTAS`."""
    if not ctx.options.emulated:
        return COMBINE_CTAS
    from cuco.runtime.emulated import persistent_sms, spinning_grid_limit
    return min(COMBINE_CTAS, spinning_grid_limit(persistent_sms(), True))


class MoERunner:
    """One fused call, device-side end to end (see ``moe.cu.j2``): routing and the counts'
    exchange, then rows dispatched on the side stream while the compute stream runs each
    expert group's grouped GEMMs as its rows arrive, then the combine."""

    KERNELS = ("route_kernel", "expert_tables", "dispatch_kernel", "swiglu_kernel", "combine_kernel",
               "set_flag_everywhere", "set_peer_flag", "wait_flags")

    def live_slots(self):
        """The slots of its sync region this variant's kernels write (the evaluator holds
        the rest at zero between calls: :class:`cuco.runtime.arena.LiveSlots`)."""
        return self.wl.live_slots(self.layout, self.d)

    def __init__(self, ctx, wl: MoE, d: Directives, cubin: str, arena, inputs: Buffers, out):
        import cupy
        from cuco.workloads.moe.grouped_gemm import GroupedGemm, load
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.output = out
        self.stress_us = 0.0
        self.layout = own_layout(arena, wl.layout())
        self.groups = wl.groups(d)
        self.f = {n: ctx.function(cubin, n) for n in self.KERNELS}
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        s, el = wl.shape, wl.local_experts
        rows = wl.max_recv_rows
        i32 = cupy.int32
        self.dest, self.order = cupy.empty(wl.pairs, i32), cupy.empty(wl.pairs, i32)
        self.send_start = cupy.empty(s.experts + 1, i32)
        self.local_start = cupy.empty(el + 1, i32)
        key = (wl.label, str(cubin))  # one variant's runners (one per input set) share these
        self.h = moe_host.scratch(ctx, (*key, "h"), rows * 2 * s.ffn, wl.dtype)
        self.act = moe_host.scratch(ctx, (*key, "act"), rows * s.ffn, wl.dtype)
        lib, sms = load(ctx, config=wl.grouped_gemm_config), int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self.gu = GroupedGemm(lib, ctx.device, el, 2 * s.ffn, s.hidden, sms)
        self.dn = GroupedGemm(lib, ctx.device, el, s.hidden, s.ffn, sms)
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.combine_ctas = max(1, min(combine_grid_limit(ctx), -(-s.tokens * (self.wl.row_bytes // 16)
                                                                  // COMBINE_THREADS)))
        ctx.stream.synchronize()

    def expert_tables(self) -> None:
        """The grouped GEMMs' device tables of this rank's experts (from ``local_start``,
        which the routing kernel wrote), on the compute stream."""
        a, el, data = self.arena, self.wl.local_experts, self.layout.data
        recv, y = np.uint64(a.ptr + data["recv"]), np.uint64(a.ptr + data["y"])
        self.f["expert_tables"]((-(-el // 128),), (128,), (
            self.local_start, recv, self.inputs["wgu"], self.h, self.act, self.inputs["wd"], y,
            *(np.uint64(p) for p in self.gu.table_ptrs()), *(np.uint64(p) for p in self.dn.table_ptrs())),
            stream=self.ctx.stream)

    def experts(self, g: int) -> None:
        """Group ``g``'s gate/up grouped GEMM, SwiGLU and down grouped GEMM, on the compute
        stream (its rows have arrived)."""
        st, per = self.ctx.stream, self.wl.local_experts // self.groups
        self.gu(st.ptr, g * per, per)
        self.f["swiglu_kernel"]((264,), (256,), (self.h, self.act, self.local_start,
                                                 np.int32(g * per), np.int32((g + 1) * per)), stream=st)
        self.dn(st.ptr, g * per, per)

    def __call__(self) -> None:
        import cupy
        ctx, a, wl, st, cs = self.ctx, self.arena, self.wl, self.ctx.stream, self.comm_stream
        W, me, G = wl.world_size, ctx.rank, self.groups
        data = self.layout.data
        a.epoch += 1
        e = np.uint64(a.epoch)
        flags = np.uint64(self.layout.flags)
        args = a.args(ctx)
        k_cnt = G * MAX_RANKS  # kCnt of the template; kDone, kFin follow
        k_done, k_fin = k_cnt + MAX_RANKS, k_cnt + 2 * MAX_RANKS
        # arrival counters restart at zero; then peers may write here
        cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags, 0, k_cnt * 8, st.ptr)
        for r in range(W):
            self.f["set_peer_flag"]((1,), (1,), (*args, flags, np.int32(OPEN_SLOT + me), np.int32(r), e),
                                    stream=st)
        inp = self.inputs
        self.f["route_kernel"]((1,), (32 * wl.route_warps(),), (
            *args, inp["ids"], self.dest, self.order, self.send_start, self.local_start,
            np.uint64(data["counts"]), flags, e), stream=st)
        self.start.record(st)
        cs.wait_event(self.start)
        self.f["dispatch_kernel"]((self.d.comm_ctas,), (THREADS,), (
            *args, inp["x"], self.order, self.send_start, self.dest, np.uint64(data["recv"]), flags),
            stream=cs)
        self.expert_tables()
        for g in range(G):
            if self.stress_us:
                spin(st, self.stress_us)
            self.f["wait_flags"]((1,), (32,), (*args, flags, np.int32(g * MAX_RANKS), np.int32(W),
                                               np.uint64(self.d.comm_ctas)), stream=st)
            self.experts(g)
        # slot [kDone + me] / [kFin + me] of every rank: each waits for all W slots
        self.f["set_flag_everywhere"]((1,), (32,), (*args, flags, np.int32(k_done + me), e), stream=st)
        self.f["combine_kernel"]((self.combine_ctas,), (COMBINE_THREADS,), (
            *args, inp["ids"], inp["weights"], self.dest, self.output, np.uint64(data["y"]), flags, e),
            stream=st)
        self.f["set_flag_everywhere"]((1,), (32,), (*args, flags, np.int32(k_fin + me), e), stream=st)
        self.f["wait_flags"]((1,), (32,), (*args, flags, np.int32(k_fin), np.int32(W), e), stream=st)
        self.done.record(cs)
        st.wait_event(self.done)
