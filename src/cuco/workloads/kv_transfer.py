"""KV-cache transfer from a prefill rank to a decode rank while later layers compute.

Ranks pair up: prefill rank ``r < w/2`` sends to decode rank ``r + w/2``. Per layer
``l`` the prefill rank computes the layer's K/V projection ``KV_l = X @ Wkv_l``
(``[T, kv_dim]``; ``kv_dim = 2 x kv_heads x head_dim``) and the rest of the layer,
stood in for by one ``[T, H] x [H, H]`` GEMM. The decode rank's output is its KV
cache ``[L, T, kv_dim]`` (the prefill rank's is the cache it computed).

* host-driven: compute every layer, then one NCCL send/recv of the whole cache;
* ``host_overlap`` (what one writes by hand): each layer's NCCL send on a second
  stream as soon as its K/V exist;
* fused (``side_stream``): each K/V chunk raises a flag; a persistent kernel on a
  second stream stores it into the decode rank's cache (LSA) or puts it (NVSHMEM)
  with an arrival counter there; the decode rank's call ends when every chunk arrived.

Time is measured to the last byte (max over ranks). ``hidden_fraction`` is the
share of the transfer time not added to the compute time:
``1 - max(0, t - t_compute) / t_comm``.
"""

from __future__ import annotations

import math

import numpy as np

from cuco.design import Directives, KVProblem
from cuco.design.problem import DTYPE_BYTES, ROW_ALIGN
from cuco.design.tiles import largest_divisor, sizes_cutting
from cuco.errors import DirectiveError
from cuco.kernels.collectives import KernelSource
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


def _randn(shape, dtype: str, seed: int, scale: float = 1.0):
    import cupy
    x = cupy.random.RandomState(seed).standard_normal(shape, dtype=cupy.float32)
    if scale != 1.0:
        x *= cupy.float32(scale)
    return dtypes.from_float32(x, dtype)


@register
class KVTransfer(PipelineWorkload):
    """``KVTransfer(world_size, layers=..., tokens=..., hidden=..., kv_dim=...)`` (fields of
    :class:`cuco.design.KVProblem`)."""

    family = "kv_transfer"
    problem_type = KVProblem
    problem: KVProblem

    # ---- description --------------------------------------------------------------------
    def small_problem(self) -> KVProblem:
        """2 layers of 256 tokens, hidden 512, kv_dim 256."""
        return self.problem.model_copy(update={"layers": 2, "tokens": 256, "hidden": 512,
                                               "kv_dim": 256})

    @property
    def esz(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def layer_bytes(self) -> int:
        return self.shape.tokens * self.shape.kv_dim * self.esz

    @property
    def cache_elems(self) -> int:
        s = self.shape
        return s.layers * s.tokens * s.kv_dim

    def is_prefill(self, rank: int) -> bool:
        return rank < self.world_size // 2

    def peer(self, rank: int) -> int:
        half = self.world_size // 2
        return rank + half if rank < half else rank - half

    def chunk_rows(self, d: Directives) -> int:
        row_bytes = self.shape.kv_dim * self.esz
        rows = largest_divisor(self.shape.tokens, max(1, min(d.chunk_bytes // row_bytes,
                                                              self.shape.tokens)))
        if rows is None:
            raise DirectiveError([f"chunk_bytes: no chunk of at most {d.chunk_bytes} bytes holds "
                                  f"{ROW_ALIGN} tokens of {row_bytes} bytes; choose chunk_bytes >= "
                                  f"{ROW_ALIGN * row_bytes}"])
        return rows

    def n_chunks(self, d: Directives) -> int:
        return self.shape.layers * (self.shape.tokens // self.chunk_rows(d))

    def signalers(self, d: Directives) -> int:
        """Arrival-counter increments each chunk gets per call (see the template)."""
        if d.backend.value == "lsa" or d.issuer.value == "cta":
            return d.comm_ctas
        if d.issuer.value == "warp":
            return d.comm_ctas * THREADS // 32
        return d.comm_ctas * THREADS

    def layout(self) -> ArenaLayout:
        return ArenaLayout.build({"kv": self.cache_elems * self.esz}, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """A prefill rank's layers (K/V projection and the stand-in layer GEMM), its cache
        through HBM once, and the cache its decode peer must receive."""
        s = self.shape
        flops = 2.0 * s.layers * s.tokens * s.hidden * (s.kv_dim + s.hidden)
        cache = self.cache_elems * self.esz
        return Work(flops, cache + s.layers * s.hidden * (s.kv_dim + s.hidden) * self.esz, cache)

    def plan(self, d: Directives) -> dict:
        """Chunks of whole token groups of one layer's K/V, a flag pair each."""
        rows = self.chunk_rows(d)
        n = self.n_chunks(d)
        flag_plan_check(2 * n + 1, f"{n} chunks")
        return {"n_chunks": n, "chunk_bytes": rows * self.shape.kv_dim * self.esz}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.layer_bytes, (1, 2, 4, 8))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        src = render("kv_transfer.cu.j2", backend=d.backend.value, issuer=d.issuer.value,
                     ctype=CTYPES[self.dtype], comm_ctas=d.comm_ctas,
                     threads=THREADS, open_slot=OPEN_SLOT, name=d.full_name, **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, ("comm_kernel", "set_own_flag", "set_peer_flag",
                                               "wait_flags"))

    def grid(self) -> list[Directives]:
        return self.grid_of(sizes_cutting(self.layer_bytes, (1, 4)),
                            [(b, i, c) for b, i in (("lsa", "warp"), ("lsa", "cta"),
                                                    ("nvshmem", "cta")) for c in (2, 8)])

    def tolerance(self) -> tuple[float, float]:
        """One GEMM output rounded once to the dtype (K = hidden, fp32 accumulation)."""
        eps = EPS[self.dtype]
        return 2 * eps, eps * (1 + math.sqrt(self.shape.hidden / 65536.0))

    # ---- GPU side -------------------------------------------------------------------------
    def _prefill_tensors(self, seed: int, pair: int) -> Buffers:
        s = self.shape
        base = 1000 * seed + 10 * pair
        return {"x": _randn((s.tokens, s.hidden), self.dtype, base),
                "wkv": _randn((s.layers, s.hidden, s.kv_dim), self.dtype, base + 1,
                              1 / math.sqrt(s.hidden)),
                "wh": _randn((s.hidden, s.hidden), self.dtype, base + 2, 1 / math.sqrt(s.hidden))}

    def make_inputs(self, ctx, seed: int) -> Buffers:
        if not self.is_prefill(ctx.rank):
            # the decode rank holds no inputs; it knows the prefill rank's seed to check arrivals
            import cupy
            return {"seed": cupy.asarray([seed], dtype=cupy.int64)}
        return self._prefill_tensors(seed, ctx.rank)

    def reference(self, ctx, inputs: Buffers):
        """The cache in fp32: bf16 products are exact in fp32, accumulated in fp32."""
        import cupy
        s = self.shape
        pair = min(ctx.rank, self.peer(ctx.rank))
        src = inputs if self.is_prefill(ctx.rank) else self._prefill_tensors(int(inputs["seed"][0]), pair)
        ref = cupy.empty((s.layers, s.tokens, s.kv_dim), dtype=cupy.float32)
        x, wkv = int(src["x"].data.ptr), int(src["wkv"].data.ptr)
        for layer in range(s.layers):
            gemm(x, wkv + layer * s.hidden * s.kv_dim * self.esz, int(ref[layer].data.ptr),
                 s.tokens, s.kv_dim, s.hidden, self.dtype, ctx.stream, out_dtype="fp32")
        return ref

    def output_elems(self) -> int:
        return self.cache_elems

    def _layers(self, ctx, inputs: Buffers, cache_ptr: int, h, stream, after_layer=None) -> None:
        """Every layer's K/V projection into ``cache_ptr``, then the rest of the layer."""
        s, esz = self.shape, self.esz
        x, wkv, wh = (int(inputs[k].data.ptr) for k in ("x", "wkv", "wh"))
        for layer in range(s.layers):
            gemm(x, wkv + layer * s.hidden * s.kv_dim * esz,
                 cache_ptr + layer * self.layer_bytes, s.tokens, s.kv_dim, s.hidden,
                 self.dtype, stream)
            if after_layer is not None:
                after_layer(layer)
            gemm(x, wh, int(h.data.ptr), s.tokens, s.hidden, s.hidden, self.dtype, stream)

    def _scratch_h(self, ctx):
        h = ctx.scratch.get(("kv_h", self.label))
        if h is None:
            h = ctx.scratch[("kv_h", self.label)] = dtypes.empty(
                self.shape.tokens * self.shape.hidden, self.dtype)
        return h

    def host_sequence(self, ctx, inputs: Buffers, out):
        n, peer, s = self.cache_elems, self.peer(ctx.rank), ctx.stream
        o = int(out.data.ptr)
        if self.is_prefill(ctx.rank):
            h = self._scratch_h(ctx)

            def run():
                self._layers(ctx, inputs, o, h, s)
                ctx.comm.send(o, n, self.dtype, peer, s.ptr)
            return run
        return lambda: ctx.comm.recv(o, n, self.dtype, peer, s.ptr)

    def baselines(self, ctx, inputs: Buffers):
        """The host program overlapped by hand: each layer's send on a second stream."""
        import cupy
        out = dtypes.empty(self.cache_elems, self.dtype)
        o, peer, s, lb = int(out.data.ptr), self.peer(ctx.rank), ctx.stream, self.layer_bytes
        per_layer = self.shape.tokens * self.shape.kv_dim
        side = ctx.scratch.setdefault("kv_side", cupy.cuda.Stream(non_blocking=True))
        if self.is_prefill(ctx.rank):
            h = self._scratch_h(ctx)

            def send_layer(layer: int) -> None:
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(s)
                side.wait_event(ev)
                ctx.comm.send(o + layer * lb, per_layer, self.dtype, peer, side.ptr)

            def run():
                self._layers(ctx, inputs, o, h, s, after_layer=send_layer)
                done = cupy.cuda.Event(disable_timing=True)
                done.record(side)
                s.wait_event(done)
        else:
            def run():
                for layer in range(self.shape.layers):
                    ctx.comm.recv(o + layer * lb, per_layer, self.dtype, peer, s.ptr)
        return {"host_overlap": (run, out)}

    def compute_only(self, ctx, inputs: Buffers):
        if not self.is_prefill(ctx.rank):
            return lambda: None
        scratch = dtypes.empty(self.cache_elems, self.dtype)
        h = self._scratch_h(ctx)
        return lambda: self._layers(ctx, inputs, int(scratch.data.ptr), h, ctx.stream)

    def comm_only(self, ctx, inputs: Buffers):
        buf = dtypes.random(self.cache_elems, self.dtype, 11 + ctx.rank)
        p, n, peer, s = int(buf.data.ptr), self.cache_elems, self.peer(ctx.rank), ctx.stream
        if self.is_prefill(ctx.rank):
            return lambda: ctx.comm.send(p, n, self.dtype, peer, s.ptr)
        return lambda: ctx.comm.recv(p, n, self.dtype, peer, s.ptr)

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        return KVRunner(ctx, self, d, binary, arena, inputs)


class KVRunner:
    """Prefill: chunked K/V GEMMs flag chunks, the comm kernel sends them; decode: opens
    its cache to the prefill rank, then waits until every chunk has arrived."""

    stress_us = 0.0

    def __init__(self, ctx, wl: KVTransfer, d: Directives, cubin: str, arena, inputs: Buffers):
        import cupy
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.layout = wl.layout()
        self.rows = wl.chunk_rows(d)
        self.n = wl.n_chunks(d)
        self.target_per_call = wl.signalers(d)
        self.output = arena_view(arena, self.layout.data["kv"], wl.cache_elems, wl.dtype)
        self.comm = ctx.function(cubin, "comm_kernel")
        self.set_own = ctx.function(cubin, "set_own_flag")
        self.set_peer = ctx.function(cubin, "set_peer_flag")
        self.wait = ctx.function(cubin, "wait_flags")
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.prefill = wl.is_prefill(ctx.rank)
        self.h = wl._scratch_h(ctx) if self.prefill else None
        if self.prefill:  # no first launch (cuBLAS heuristics, module loads) beside a spinning kernel
            s = wl.shape
            kv = arena.ptr + self.layout.data["kv"]
            x, wkv, wh = (int(inputs[k].data.ptr) for k in ("x", "wkv", "wh"))
            gemm(x, wkv, kv, self.rows, s.kv_dim, s.hidden, wl.dtype, ctx.stream)
            gemm(x, wh, int(self.h.data.ptr), s.tokens, s.hidden, s.hidden, wl.dtype, ctx.stream)
            spin(ctx.stream, 0.0)
            ctx.stream.synchronize()

    def __call__(self) -> None:
        import cupy
        ctx, a, wl, s = self.ctx, self.arena, self.wl, self.ctx.stream
        a.epoch += 1
        e = np.uint64(a.epoch)
        flags = np.uint64(self.layout.flags)
        peer = wl.peer(ctx.rank)
        if not self.prefill:
            # arrival counters restart at zero each call, before the cache is opened
            cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags + self.n * 8, 0, self.n * 8, s.ptr)
            self.set_peer((1,), (1,), (*a.args(ctx), flags, np.int32(OPEN_SLOT), np.int32(peer), e),
                          stream=s)
            self.wait((1,), (256,), (*a.args(ctx), flags, np.int32(self.n), np.int32(self.n),
                                     np.uint64(self.target_per_call)), stream=s)
            return
        sh, esz = wl.shape, wl.esz
        cs = self.comm_stream
        self.start.record(s)
        cs.wait_event(self.start)
        self.comm((self.d.comm_ctas,), (THREADS,),
                  (*a.args(ctx), np.uint64(self.layout.data["kv"]), flags, np.int32(peer), e),
                  stream=cs)
        kv = a.ptr + self.layout.data["kv"]
        x, wkv, wh = (int(self.inputs[k].data.ptr) for k in ("x", "wkv", "wh"))
        per_layer = sh.tokens // self.rows
        for layer in range(sh.layers):
            for c in range(per_layer):
                if self.stress_us:
                    spin(s, self.stress_us)
                row = c * self.rows
                gemm(x + row * sh.hidden * esz, wkv + layer * sh.hidden * sh.kv_dim * esz,
                     kv + layer * wl.layer_bytes + row * sh.kv_dim * esz, self.rows, sh.kv_dim,
                     sh.hidden, wl.dtype, s)
                self.set_own((1,), (1,), (*a.args(ctx), flags, np.int32(layer * per_layer + c), e),
                             stream=s)
            gemm(x, wh, int(self.h.data.ptr), sh.tokens, sh.hidden, sh.hidden, wl.dtype, s)
        self.done.record(cs)
        s.wait_event(self.done)
