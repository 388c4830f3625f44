"""The MoE layer's host-driven programs: what a user writes with NCCL and a grouped GEMM.

Each call sorts this rank's (token, k) pairs by expert, gathers their token rows into one
send buffer, learns every rank's counts on the host (NCCL sizes come from the host), sends
the rows to their experts' owners with NCCL send/recv, runs the SwiGLU FFN of every local
expert, sends the outputs back and sums each token's top-k outputs with its weights.

The FFN's GEMMs, one program each:

* ``cutlass``: one CUTLASS grouped GEMM per projection (:mod:`cuco.workloads.moe.grouped_gemm`)
  over the received segments as NCCL delivered them ([source][expert]): every segment is
  a group of its own, so no row is moved to make experts contiguous;
* ``torch``: ``torch._grouped_mm`` per projection, which wants each expert's rows
  contiguous: the rows are gathered into expert-major order and the outputs scattered back;
* ``per_expert``: cuBLAS GEMMs expert by expert (the loop a first version has).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuco.design.problem import DTYPE_BYTES
from cuco.runtime import dtypes
from cuco.runtime.cublas import gemm

#: bf16 bits <-> fp32 in CuPy kernels (round to nearest even)
_BF16 = ("__device__ float bf(unsigned short x) { return __int_as_float(((unsigned int)x) << 16); }\n"
         "__device__ unsigned short rn(float f) { unsigned int u = __float_as_int(f);"
         " return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }\n")
_KERNELS: dict[str, object] = {}


def _kernel(name: str):
    """The CuPy kernels of the host programs, made once per process."""
    import cupy
    if not _KERNELS:
        _KERNELS["swiglu"] = cupy.ElementwiseKernel(
            "raw uint16 h, int64 F", "uint16 y",
            "const long long r = i / F, f = i % F;"
            "const float g = bf(h[r * 2 * F + f]), u = bf(h[r * 2 * F + F + f]);"
            "y = rn(g / (1.f + __expf(-g)) * u);", "cuco_moe_swiglu", preamble=_BF16)
        _KERNELS["combine"] = cupy.ElementwiseKernel(
            "raw uint16 ret, raw int64 at, raw float32 w, int64 H, int64 K", "uint16 y",
            "const long long t = i / H, c = i % H; float acc = 0.f;"
            "for (int k = 0; k < K; ++k) acc += w[t * K + k] * bf(ret[at[t * K + k] * H + c]);"
            "y = rn(acc);", "cuco_moe_weighted_sum", preamble=_BF16)
    return _KERNELS[name]


def swiglu(h, act, rows: int, ffn: int) -> None:
    """``act[r, f] = silu(h[r, f]) * h[r, F + f]`` over ``rows`` rows (bf16 storage)."""
    if rows:
        _kernel("swiglu")(h, np.int64(ffn), act[:rows * ffn])


def scratch(ctx, key: tuple, n: int, dtype: str):
    """A buffer of ``n`` elements kept in the worker under ``key``: one program's input sets
    run one after another on one stream, so they share its working buffers. A host
    program's are poisoned after each of its verified calls (:attr:`HostMoE.scratch`):
    every call writes each row it reads before reading it."""
    cache = ctx.scratch.setdefault("moe_scratch", {})
    b = cache.get(key)
    if b is None or b.size != n:
        b = cache[key] = dtypes.empty(n, dtype)
    return b


def held(ctx, key: tuple) -> list:
    """A list kept in the worker under ``key``, shared like :func:`scratch`'s buffers."""
    return ctx.scratch.setdefault("moe_scratch", {}).setdefault(key, [])


def all_to_all(wl, ctx, src, dst, send_rows: list[int], recv_rows: list[int]) -> None:
    """Rows ``send_rows[o]`` of ``src`` to rank o, ``recv_rows[o]`` from it into ``dst`` (NCCL)."""
    H, esz, st = wl.shape.hidden, DTYPE_BYTES[wl.dtype], ctx.stream.ptr
    so = ro = 0
    with ctx.comm.group():
        for o in range(wl.world_size):
            if send_rows[o]:
                ctx.comm.send(int(src.data.ptr) + so * H * esz, send_rows[o] * H, wl.dtype, o, st)
            if recv_rows[o]:
                ctx.comm.recv(int(dst.data.ptr) + ro * H * esz, recv_rows[o] * H, wl.dtype, o, st)
            so, ro = so + send_rows[o], ro + recv_rows[o]


class HostMoE:
    """One host program on one input set of one rank: ``HostMoE(wl, ctx, inputs, out, gemm)()``.

    :attr:`scratch`: every buffer between its steps, each holding part of the answer,
    poisoned with its output once a call is verified."""

    def __init__(self, wl, ctx, inputs, out, ffn: str):
        import cupy
        self.wl, self.ctx, self.inputs, self.out, self.ffn = wl, ctx, inputs, out, ffn
        s = wl.shape
        rows = wl.max_recv_rows
        buf = lambda name, n: scratch(ctx, (wl.label, ffn, name), n, wl.dtype)  # noqa: E731
        self.send = buf("send", wl.pairs * s.hidden)
        self.recv = buf("recv", rows * s.hidden)    # [source][expert], as NCCL delivers
        self.h = buf("h", rows * 2 * s.ffn)
        self.act = buf("act", rows * s.ffn)
        self.y = buf("y", rows * s.hidden)          # same layout as recv
        self.ret = buf("ret", wl.pairs * s.hidden)
        self.cmat = cupy.empty((wl.world_size, s.experts), dtype=cupy.int32)
        if ffn == "cutlass":
            from cuco.workloads.moe.grouped_gemm import GroupedGemm, load
            lib, sms = load(ctx, config=wl.grouped_gemm_config), _sms()
            g = wl.world_size * wl.local_experts
            self.gu = GroupedGemm(lib, ctx.device, g, 2 * s.ffn, s.hidden, sms)
            self.dn = GroupedGemm(lib, ctx.device, g, s.hidden, s.ffn, sms)
        if ffn == "per_expert":  # expert-major copies of the rows and outputs
            self.xem = buf("xem", rows * s.hidden)
            self.yem = buf("yem", rows * s.hidden)
        if ffn == "torch":
            from cuco.runtime import torch_bridge
            el, H, F = wl.local_experts, s.hidden, s.ffn
            # torch's tensors of the last call (gathered rows, h, act, the experts' outputs),
            # as CuPy views: held until the next call, so they are scrubbed with the others
            # before torch's allocator takes them back
            self.torch_held = held(ctx, (wl.label, ffn, "held"))
            self.tstream = torch_bridge.stream(ctx)
            self.wgu_t = torch_bridge.tensor(inputs["wgu"], "bf16", (el, 2 * F, H)).transpose(1, 2)
            self.wd_t = torch_bridge.tensor(inputs["wd"], "bf16", (el, H, F)).transpose(1, 2)

    @property
    def scratch(self) -> tuple:
        """The buffers a call leaves part of the answer in (none is an input): the rows
        sent and received, every rank's counts, h, act and the experts' outputs
        (and their expert-major copies, or torch's tensors of them), the outputs returned."""
        bufs = [self.send, self.recv, self.cmat, self.h, self.act, self.y, self.ret]
        if self.ffn == "per_expert":
            bufs += [self.xem, self.yem]
        if self.ffn == "torch":
            bufs += self.torch_held
        return tuple(bufs)

    # ---- the steps -------------------------------------------------------------------
    def counts(self):
        """``(order, C)``: this rank's pairs sorted by expert, every rank's counts (host)."""
        import cupy
        wl, ctx = self.wl, self.ctx
        flat = self.inputs["ids"].reshape(-1)
        order = cupy.argsort(flat)
        counts = cupy.bincount(flat, minlength=wl.shape.experts).astype(cupy.int32)
        ctx.comm.all_gather(int(counts.data.ptr), int(self.cmat.data.ptr), wl.shape.experts, "fp32",
                            ctx.stream.ptr)
        C = cupy.asnumpy(self.cmat, stream=ctx.stream)  # NCCL's sizes come from the host
        ctx.stream.synchronize()
        return order, C

    def expert_ffn(self, C: np.ndarray) -> None:
        """``y = FFN(recv)`` of every received segment ([source][expert] order kept)."""
        wl, ctx = self.wl, self.ctx
        el, me = wl.local_experts, ctx.rank
        seg = C[:, me * el:(me + 1) * el].astype(np.int64)      # rows [source, local expert]
        total = int(seg.sum())
        if self.ffn == "cutlass":
            self._cutlass(seg)
        elif self.ffn == "torch":
            self._torch(C, total)
        else:
            self._per_expert(C)

    def _cutlass(self, seg: np.ndarray) -> None:
        s, ctx, inp = self.wl.shape, self.ctx, self.inputs
        H, F, el = s.hidden, s.ffn, self.wl.local_experts
        n = seg.reshape(-1)
        r0 = np.cumsum(n) - n
        j = np.tile(np.arange(el), self.wl.world_size)
        esz = 2
        st = ctx.stream
        ptr = lambda a: int(a.data.ptr)  # noqa: E731
        for gg, m, k, a, ak, b, bk, d, dn in (
                (self.gu, 2 * F, H, self.recv, H, inp["wgu"], 2 * F * H, self.h, 2 * F),
                (self.dn, H, F, self.act, F, inp["wd"], H * F, self.y, H)):
            gg.shapes.set(np.stack([n, np.full_like(n, m), np.full_like(n, k)], 1).astype(np.int32), st)
            gg.a.set((ptr(a) + r0 * ak * esz).astype(np.uint64), st)
            gg.b.set((ptr(b) + j * bk * esz).astype(np.uint64), st)
            gg.d.set((ptr(d) + r0 * dn * esz).astype(np.uint64), st)
            gg(st.ptr)
            if gg is self.gu:
                swiglu(self.h, self.act, int(n.sum()), F)

    def _torch(self, C: np.ndarray, total: int) -> None:
        import cupy
        import torch
        from cuco.runtime import torch_bridge
        wl, s = self.wl, self.wl.shape
        H, F, el, me = s.hidden, s.ffn, wl.local_experts, self.ctx.rank
        self.torch_held.clear()  # the last call's, poisoned once it was verified
        if total == 0:
            return
        perm = cupy.asarray(wl.expert_major_order(C, me))
        offs = cupy.asarray(np.cumsum(C[:, me * el:(me + 1) * el].sum(axis=0)).astype(np.int32))
        with torch.cuda.stream(self.tstream):
            recv = torch_bridge.tensor(self.recv, "bf16", (wl.max_recv_rows, H))
            y = torch_bridge.tensor(self.y, "bf16", (wl.max_recv_rows, H))
            p = torch.as_tensor(perm, device="cuda")
            o = torch.as_tensor(offs, device="cuda")
            rows = recv[p]
            h = torch._grouped_mm(rows, self.wgu_t, offs=o)
            act = torch.nn.functional.silu(h[:, :F])
            act.mul_(h[:, F:])  # in place: no third tensor of the FFN's width
            out_em = torch._grouped_mm(act, self.wd_t, offs=o)  # expert-major
            y[p] = out_em
        self.torch_held[:] = [torch_bridge.storage(t) for t in (rows, h, act, out_em)]

    def _per_expert(self, C: np.ndarray) -> None:
        import cupy
        wl, ctx, inp = self.wl, self.ctx, self.inputs
        s, el, me = wl.shape, wl.local_experts, ctx.rank
        H, F, esz, R = s.hidden, s.ffn, 2, wl.max_recv_rows
        perm = wl.expert_major_order(C, me)  # each expert's rows contiguous for its GEMMs
        total = perm.size
        if total == 0:
            return
        pd = cupy.asarray(perm)
        # straight into xem: a gathered copy of the received rows would go back to the pool
        cupy.take(self.recv.reshape(R, H), pd, axis=0, out=self.xem.reshape(R, H)[:total])
        rows = C[:, me * el:(me + 1) * el].sum(axis=0).astype(np.int64)
        start = np.cumsum(rows) - rows
        x, h, act, y = (int(b.data.ptr) for b in (self.xem, self.h, self.act, self.yem))
        for j in range(el):
            n, r0 = int(rows[j]), int(start[j])
            if n:
                gemm(x + r0 * H * esz, int(inp["wgu"].data.ptr) + j * 2 * F * H * esz,
                     h + r0 * 2 * F * esz, n, 2 * F, H, wl.dtype, ctx.stream, trans_b=True)
        swiglu(self.h, self.act, total, F)
        for j in range(el):
            n, r0 = int(rows[j]), int(start[j])
            if n:
                gemm(act + r0 * F * esz, int(inp["wd"].data.ptr) + j * H * F * esz,
                     y + r0 * H * esz, n, H, F, wl.dtype, ctx.stream, trans_b=True)
        self.y.reshape(R, H)[pd] = self.yem.reshape(R, H)[:total]

    def __call__(self) -> None:
        wl, me = self.wl, self.ctx.rank
        s, el = wl.shape, wl.local_experts
        H, K = s.hidden, s.topk
        order, C = self.counts()
        self.send.reshape(wl.pairs, H)[...] = self.inputs["x"][order // K]
        to_owner = [int(C[me, o * el:(o + 1) * el].sum()) for o in range(wl.world_size)]
        from_src = [int(C[o, me * el:(me + 1) * el].sum()) for o in range(wl.world_size)]
        all_to_all(wl, self.ctx, self.send, self.recv, to_owner, from_src)
        self.expert_ffn(C)
        all_to_all(wl, self.ctx, self.y, self.ret, from_src, to_owner)
        self.weighted_sum(order)

    def weighted_sum(self, order) -> None:
        """``out[t] = sum_k w[t, k] * ret[position of pair (t, k)]``: one fused pass, fp32."""
        import cupy
        s = self.wl.shape
        at = cupy.empty_like(order)
        at[order] = cupy.arange(order.size, dtype=order.dtype)
        _kernel("combine")(self.ret, at, self.inputs["weights"], np.int64(s.hidden), np.int64(s.topk),
                           self.out.reshape(-1)[:s.tokens * s.hidden])


def _sms() -> int:
    import cupy
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def ffn_choice(ctx) -> str:
    """The grouped GEMM of the strongest host program here: torch's where torch runs in this
    worker, CUTLASS's otherwise."""
    from cuco.runtime import torch_bridge
    return "cutlass" if torch_bridge.unusable(ctx) else "torch"


def host_program(wl, ctx, inputs, out, ffn: str) -> Callable[[], None]:
    return HostMoE(wl, ctx, inputs, out, ffn)


def compute_only(wl, ctx, inputs) -> Callable[[], None]:
    """The expert FFNs on this rank's share of rows, as the routing gives them, with the
    CUTLASS grouped GEMM (expert-major rows, one group per local expert)."""
    import cupy
    from cuco.workloads.moe.grouped_gemm import GroupedGemm, load
    s, W, el, me = wl.shape, wl.world_size, wl.local_experts, ctx.rank
    H, F = s.hidden, s.ffn
    counts = cupy.bincount(inputs["ids"].reshape(-1), minlength=s.experts).astype(cupy.int32)
    cmat = cupy.empty((W, s.experts), dtype=cupy.int32)
    ctx.comm.all_gather(int(counts.data.ptr), int(cmat.data.ptr), s.experts, "fp32", ctx.stream.ptr)
    C = cupy.asnumpy(cmat, stream=ctx.stream)
    rows = C[:, me * el:(me + 1) * el].sum(axis=0).astype(np.int64)
    r0 = np.cumsum(rows) - rows
    total = int(rows.sum())
    n = max(total, 1)
    x = dtypes.random(n * H, wl.dtype, 41 + me)
    h, act, y = (dtypes.empty(n * 2 * F, wl.dtype), dtypes.empty(n * F, wl.dtype),
                 dtypes.empty(n * H, wl.dtype))
    lib, sms = load(ctx, config=wl.grouped_gemm_config), _sms()
    j = np.arange(el)
    ggs = []
    for m, k, a, ak, b, bk, d, dn in ((2 * F, H, x, H, inputs["wgu"], 2 * F * H, h, 2 * F),
                                      (H, F, act, F, inputs["wd"], H * F, y, H)):
        gg = GroupedGemm(lib, ctx.device, el, m, k, sms)
        gg.shapes.set(np.stack([rows, np.full(el, m), np.full(el, k)], 1).astype(np.int32))
        gg.a.set((int(a.data.ptr) + r0 * ak * 2).astype(np.uint64))
        gg.b.set((int(b.data.ptr) + j * bk * 2).astype(np.uint64))
        gg.d.set((int(d.data.ptr) + r0 * dn * 2).astype(np.uint64))
        ggs.append(gg)
    ctx.stream.synchronize()

    def run():
        ggs[0](ctx.stream.ptr)
        swiglu(h, act, total, F)
        ggs[1](ctx.stream.ptr)
    # x and y are reached only through the grouped GEMMs' pointer tables: freed here, every
    # call would read and write blocks the pool hands to the next allocation
    run.keepalive = (x, y)  # type: ignore[attr-defined]
    return run


def comm_only(wl, ctx, inputs) -> Callable[[], None]:
    """Both all-to-alls (dispatch and combine) of the routing's row counts, by NCCL."""
    import cupy
    s, W, el, H = wl.shape, wl.world_size, wl.local_experts, wl.shape.hidden
    counts = cupy.bincount(inputs["ids"].reshape(-1), minlength=s.experts).astype(cupy.int32)
    cmat = cupy.empty((W, s.experts), dtype=cupy.int32)
    ctx.comm.all_gather(int(counts.data.ptr), int(cmat.data.ptr), s.experts, "fp32", ctx.stream.ptr)
    C = cupy.asnumpy(cmat, stream=ctx.stream)
    me = ctx.rank
    send = dtypes.random(wl.pairs * H, wl.dtype, 51 + me)
    recv = dtypes.empty(wl.max_recv_rows * H, wl.dtype)
    to_owner = [int(C[me, o * el:(o + 1) * el].sum()) for o in range(W)]
    from_src = [int(C[o, me * el:(me + 1) * el].sum()) for o in range(W)]

    def run():
        all_to_all(wl, ctx, send, recv, to_owner, from_src)
        all_to_all(wl, ctx, recv, send, from_src, to_owner)
    return run
