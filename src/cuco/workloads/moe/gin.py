"""The fused MoE call for ranks on different hosts (``backend=gin``, ``moe_gin.cu.j2``).

Every byte that crosses ranks is a GIN put with a signal: the counts rows, the dispatched
token rows (staged in the arena's ``send`` region, a put's source being a window) and, since
GIN has no load from a peer, the experts' outputs, which each owner puts back into its
sources' ``ret`` region. In an emulated world (:class:`cuco.runtime.emulated.EmuGin`) a proxy
CTA (``gin_proxy``) on a stream of its own completes the puts late and out of order; it runs
for the whole call, since the routing kernel, the communication kernel and the closing
handshake all put or signal, and is stopped once the last of them has.
"""

from __future__ import annotations

import numpy as np

from cuco.errors import DirectiveError
from cuco.runtime.emulated import GIN_SIGNALS
from cuco.runtime.timing import spin
from cuco.workloads.moe.runner import COMBINE_THREADS, MoERunner
from cuco.workloads.pipeline import MAX_FLAGS, THREADS

#: Where group g's "its expert outputs are in y" flag is (``kComputed`` + g of the template);
#: slots [0, groups) below it count the group's own rows copied.
COMPUTED_SLOT = MAX_FLAGS // 2
#: GIN signals the template uses besides one per group (counts, returned outputs, leaving).
FIXED_SIGNALS = 3


def plan_check(groups: int) -> None:
    """:class:`DirectiveError` where a GIN variant of ``groups`` groups needs more signals or
    flag slots than a rank has."""
    if FIXED_SIGNALS + groups > GIN_SIGNALS or COMPUTED_SLOT + groups > MAX_FLAGS:
        raise DirectiveError([f"chunk_bytes: {groups} expert groups need {FIXED_SIGNALS + groups} GIN "
                              f"signals, more than {GIN_SIGNALS}; choose a larger chunk_bytes"])


def template_constants() -> dict:
    """What ``moe_gin.cu.j2`` is rendered with beyond the layer's shape."""
    return {"computed_slot": COMPUTED_SLOT, "gin_signals": GIN_SIGNALS}


class MoEGinRunner(MoERunner):
    """One GIN call (see ``moe_gin.cu.j2``): the proxy starts, the routing kernel exchanges
    counts and raises the call's signal shadows, the communication kernel dispatches every
    group and then returns each group's outputs as the compute stream finishes it, the compute
    stream waits for each group's rows, runs its GEMMs and says so, combines once every output
    is back, and leaves the call with every rank."""

    KERNELS = ("route_kernel", "expert_tables", "comm_kernel", "swiglu_kernel", "wait_rows",
               "group_computed", "combine_kernel", "leave_call", "gin_proxy")

    def __init__(self, ctx, wl, d, cubin, arena, inputs, out):
        import cupy
        super().__init__(ctx, wl, d, cubin, arena, inputs, out)
        streams = ctx.scratch.setdefault("side_streams", {})
        self.proxy_stream = streams.setdefault("gin_proxy", cupy.cuda.Stream(non_blocking=True))
        self.begin = cupy.cuda.Event(disable_timing=True)
        self.proxy_done = cupy.cuda.Event(disable_timing=True)

    def __call__(self) -> None:
        import cupy
        ctx, a, wl, st, cs = self.ctx, self.arena, self.wl, self.ctx.stream, self.comm_stream
        data, inp, u64 = self.layout.data, self.inputs, np.uint64
        a.epoch += 1
        e = u64(a.epoch)
        flags = u64(self.layout.flags)
        args = a.args(ctx)
        # this rank's own-row counters restart at zero (no peer writes this rank's flags)
        cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags, 0, self.groups * 8, st.ptr)
        self.begin.record(st)
        self.proxy_stream.wait_event(self.begin)
        self.f["gin_proxy"]((1,), (256,), (*args, e), stream=self.proxy_stream)
        self.f["route_kernel"]((1,), (32 * wl.route_warps(),), (
            *args, inp["ids"], self.dest, self.order, self.send_start, self.local_start,
            u64(data["counts"])), stream=st)
        self.start.record(st)
        cs.wait_event(self.start)
        self.f["comm_kernel"]((self.d.comm_ctas,), (THREADS,), (
            *args, inp["x"], self.order, self.send_start, self.dest, self.local_start,
            *(u64(data[r]) for r in ("recv", "send", "y", "ret", "counts")), flags, e), stream=cs)
        self.done.record(cs)
        self.expert_tables()
        for g in range(self.groups):
            if self.stress_us:
                spin(st, self.stress_us)
            self.f["wait_rows"]((1,), (1,), (*args, flags, np.int32(g), u64(self.d.comm_ctas)), stream=st)
            self.experts(g)
            self.f["group_computed"]((1,), (1,), (*args, flags, np.int32(g), e), stream=st)
        self.f["combine_kernel"]((self.combine_ctas,), (COMBINE_THREADS,), (
            *args, inp["ids"], inp["weights"], self.dest, self.order, self.send_start, self.output,
            u64(data["y"]), u64(data["ret"])), stream=st)
        st.wait_event(self.done)  # the communication kernel, its puts flushed, before leaving
        self.f["leave_call"]((1,), (1,), (*args,), stream=st)
        ctx.gin.stop_proxy(st)  # the proxy drains what is queued (the leave signals), then ends
        self.proxy_done.record(self.proxy_stream)
        st.wait_event(self.proxy_done)
