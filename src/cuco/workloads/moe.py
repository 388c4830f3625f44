"""MoE layer: token dispatch -> expert FFN -> combine, experts split across ranks.

DeepSeek-V3-like by default (256 experts, top-8, hidden 7168, expert FFN 2048).
Each rank holds ``tokens`` tokens ``x [T, H]``, the router's picks (``ids [T, K]``,
drawn from a seeded router with realistic imbalance, or one of the edge routings)
and ``experts / w`` experts; expert ``e`` lives on rank ``e // (E / w)`` and computes
``silu(x @ W1_e) @ W2_e`` (one up and one down projection: the gate of SwiGLU is left
out). Each rank's output is ``out[t] = sum_k weight[t, k] * expert_{ids[t, k]}(x[t])``.

Both programs sort their token-expert pairs by expert (so an expert's rows are
contiguous) and learn the count matrix ``C[source][expert]`` on the host (its sizes
drive the per-expert GEMM launches), then:

* host-driven: NCCL send/recv of the rows (all-to-all), a gather into expert-major
  order, per-expert cuBLAS GEMMs, the reverse gather, NCCL send/recv back, weighted sum;
* fused (``side_stream``): a kernel stores each group of experts' rows straight into the
  owner's expert-major buffer with an arrival counter per group; each group's GEMMs
  start once its rows arrived; a second kernel stores each computed group back into
  the sources' return buffers; the weighted sum runs when all returned.

The fp32 reference all-gathers tokens and picks, computes every local expert's
weighted output for every token (bf16 products exact in fp32; the activation split
into two bf16 terms), and reduce-scatters the partial sums in fp32 over NCCL.
"""

from __future__ import annotations

import math

import numpy as np

from cuco.design import Directives, MoEProblem
from cuco.design.problem import DTYPE_BYTES
from cuco.design.tiles import sizes_cutting
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes
from cuco.runtime.arena import ArenaLayout, arena_view
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.runtime.timing import spin
from cuco.workloads.base import EPS, Buffers, Runner, register
from cuco.workloads.pipeline import MAX_FLAGS, OPEN_SLOT, THREADS, PipelineWorkload


def route(shape: MoEProblem, world_size: int, seed: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [T, K] int32, weights [T, K] float32)`` of one rank, from ``seed``.

    ``skewed``: expert popularity ~ lognormal(0, 1) (a few hot experts, many cold),
    each token takes the top-k of popularity + Gumbel noise, weights a softmax over
    its picks' scores."""
    rng = np.random.default_rng([seed, rank, 7])
    T, E, K = shape.tokens, shape.experts, shape.topk
    pop = np.random.default_rng([seed, 11]).normal(0.0, 1.0, E)  # shared by all ranks
    if shape.routing == "empty_experts":
        local = E // world_size
        pop[np.arange(E) % local >= local // 2] = -np.inf
    scores = pop[None, :] + rng.gumbel(size=(T, E))
    if shape.routing == "one_expert":
        scores[:, 0] = np.inf
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :K].astype(np.int32)
    picked = np.take_along_axis(np.where(np.isfinite(scores), scores, 50.0), ids, axis=1)
    w = np.exp(picked - picked.max(axis=1, keepdims=True))
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


_SILU_BF16 = None


def silu_bf16(h) -> None:
    """In-place SiLU on bf16 storage (one pass; the host program's activation)."""
    global _SILU_BF16
    import cupy
    if _SILU_BF16 is None:
        _SILU_BF16 = cupy.ElementwiseKernel(
            "uint16 x", "uint16 y",
            "float f = __int_as_float(((unsigned int)x) << 16);"
            "unsigned int u = __float_as_int(f / (1.f + __expf(-f)));"
            "y = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
            "cuco_silu_bf16")
    _SILU_BF16(h, h)


@register
class MoE(PipelineWorkload):
    """``MoE(world_size, tokens=..., hidden=..., ffn=..., experts=..., topk=..., routing=...)``
    (fields of :class:`cuco.design.MoEProblem`)."""

    family = "moe"
    problem_type = MoEProblem
    problem: MoEProblem

    def small_problem(self) -> MoEProblem:
        """64 tokens, hidden 512, FFN 256, 4 experts per rank, at most top-2: the same
        routing."""
        w = self.world_size
        return self.problem.model_copy(update={"tokens": 64, "hidden": 512, "ffn": 256,
                                               "experts": 4 * w, "topk": min(self.shape.topk, 2)})

    @property
    def local_experts(self) -> int:
        return self.shape.experts // self.world_size

    @property
    def row_bytes(self) -> int:
        return self.shape.hidden * DTYPE_BYTES[self.dtype]

    @property
    def pairs(self) -> int:
        return self.shape.tokens * self.shape.topk

    @property
    def max_recv_rows(self) -> int:
        """Rows a rank can receive: every source's tokens, each at most min(K, E/w) times."""
        return self.world_size * self.shape.tokens * min(self.shape.topk, self.local_experts)

    def groups(self, d: Directives) -> int:
        """Expert groups per rank (the chunks): about ``chunk_bytes`` of rows each."""
        expected = self.pairs * self.row_bytes  # rows a rank receives on average
        g = max(1, min(self.local_experts, expected // d.chunk_bytes))
        while self.local_experts % g:
            g -= 1
        return g

    def layout(self) -> ArenaLayout:
        s = self.shape
        return ArenaLayout.build({"recv": self.max_recv_rows * self.row_bytes,
                                  "ret": self.pairs * self.row_bytes,
                                  "counts": self.world_size * s.experts * 4}, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """An average rank (the busiest does at least as much): its share of the pairs
        through both expert GEMMs, the rows through HBM once (not the weights: an expert
        no token picked need not read them), the rows it receives from peers for dispatch
        and back for combine."""
        s, w = self.shape, self.world_size
        rows_in = self.pairs * (w - 1) / w
        return Work(4.0 * self.pairs * s.hidden * s.ffn, 3 * self.pairs * self.row_bytes,
                    2 * rows_in * self.row_bytes)

    def plan(self, d: Directives) -> dict:
        """One chunk per group of experts (any chunk size groups the experts somehow)."""
        return {"groups": self.groups(d)}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.pairs * self.row_bytes, (1, 2, 4, 8, 16))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        src = render("moe.cu.j2", backend=d.backend.value, issuer=d.issuer.value,
                     ctype=CTYPES[self.dtype], experts=self.shape.experts,
                     experts_per_rank=self.local_experts, row_bytes=self.row_bytes,
                     max_ranks=MAX_RANKS, threads=THREADS, open_slot=OPEN_SLOT,
                     name=d.full_name, **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, ("share_counts", "dispatch_kernel", "combine_kernel",
                                               "silu_inplace", "wait_flags", "set_own_flag",
                                               "set_peer_flag"))

    def grid(self) -> list[Directives]:
        return self.grid_of(sizes_cutting(self.pairs * self.row_bytes, (1, 4, 16)),
                            [("lsa", "warp", 16), ("lsa", "cta", 32), ("nvshmem", "warp", 16)])

    def tolerance(self) -> tuple[float, float]:
        """The activation and each expert's output are rounded to the dtype once, the
        weighted sum once more."""
        eps = EPS[self.dtype]
        return 3 * eps, 3 * eps * (1 + math.sqrt(self.shape.ffn / 65536.0))

    # ---- GPU side -------------------------------------------------------------------------
    def make_inputs(self, ctx, seed: int) -> Buffers:
        import cupy
        s, el = self.shape, self.local_experts
        ids, w = route(s, self.world_size, seed, ctx.rank)
        rs = cupy.random.RandomState(1000 * seed + 10 * ctx.rank)
        x = dtypes.from_float32(rs.standard_normal((s.tokens, s.hidden), dtype=cupy.float32),
                                self.dtype)
        w1 = cupy.empty((el, s.hidden, s.ffn), dtype=cupy.uint16)
        w2 = cupy.empty((el, s.ffn, s.hidden), dtype=cupy.uint16)
        for e in range(el):  # expert by expert: no fp32 copy of all weights at once
            w1[e] = dtypes.from_float32(rs.standard_normal((s.hidden, s.ffn), dtype=cupy.float32)
                                        * cupy.float32(1 / math.sqrt(s.hidden)), self.dtype)
            w2[e] = dtypes.from_float32(rs.standard_normal((s.ffn, s.hidden), dtype=cupy.float32)
                                        * cupy.float32(1 / math.sqrt(s.ffn)), self.dtype)
        return {"x": x, "ids": cupy.asarray(ids), "weights": cupy.asarray(w), "w1": w1, "w2": w2}

    def reference(self, ctx, inputs: Buffers):
        import cupy
        s, W, el = self.shape, self.world_size, self.local_experts
        T, H, F, K = s.tokens, s.hidden, s.ffn, s.topk
        xg = cupy.empty((W * T, H), dtype=cupy.uint16)
        idg = cupy.empty((W * T, K), dtype=cupy.int32)
        wg = cupy.empty((W * T, K), dtype=cupy.float32)
        st = ctx.stream.ptr
        ctx.comm.all_gather(int(inputs["x"].data.ptr), int(xg.data.ptr), T * H, self.dtype, st)
        ctx.comm.all_gather(int(inputs["ids"].data.ptr), int(idg.data.ptr), T * K, "fp32", st)
        ctx.comm.all_gather(int(inputs["weights"].data.ptr), int(wg.data.ptr), T * K, "fp32", st)
        partial = cupy.zeros((W * T, H), dtype=cupy.float32)
        for j in range(el):
            e = ctx.rank * el + j
            tok, slot = cupy.nonzero(idg == e)
            n = int(tok.size)
            if n == 0:
                continue
            xe = xg[tok]
            h = cupy.empty((n, F), dtype=cupy.float32)
            gemm(int(xe.data.ptr), int(inputs["w1"][j].data.ptr), int(h.data.ptr), n, F, H,
                 self.dtype, ctx.stream, out_dtype="fp32")
            h = h / (1 + cupy.exp(-h))
            hi = dtypes.from_float32(h, self.dtype)
            lo = dtypes.from_float32(h - dtypes.to_float32(hi, self.dtype), self.dtype)
            y = cupy.empty((n, H), dtype=cupy.float32)
            for i, part in enumerate((hi, lo)):
                gemm(int(part.data.ptr), int(inputs["w2"][j].data.ptr), int(y.data.ptr), n, H, F,
                     self.dtype, ctx.stream, out_dtype="fp32", accumulate=i == 1)
            partial[tok] += wg[tok, slot][:, None] * y  # an expert sees a token at most once
        out = cupy.empty((T, H), dtype=cupy.float32)
        ctx.comm.reduce_scatter(int(partial.data.ptr), int(out.data.ptr), T * H, "fp32", st)
        return out

    def output_elems(self) -> int:
        return self.shape.tokens * self.shape.hidden

    # -- shared by both programs --
    def sort_pairs(self, inputs: Buffers):
        """``(order, counts)``: pairs sorted by expert (stable) and pairs per expert."""
        import cupy
        flat = inputs["ids"].reshape(-1)
        order = cupy.argsort(flat)
        counts = cupy.bincount(flat, minlength=self.shape.experts).astype(cupy.int32)
        return order, counts

    def tables(self, C: np.ndarray) -> dict[str, np.ndarray]:
        """Row offsets from the count matrix ``C[source, expert]`` (host)."""
        W, E, el = self.world_size, self.shape.experts, self.local_experts
        send_off = np.zeros((W, E), dtype=np.int64)
        send_off[:, 1:] = np.cumsum(C, axis=1)[:, :-1]
        per_expert = C.sum(axis=0)  # rows each expert computes
        recv_off = np.zeros((E, W), dtype=np.int64)
        expert_start = np.zeros(E, dtype=np.int64)
        for o in range(W):
            ex = slice(o * el, (o + 1) * el)
            starts = np.concatenate([[0], np.cumsum(per_expert[ex])[:-1]])
            expert_start[ex] = starts
            recv_off[ex] = starts[:, None] + np.concatenate(
                [np.zeros((el, 1), dtype=np.int64), np.cumsum(C[:, ex].T, axis=1)[:, :-1]], axis=1)
        return {"send_off": send_off, "recv_off": recv_off, "expert_rows": per_expert,
                "expert_start": expert_start}

    def expert_major_order(self, C: np.ndarray, owner: int) -> np.ndarray:
        """For each row of ``owner``'s expert-major buffer, its row in the [source][expert]
        buffer NCCL delivers (segments of ``C[s, e]`` rows, e local to ``owner``)."""
        W, el = self.world_size, self.local_experts
        Cl = C[:, owner * el:(owner + 1) * el].astype(np.int64)        # [source, local expert]
        src_start = (np.cumsum(Cl.reshape(-1)) - Cl.reshape(-1)).reshape(W, el)
        n = Cl.T.reshape(-1)                                            # expert-major segments
        dst_start = np.cumsum(n) - n
        return np.repeat(src_start.T.reshape(-1) - dst_start, n) + np.arange(int(n.sum()))

    def expert_ffn(self, ctx, inputs: Buffers, xin, h, y, start: np.ndarray, rows: np.ndarray,
                   experts, silu) -> None:
        """Per-expert GEMMs over expert-major rows (host knows each expert's rows)."""
        s, el, esz = self.shape, self.local_experts, DTYPE_BYTES[self.dtype]
        H, F = s.hidden, s.ffn
        w1, w2 = int(inputs["w1"].data.ptr), int(inputs["w2"].data.ptr)
        lo_row = hi_row = None
        for e in experts:
            j = e % el
            n = int(rows[e])
            if n == 0:
                continue
            r0 = int(start[e])
            lo_row = r0 if lo_row is None else lo_row
            hi_row = r0 + n
            gemm(xin + r0 * H * esz, w1 + j * H * F * esz, h + r0 * F * esz, n, F, H, self.dtype,
                 ctx.stream)
        if lo_row is None:
            return
        silu(h + lo_row * F * esz, (hi_row - lo_row) * F)
        for e in experts:
            j, n = e % el, int(rows[e])
            if n:
                r0 = int(start[e])
                gemm(h + r0 * F * esz, w2 + j * F * H * esz, y + r0 * H * esz, n, H, F,
                     self.dtype, ctx.stream)

    def weighted_sum(self, inputs: Buffers, order, ret, out) -> None:
        """``out[t] = sum_k weight[t, k] * ret[position of pair (t, k)]`` (fp32, rounded once)."""
        import cupy
        s = self.shape
        inv = cupy.empty_like(order)
        inv[order] = cupy.arange(order.size, dtype=order.dtype)
        y = dtypes.to_float32(ret.reshape(self.pairs, s.hidden)[inv], self.dtype)
        y = y.reshape(s.tokens, s.topk, s.hidden)
        acc = (y * inputs["weights"][:, :, None]).sum(axis=1)
        out.reshape(s.tokens, s.hidden)[...] = dtypes.from_float32(acc, self.dtype)

    def _buffers(self, ctx):
        key = ("moe_buffers", self.label)
        b = ctx.scratch.get(key)
        if b is None:
            s = self.shape
            rows = self.max_recv_rows
            b = ctx.scratch[key] = {
                "send": dtypes.empty(self.pairs * s.hidden, self.dtype),
                "h": dtypes.empty(rows * s.ffn, self.dtype),
                "y": dtypes.empty(rows * s.hidden, self.dtype),
            }
        return b

    def host_sequence(self, ctx, inputs: Buffers, out):
        import cupy
        s, W, E, el = self.shape, self.world_size, self.shape.experts, self.local_experts
        H, K = s.hidden, s.topk
        esz = DTYPE_BYTES[self.dtype]
        b = self._buffers(ctx)
        rows = self.max_recv_rows
        recv = dtypes.empty(rows * H, self.dtype)     # [source][expert] as NCCL delivers
        xin = dtypes.empty(rows * H, self.dtype)      # expert-major
        yout = dtypes.empty(rows * H, self.dtype)     # [source][expert] again
        ret = dtypes.empty(self.pairs * H, self.dtype)
        cmat = cupy.empty((W, E), dtype=cupy.int32)
        st = ctx.stream.ptr
        me = ctx.rank

        def run():
            order, counts = self.sort_pairs(inputs)
            b["send"].reshape(self.pairs, H)[...] = inputs["x"][order // K]
            ctx.comm.all_gather(int(counts.data.ptr), int(cmat.data.ptr), E, "fp32", st)
            C = cupy.asnumpy(cmat, stream=ctx.stream)  # the sizes drive NCCL and the GEMMs
            ctx.stream.synchronize()
            t = self.tables(C)
            # [source][expert] layout of what each rank receives, and its expert-major order
            src_rows = C[:, me * el:(me + 1) * el].sum(axis=1)
            src_start = np.concatenate([[0], np.cumsum(src_rows)[:-1]])
            perm = self.expert_major_order(C, me)
            perm_d = cupy.asarray(perm)
            with ctx.comm.group():
                for o in range(W):
                    n = int(C[me, o * el:(o + 1) * el].sum())
                    off = int(t["send_off"][me, o * el])
                    if n:
                        ctx.comm.send(int(b["send"].data.ptr) + off * H * esz, n * H, self.dtype, o, st)
                    if src_rows[o]:
                        ctx.comm.recv(int(recv.data.ptr) + int(src_start[o]) * H * esz,
                                      int(src_rows[o]) * H, self.dtype, o, st)
            total = perm.size
            if total:
                xin.reshape(rows, H)[:total] = recv.reshape(rows, H)[perm_d]
            self.expert_ffn(ctx, inputs, int(xin.data.ptr), int(b["h"].data.ptr),
                            int(b["y"].data.ptr), t["expert_start"], t["expert_rows"],
                            range(me * el, (me + 1) * el),
                            lambda p, n: silu_bf16(_view(p, n)))
            if total:
                yout.reshape(rows, H)[perm_d] = b["y"].reshape(rows, H)[:total]
            with ctx.comm.group():
                for o in range(W):
                    if src_rows[o]:
                        ctx.comm.send(int(yout.data.ptr) + int(src_start[o]) * H * esz,
                                      int(src_rows[o]) * H, self.dtype, o, st)
                    n = int(C[me, o * el:(o + 1) * el].sum())
                    off = int(t["send_off"][me, o * el])
                    if n:
                        ctx.comm.recv(int(ret.data.ptr) + off * H * esz, n * H, self.dtype, o, st)
            self.weighted_sum(inputs, order, ret, out)
        return run

    def compute_only(self, ctx, inputs: Buffers):
        """The expert FFNs on this rank's share of rows, as the routing gives them."""
        import cupy
        s, W, el = self.shape, self.world_size, self.local_experts
        b = self._buffers(ctx)
        xin = dtypes.random(self.max_recv_rows * s.hidden, self.dtype, 41 + ctx.rank)
        counts = cupy.bincount(inputs["ids"].reshape(-1), minlength=s.experts).astype(cupy.int32)
        cmat = cupy.empty((W, s.experts), dtype=cupy.int32)
        ctx.comm.all_gather(int(counts.data.ptr), int(cmat.data.ptr), s.experts, "fp32",
                            ctx.stream.ptr)
        t = self.tables(cupy.asnumpy(cmat, stream=ctx.stream))
        me = ctx.rank
        return lambda: self.expert_ffn(ctx, inputs, int(xin.data.ptr), int(b["h"].data.ptr),
                                       int(b["y"].data.ptr), t["expert_start"], t["expert_rows"],
                                       range(me * el, (me + 1) * el),
                                       lambda p, n: silu_bf16(_view(p, n)))

    def comm_only(self, ctx, inputs: Buffers):
        """Both all-to-alls (dispatch and combine) of the routing's row counts, by NCCL."""
        import cupy
        s, W, el, H = self.shape, self.world_size, self.local_experts, self.shape.hidden
        esz = DTYPE_BYTES[self.dtype]
        counts = cupy.bincount(inputs["ids"].reshape(-1), minlength=s.experts).astype(cupy.int32)
        cmat = cupy.empty((W, s.experts), dtype=cupy.int32)
        ctx.comm.all_gather(int(counts.data.ptr), int(cmat.data.ptr), s.experts, "fp32",
                            ctx.stream.ptr)
        C = cupy.asnumpy(cmat, stream=ctx.stream)
        me, st = ctx.rank, ctx.stream.ptr
        send = dtypes.random(self.pairs * H, self.dtype, 51 + me)
        recv = dtypes.empty(self.max_recv_rows * H, self.dtype)
        sends = [int(C[me, o * el:(o + 1) * el].sum()) for o in range(W)]
        recvs = [int(C[o, me * el:(me + 1) * el].sum()) for o in range(W)]

        def a2a(sn, rn):
            so = ro = 0
            with ctx.comm.group():
                for o in range(W):
                    if sn[o]:
                        ctx.comm.send(int(send.data.ptr) + so * H * esz, sn[o] * H, self.dtype, o, st)
                    if rn[o]:
                        ctx.comm.recv(int(recv.data.ptr) + ro * H * esz, rn[o] * H, self.dtype, o, st)
                    so, ro = so + sn[o], ro + rn[o]

        def run():
            a2a(sends, recvs)
            a2a(recvs, sends)
        return run

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        return MoERunner(ctx, self, d, binary, arena, inputs, out)


def _view(ptr: int, n: int):
    """A uint16 CuPy view of ``n`` elements at device address ``ptr``."""
    import cupy
    mem = cupy.cuda.UnownedMemory(ptr, n * 2, None)
    return cupy.ndarray((n,), dtype=cupy.uint16, memptr=cupy.cuda.MemoryPointer(mem, 0))


class MoERunner:
    """Counts shared on the device (then read by the host for the GEMM sizes); rows
    dispatched and returned by two kernels on the side stream, expert groups computed
    on the compute stream as their rows arrive."""

    def __init__(self, ctx, wl: MoE, d: Directives, cubin: str, arena, inputs: Buffers, out):
        import cupy
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.output = out
        self.stress_us = 0.0
        self.layout = wl.layout()
        self.groups = wl.groups(d)
        self.f = {n: ctx.function(cubin, n) for n in
                  ("share_counts", "dispatch_kernel", "combine_kernel", "silu_inplace",
                   "wait_flags", "set_own_flag", "set_peer_flag")}
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        self.b = wl._buffers(ctx)
        s = wl.shape
        self.counts_view = arena_view(arena, self.layout.data["counts"], 2 * wl.world_size * s.experts,
                                       "bf16").view(cupy.int32)
        self.recv = arena.ptr + self.layout.data["recv"]
        self.ret = arena_view(arena, self.layout.data["ret"], wl.pairs * s.hidden, wl.dtype)
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.pinned = cupy.cuda.alloc_pinned_memory(wl.world_size * s.experts * 4)
        # every GEMM shape's first launch, the activation and the sorting kernels, alone
        order, counts = wl.sort_pairs(inputs)
        self.b["send"].reshape(wl.pairs, s.hidden)[...] = inputs["x"][order // s.topk]
        wl.weighted_sum(inputs, order, self.ret, out)
        self._silu(int(self.b["h"].data.ptr), 8)
        spin(ctx.stream, 0.0)
        ctx.stream.synchronize()
        self.warm_rows: set[int] = set()

    def _silu(self, ptr: int, n: int) -> None:
        self.f["silu_inplace"]((264,), (256,), (np.uint64(ptr), np.int64(n)), stream=self.ctx.stream)

    def _warm(self, t: dict) -> None:
        """cuBLAS picks (and may load) a kernel per new row count: run each once alone."""
        wl, ctx = self.wl, self.ctx
        el, me = wl.local_experts, ctx.rank
        new = {int(t["expert_rows"][e]) for e in range(me * el, (me + 1) * el)} - self.warm_rows
        new.discard(0)
        if not new:
            return
        s = wl.shape
        x, h, y = self.recv, int(self.b["h"].data.ptr), int(self.b["y"].data.ptr)
        w1, w2 = int(self.inputs["w1"].data.ptr), int(self.inputs["w2"].data.ptr)
        for n in sorted(new):
            gemm(x, w1, h, n, s.ffn, s.hidden, wl.dtype, ctx.stream)
            gemm(h, w2, y, n, s.hidden, s.ffn, wl.dtype, ctx.stream)
        ctx.stream.synchronize()
        self.warm_rows |= new

    def __call__(self) -> None:
        import cupy
        ctx, a, wl, st, cs = self.ctx, self.arena, self.wl, self.ctx.stream, self.comm_stream
        s, W, me, G = wl.shape, wl.world_size, ctx.rank, self.groups
        el, H = wl.local_experts, s.hidden
        a.epoch += 1
        e = np.uint64(a.epoch)
        flags = np.uint64(self.layout.flags)
        args = a.args(ctx)
        # arrival counters (dispatch and return) restart at zero; then peers may write here
        cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags, 0, 2 * G * 8 * 8, st.ptr)
        k_ret = G * 8  # must match kRet = kGroups * kMaxRanks of the template (8 ranks)
        for r in range(W):
            self.f["set_peer_flag"]((1,), (1,), (*args, flags, np.int32(OPEN_SLOT + me),
                                                 np.int32(r), e), stream=st)
        order, counts = wl.sort_pairs(self.inputs)
        self.b["send"].reshape(wl.pairs, H)[...] = self.inputs["x"][order // s.topk]
        self.f["share_counts"]((1,), (256,), (*args, counts, np.uint64(self.layout.data["counts"]),
                                              flags, e), stream=st)
        cupy.cuda.runtime.memcpyAsync(self.pinned.ptr, int(self.counts_view.data.ptr),
                                      W * s.experts * 4, 2, st.ptr)
        st.synchronize()  # the host needs the sizes for the GEMM launches
        C = np.frombuffer(self.pinned, dtype=np.int32, count=W * s.experts).reshape(W, s.experts).copy()
        t = wl.tables(C)
        self._warm(t)
        send_off = cupy.asarray(t["send_off"])
        recv_off = cupy.asarray(t["recv_off"])
        cmat = cupy.asarray(C)
        self.start.record(st)
        cs.wait_event(self.start)
        grid, block = (self.d.comm_ctas,), (THREADS,)
        self.f["dispatch_kernel"](grid, block, (*args, self.b["send"], cmat, send_off, recv_off,
                                                np.uint64(self.layout.data["recv"]), flags, e),
                                  stream=cs)
        self.f["combine_kernel"](grid, block, (*args, self.b["y"], cmat, send_off, recv_off,
                                               np.uint64(self.layout.data["ret"]), flags, e),
                                 stream=cs)
        per = el // G
        for g in range(G):
            if self.stress_us:
                spin(st, self.stress_us)
            self.f["wait_flags"]((1,), (32,), (*args, flags, np.int32(g * W), np.int32(W),
                                               np.uint64(self.d.comm_ctas)), stream=st)
            experts = range(me * el + g * per, me * el + (g + 1) * per)
            wl.expert_ffn(ctx, self.inputs, self.recv, int(self.b["h"].data.ptr),
                          int(self.b["y"].data.ptr), t["expert_start"], t["expert_rows"],
                          experts, self._silu)
            self.f["set_own_flag"]((1,), (1,), (*args, flags, np.int32(2 * k_ret + g), e), stream=st)
        self.f["wait_flags"]((1,), (256,), (*args, flags, np.int32(k_ret), np.int32(G * W),
                                            np.uint64(self.d.comm_ctas)), stream=st)
        wl.weighted_sum(self.inputs, order, self.ret, self.output)
        self.done.record(cs)
        st.wait_event(self.done)
