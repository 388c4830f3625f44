"""Context-parallel attention: each rank's queries against every rank's keys and values.

Rank ``r`` of ``w`` holds tokens ``[r S/w, (r+1) S/w)`` of Q, K and V, laid out
``[S/w, H, D]`` (bf16). Its output is attention of its queries over all keys it
may see (all of them; or, causal, its own shard causally and earlier shards fully).

* host-driven: NCCL all-gather of K and V, then one flash-attention call over the
  gathered keys (PyTorch's ``scaled_dot_product_attention``, lower-right causal mask);
* fused (``side_stream``): a persistent kernel pushes this rank's K/V chunks into
  every rank that needs them (LSA stores / NVSHMEM pointers) and counts arrivals;
  the compute stream attends to its own shard first, then to each chunk as it
  arrives (flash attention returning the log-sum-exp), merging partial results.

The attention kernels are PyTorch's (flash attention): this workload needs torch on
the GPU machines. The reference is computed per head with bf16 products exact in
fp32 (cuBLAS, fp32 accumulation), softmax in fp32 and the probabilities split into
two bf16 terms for the product with V (about 16 significant bits).
"""

from __future__ import annotations

import math

import numpy as np

from cuco.design import CPProblem, Directives
from cuco.design.problem import DTYPE_BYTES, ROW_ALIGN
from cuco.design.tiles import largest_divisor, sizes_cutting
from cuco.errors import DirectiveError, EnvironmentProblem
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes
from cuco.runtime.arena import ArenaLayout, arena_view
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.runtime.timing import spin
from cuco.workloads.base import EPS, Buffers, Runner, register
from cuco.workloads.pipeline import (
    MAX_FLAGS, OPEN_SLOT, THREADS, PipelineWorkload, flag_plan_check,
)


def _torch():
    try:
        import torch
    except ImportError:
        raise EnvironmentProblem("cp_attention runs PyTorch's flash attention on the GPUs: "
                                 "install torch there (pip install 'cuco[torch]')") from None
    import cupy
    dev = cupy.cuda.Device().id
    if torch.cuda.current_device() != dev:
        torch.cuda.set_device(dev)  # the worker's GPU, not cuda:0
    return torch


@register
class CPAttention(PipelineWorkload):
    """``CPAttention(world_size, seq=..., heads=..., head_dim=..., causal=...)`` (fields of
    :class:`cuco.design.CPProblem`)."""

    family = "cp_attention"
    problem_type = CPProblem
    problem: CPProblem

    def small_problem(self) -> CPProblem:
        """256 tokens per rank, 4 heads of the same head dim, the same mask."""
        return self.problem.model_copy(update={"seq": 256 * self.world_size, "heads": 4})

    @property
    def shard(self) -> int:
        return self.shape.seq // self.world_size

    @property
    def row_elems(self) -> int:
        return self.shape.heads * self.shape.head_dim

    @property
    def esz(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def sources(self, rank: int) -> list[int]:
        """Ranks whose keys ``rank`` attends to besides its own, in the order it uses them."""
        w = self.world_size
        if self.shape.causal:
            return list(range(rank - 1, -1, -1))
        return [(rank + i) % w for i in range(1, w)]

    def chunk_rows(self, d: Directives) -> int:
        row_bytes = self.row_elems * self.esz
        rows = largest_divisor(self.shard, max(1, min(d.chunk_bytes // row_bytes, self.shard)))
        if rows is None:
            raise DirectiveError([f"chunk_bytes: a chunk of {d.chunk_bytes} bytes holds fewer than "
                                  f"{ROW_ALIGN} tokens of {row_bytes} bytes; choose chunk_bytes >= "
                                  f"{ROW_ALIGN * row_bytes}"])
        return rows

    def layout(self) -> ArenaLayout:
        gathered = self.world_size * 2 * self.shard * self.row_elems * self.esz
        return ArenaLayout.build({"kvg": gathered}, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """An average rank (the last causal one does more): its queries against the keys
        it may see (QK^T and PV), Q/K/V/O through HBM once, the K/V shards it receives."""
        s, w, shard = self.shape, self.world_size, self.shard
        keys = (w * shard / 2 if s.causal else s.seq)  # mean keys a query sees, over ranks
        peers = (w - 1) / 2 if s.causal else w - 1  # mean shards a rank receives
        shard_bytes = shard * self.row_elems * self.esz
        return Work(4.0 * shard * keys * self.row_elems, 4 * shard_bytes, 2 * peers * shard_bytes)

    def plan(self, d: Directives) -> dict:
        """Chunks of whole token groups of this rank's shard, a flag per chunk and peer."""
        rows = self.chunk_rows(d)
        n = self.shard // rows
        flag_plan_check(MAX_RANKS * n + MAX_RANKS, f"{n} chunks per rank")
        return {"n_chunks": n, "chunk_rows": rows}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.shard * self.row_elems * self.esz, (1, 2, 4, 8))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        s = self.shape
        src = render("cp_attention.cu.j2", backend=d.backend.value, issuer=d.issuer.value,
                     ctype=CTYPES[self.dtype], row_bytes=self.row_elems * self.esz,
                     heads=s.heads, head_dim=s.head_dim, causal=s.causal, comm_ctas=d.comm_ctas,
                     threads=THREADS, max_ranks=MAX_RANKS, open_slot=OPEN_SLOT,
                     name=d.full_name, **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, ("comm_kernel", "init_acc", "merge_partial",
                                               "finish", "wait_flags", "set_peer_flag"))

    def grid(self) -> list[Directives]:
        shard_bytes = self.shard * self.row_elems * self.esz
        return self.grid_of(sizes_cutting(shard_bytes, (1, 2, 4)),
                            [("lsa", "warp", 8), ("lsa", "cta", 16), ("lsa", "warp", 32),
                             ("nvshmem", "cta", 16)])

    def tolerance(self) -> tuple[float, float]:
        """Flash attention rounds P to the dtype before P @ V and the output once; a
        merge of partials adds one more rounding of each partial."""
        eps = EPS[self.dtype]
        return 3 * eps, 3 * eps

    # ---- GPU side -------------------------------------------------------------------------
    def make_inputs(self, ctx, seed: int) -> Buffers:
        import cupy
        n = self.shard * self.row_elems
        out = {}
        for i, name in enumerate(("q", "k", "v")):
            rs = cupy.random.RandomState(1000 * seed + 10 * ctx.rank + i)
            out[name] = dtypes.from_float32(rs.standard_normal(n, dtype=cupy.float32), self.dtype)
        return out

    def _t(self, arr, shape):
        """A torch view of a CuPy storage array in the workload dtype."""
        torch = _torch()
        import cupy
        t = torch.as_tensor(arr.view(cupy.int16), device="cuda")
        return t.view(torch.bfloat16 if self.dtype == "bf16" else torch.float16).view(*shape)

    def _gather(self, ctx, inputs: Buffers):
        """K and V of every rank, [S, H, D] each, by NCCL all-gather (exact: no arithmetic)."""
        n = self.shard * self.row_elems
        kg = dtypes.empty(self.world_size * n, self.dtype)
        vg = dtypes.empty(self.world_size * n, self.dtype)
        for src, dst in ((inputs["k"], kg), (inputs["v"], vg)):
            ctx.comm.all_gather(int(src.data.ptr), int(dst.data.ptr), n, self.dtype, ctx.stream.ptr)
        return kg, vg

    def kv_len(self, rank: int) -> int:
        return (rank + 1) * self.shard if self.shape.causal else self.shape.seq

    def reference(self, ctx, inputs: Buffers):
        """fp32-grade attention per head (see the module doc), [S/w, H, D]."""
        import cupy
        s, rows, kvl = self.shape, self.shard, self.kv_len(ctx.rank)
        kg, vg = self._gather(ctx, inputs)
        ld = self.row_elems
        scores = cupy.empty((rows, kvl), dtype=cupy.float32)
        out = cupy.empty((rows, s.heads, s.head_dim), dtype=cupy.float32)
        q0 = ctx.rank * rows
        if s.causal:
            masked = cupy.arange(kvl)[None, :] > (q0 + cupy.arange(rows))[:, None]
        for h in range(s.heads):
            off = h * s.head_dim * self.esz
            gemm(int(inputs["q"].data.ptr) + off, int(kg.data.ptr) + off, int(scores.data.ptr),
                 rows, kvl, s.head_dim, self.dtype, ctx.stream, lda=ld, ldb=ld, ldc=kvl,
                 out_dtype="fp32", trans_b=True)
            scores *= cupy.float32(1 / math.sqrt(s.head_dim))
            if s.causal:
                cupy.copyto(scores, cupy.float32(-cupy.inf), where=masked)
            scores -= scores.max(axis=1, keepdims=True)
            cupy.exp(scores, out=scores)
            scores /= scores.sum(axis=1, keepdims=True)
            hi = dtypes.from_float32(scores, self.dtype)
            lo = dtypes.from_float32(scores - dtypes.to_float32(hi, self.dtype), self.dtype)
            o = out[:, h, :]
            tmp = cupy.empty((rows, s.head_dim), dtype=cupy.float32)
            for i, part in enumerate((hi, lo)):
                gemm(int(part.data.ptr), int(vg.data.ptr) + off, int(tmp.data.ptr), rows,
                     s.head_dim, kvl, self.dtype, ctx.stream, ldb=ld, out_dtype="fp32",
                     accumulate=i == 1)
            o[...] = tmp
        return out

    def output_elems(self) -> int:
        return self.shard * self.row_elems

    def attention(self, q, k, v, causal: bool):
        """``(o [1, H, Sq, D], lse [1, H, Sq])`` of PyTorch's flash attention."""
        torch = _torch()
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        return res[0], res[1]

    def _bhsd(self, arr, rows: int):
        s = self.shape
        return self._t(arr, (1, rows, s.heads, s.head_dim)).transpose(1, 2)

    def host_sequence(self, ctx, inputs: Buffers, out):
        torch = _torch()
        s, rows, kvl = self.shape, self.shard, self.kv_len(ctx.rank)
        n = rows * self.row_elems
        kg = dtypes.empty(self.world_size * n, self.dtype)
        vg = dtypes.empty(self.world_size * n, self.dtype)
        q = self._bhsd(inputs["q"], rows)
        kt, vt = self._bhsd(kg, s.seq)[:, :, :kvl], self._bhsd(vg, s.seq)[:, :, :kvl]
        o_view = self._bhsd(out, rows)
        stream = torch.cuda.ExternalStream(ctx.stream.ptr)

        def run():
            for src, dst in ((inputs["k"], kg), (inputs["v"], vg)):
                ctx.comm.all_gather(int(src.data.ptr), int(dst.data.ptr), n, self.dtype,
                                    ctx.stream.ptr)
            with torch.cuda.stream(stream):
                o, _ = self.attention(q, kt, vt, s.causal)
                o_view.copy_(o)
        return run

    def compute_only(self, ctx, inputs: Buffers):
        torch = _torch()
        s, rows, kvl = self.shape, self.shard, self.kv_len(ctx.rank)
        kg = dtypes.random(s.seq * self.row_elems, self.dtype, 21 + ctx.rank)
        q = self._bhsd(inputs["q"], rows)
        kt = self._bhsd(kg, s.seq)[:, :, :kvl]
        stream = torch.cuda.ExternalStream(ctx.stream.ptr)

        def run():
            with torch.cuda.stream(stream):
                self.attention(q, kt, kt, s.causal)
        return run

    def comm_only(self, ctx, inputs: Buffers):
        n = self.shard * self.row_elems
        src = dtypes.random(n, self.dtype, 31 + ctx.rank)
        kg = dtypes.empty(self.world_size * n, self.dtype)

        def run():
            for _ in range(2):  # K and V
                ctx.comm.all_gather(int(src.data.ptr), int(kg.data.ptr), n, self.dtype,
                                    ctx.stream.ptr)
        return run

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        return CPRunner(ctx, self, d, binary, arena, inputs, out)


class CPRunner:
    """Comm kernel pushes K/V chunks; the compute stream attends to each as it arrives."""

    stress_us = 0.0

    def __init__(self, ctx, wl: CPAttention, d: Directives, cubin: str, arena, inputs: Buffers,
                 out):
        import cupy
        torch = _torch()
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.output = out
        self.layout = wl.layout()
        self.rows = wl.chunk_rows(d)
        self.n = wl.shard // self.rows
        self.per_call = d.comm_ctas  # arrival adds per chunk per call (one per CTA)
        f = {name: ctx.function(cubin, name) for name in
             ("comm_kernel", "init_acc", "merge_partial", "finish", "wait_flags", "set_peer_flag")}
        self.f = f
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        self.tstream = torch.cuda.ExternalStream(ctx.stream.ptr)
        s, shard = wl.shape, wl.shard
        self.q = wl._bhsd(inputs["q"], shard)
        self.k = wl._bhsd(inputs["k"], shard)
        self.v = wl._bhsd(inputs["v"], shard)
        n = shard * wl.row_elems
        kvg = arena_view(arena, self.layout.data["kvg"], wl.world_size * 2 * n, wl.dtype)
        self.blocks = {}
        for src in wl.sources(ctx.rank):
            kb = wl._bhsd(kvg[2 * src * n:(2 * src + 1) * n], shard)
            vb = wl._bhsd(kvg[(2 * src + 1) * n:(2 * src + 2) * n], shard)
            self.blocks[src] = [(kb[:, :, c * self.rows:(c + 1) * self.rows],
                                 vb[:, :, c * self.rows:(c + 1) * self.rows]) for c in range(self.n)]
        self.acc_o = cupy.empty(n, dtype=cupy.float32)
        self.acc_lse = cupy.empty(s.heads * shard, dtype=cupy.float32)
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        # every attention shape and kernel once, alone: no first launch beside a spinning kernel
        with torch.cuda.stream(self.tstream):
            o, lse = wl.attention(self.q, self.k, self.v, s.causal)
            self._fold(f["init_acc"], o, lse)
            if self.blocks:
                kb, vb = next(iter(self.blocks.values()))[0]
                o, lse = wl.attention(self.q, kb, vb, False)
                self._fold(f["merge_partial"], o, lse)
        spin(ctx.stream, 0.0)
        ctx.stream.synchronize()

    def _fold(self, fn, o, lse) -> None:
        rows = self.wl.shard
        fn((264,), (256,), (self.acc_o, self.acc_lse, np.uint64(o.data_ptr()),
                            np.uint64(lse.data_ptr()), np.int64(o.stride(1)), np.int64(o.stride(2)),
                            np.int64(lse.stride(1)), np.int32(rows)), stream=self.ctx.stream)

    def __call__(self) -> None:
        import cupy
        torch = _torch()
        ctx, a, wl, s, cs = self.ctx, self.arena, self.wl, self.ctx.stream, self.comm_stream
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
        cs.wait_event(self.start)
        self.f["comm_kernel"]((self.d.comm_ctas,), (THREADS,),
                              (*a.args(ctx), self.inputs["k"], self.inputs["v"],
                               np.uint64(self.layout.data["kvg"]), flags, e), stream=cs)
        with torch.cuda.stream(self.tstream):
            o, lse = wl.attention(self.q, self.k, self.v, wl.shape.causal)
            self._fold(self.f["init_acc"], o, lse)
            for src, chunks in self.blocks.items():
                for c, (kb, vb) in enumerate(chunks):
                    if self.stress_us:
                        spin(s, self.stress_us)
                    self.f["wait_flags"]((1,), (32,), (*a.args(ctx), flags,
                                                       np.int32(src * self.n + c), np.int32(1),
                                                       np.uint64(self.per_call)), stream=s)
                    o, lse = wl.attention(self.q, kb, vb, False)
                    self._fold(self.f["merge_partial"], o, lse)
        self.f["finish"]((264,), (256,), (self.acc_o, self.output, np.int32(wl.shard)), stream=s)
        self.done.record(cs)
        s.wait_event(self.done)
