"""KV-cache transfer from a prefill rank to a decode rank while later layers compute.

Ranks pair up: prefill rank ``r < w/2`` sends to decode rank ``r + w/2``. The prefill rank
runs ``layers`` transformer layers (:mod:`cuco.workloads.kv.prefill`: QKV projection, causal
GQA attention, output projection, SwiGLU MLP); layer ``l``'s K/V (``[T, kv_dim]``) is its
cache, which the decode rank must receive (``[L, T, kv_dim]``: the decode rank's output; the
prefill rank's is the cache it computed).

* host-driven: compute every layer, then one NCCL send/recv of the whole cache;
* ``host_overlap`` (what one writes by hand): each layer's NCCL send on a second stream
  as soon as its K/V exist;
* fused (``side_stream``), three ways to move a layer's chunks (:meth:`KVTransfer.mode`):
  ``persistent`` (``sync_scope=chunk``): a kernel on a second stream polls each chunk's flag
  and stores it into the decode rank's cache (LSA) or puts it (NVSHMEM), counting arrivals
  there; ``launch`` (``sync_scope=stream``): one short kernel per chunk behind the layer's
  event; ``copy_engine``: a peer ``cudaMemcpyAsync`` per chunk behind the layer's event,
  then a stream-ordered write of the chunk's flag (the call's epoch) on the decode rank.
  The stream-ordered two wait for the decode rank's "open" flag with a stream memory
  operation, not a kernel. The decode rank's call ends when every chunk arrived.

Checked: the prefill rank's cache against the fp32 twin of the layer chain (tolerance
below); the decode rank's against the same bf16 chain run on the decode GPU from the same
seed (a copy: no error; the GPU tests also compare the two ranks' caches bit for bit).

Time is measured to the last byte (max over ranks). ``hidden_fraction`` is the
share of the transfer time not added to the compute time:
``1 - max(0, t - t_compute) / t_comm``.
"""

from __future__ import annotations

import numpy as np

from cuco.design import Directives, Issuer, KVProblem, SyncScope
from cuco.design.pipeline_ops import KV_TRANSFER
from cuco.design.problem import DTYPE_BYTES, ROW_ALIGN
from cuco.design.tiles import largest_divisor, sizes_cutting
from cuco.errors import DirectiveError
from cuco.kernels.collectives import KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes, stream_ops
from cuco.runtime.arena import ArenaLayout, arena_view, own_layout
from cuco.runtime.peaks import Work
from cuco.runtime.timing import spin
from cuco.workloads.base import EPS, Buffers, Runner, in_order, register
from cuco.workloads.kv.prefill import (
    LayerKernels, PrefillChain, layer_flops, layer_pointers, make_prompt_and_weights,
    reference_cache, weight_shapes,
)
from cuco.workloads.pipeline import (
    MAX_FLAGS, OPEN_SLOT, THREADS, PipelineWorkload, flag_plan_check,
)

#: How a fused variant moves its chunks (see the module doc).
MODES = ("persistent", "launch", "copy_engine")


@register
class KVTransfer(PipelineWorkload):
    """``KVTransfer(world_size, layers=..., tokens=..., hidden=..., kv_dim=..., heads=...,
    head_dim=..., ffn=...)`` (fields of :class:`cuco.design.KVProblem`)."""

    op = KV_TRANSFER
    hides_transfer = True
    problem: KVProblem
    #: the layer-by-layer send overlapped by hand beats the send-it-all-at-the-end program
    #: (62.00 against 62.69 ms in bench/results/kv_transfer.json at 8f4b630; 33.41 against
    #: 34.96 ms in kv_transfer_h200x2_2a4382a.json): the faster is the baseline
    host_programs = ("host_nccl", "host_overlap")
    #: 1: one persistent CTA, one CTA a chunk, or the copy engine (which takes comm_ctas=1).
    comm_cta_choices = (1, 4, 8, 16, 32)

    # ---- description --------------------------------------------------------------------
    def small_problem(self) -> KVProblem:
        """2 layers of 256 tokens, hidden 512, 4 heads of 64 sharing 2 K/V heads, FFN 1024."""
        return self.problem.model_copy(update={"layers": 2, "tokens": 256, "hidden": 512,
                                               "kv_dim": 256, "heads": 4, "head_dim": 64,
                                               "ffn": 1024})

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

    @staticmethod
    def mode(d: Directives) -> str:
        """``copy_engine`` (issuer), ``launch`` (a kernel per chunk: sync_scope=stream) or
        ``persistent`` (one polling kernel: sync_scope=chunk)."""
        if d.issuer is Issuer.COPY_ENGINE:
            return "copy_engine"
        return "launch" if d.sync_scope is SyncScope.STREAM else "persistent"

    def chunk_rows(self, d: Directives) -> int:
        row_bytes = self.shape.kv_dim * self.esz
        rows = largest_divisor(self.shape.tokens, max(1, min(d.chunk_bytes // row_bytes,
                                                              self.shape.tokens)))
        if rows is None:
            raise DirectiveError([f"chunk_bytes: no chunk of at most {d.chunk_bytes} bytes holds "
                                  f"{ROW_ALIGN} tokens of {row_bytes} bytes; choose chunk_bytes >= "
                                  f"{ROW_ALIGN * row_bytes}"])
        return rows

    def chunks_per_layer(self, d: Directives) -> int:
        return self.shape.tokens // self.chunk_rows(d)

    def n_chunks(self, d: Directives) -> int:
        return self.shape.layers * self.chunks_per_layer(d)

    def signalers(self, d: Directives) -> int:
        """Arrival-counter increments each chunk gets per call from a kernel issuer (see the
        template); the copy engine writes the call's epoch instead (:meth:`arrival_target`)."""
        if d.backend.value == "lsa" or d.issuer.value == "cta":
            return d.comm_ctas
        if d.issuer.value == "warp":
            return d.comm_ctas * THREADS // 32
        return d.comm_ctas * THREADS

    def arrival_target(self, d: Directives, epoch: int) -> int:
        """What every chunk's arrival slot on the decode rank reaches in the call of ``epoch``."""
        return epoch if self.mode(d) == "copy_engine" else self.signalers(d)

    def layout(self) -> ArenaLayout:
        return ArenaLayout.build({"kv": self.cache_elems * self.esz}, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """A prefill rank's layers (their GEMMs and causal attention), its weights and cache
        through HBM once, and the cache its decode peer must receive."""
        s = self.shape
        cache = self.cache_elems * self.esz
        weights = s.layers * sum(i * o for i, o in weight_shapes(s).values()) * self.esz
        return Work(s.layers * layer_flops(s), cache + weights, cache)

    def plan(self, d: Directives) -> dict:
        """Chunks of whole token groups of one layer's K/V, a flag pair each."""
        rows = self.chunk_rows(d)
        n = self.n_chunks(d)
        flags = flag_plan_check(2 * n + 1, f"{n} chunks")
        return {"n_chunks": n, "flag_slots": flags, "chunk_bytes": rows * self.shape.kv_dim * self.esz,
                "chunks_per_layer": self.chunks_per_layer(d)}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.layer_bytes, (1, 2, 4, 8))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        mode = self.mode(d)
        texts = {"persistent": f"sync_scope=chunk, issuer={d.issuer.value}: a persistent kernel",
                 "launch": f"sync_scope=stream, issuer={d.issuer.value}: a kernel per chunk",
                 "copy_engine": "sync_scope=stream, issuer=copy_engine"}
        src = render(self.op.template, backend=d.backend.value, mode=mode,
                     mode_text=texts[mode],
                     issuer="cta" if mode == "copy_engine" else d.issuer.value,
                     ctype=CTYPES[self.dtype], comm_ctas=d.comm_ctas,
                     threads=THREADS, open_slot=OPEN_SLOT, name=d.full_name, **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, self.functions(d))

    def functions(self, d: Directives) -> tuple[str, ...]:
        """The kernels of ``d``'s binary that its runner launches."""
        own = {"persistent": ("comm_kernel", "set_own_flag"), "launch": ("chunk_kernel",),
               "copy_engine": ()}[self.mode(d)]
        return (*own, "set_peer_flag", "wait_flags", "arena_base")

    def grid(self) -> list[Directives]:
        """The benchmark's points: the persistent kernel (as before), a kernel per chunk and
        the copy engine, each at a whole layer per chunk and a quarter of one."""
        out = []
        for chunk in sizes_cutting(self.layer_bytes, (1, 4)):
            points = [("lsa", "chunk", "warp", 8), ("lsa", "chunk", "cta", 8),
                      ("nvshmem", "chunk", "cta", 8),
                      ("lsa", "stream", "cta", 8), ("lsa", "stream", "cta", 32),
                      ("nvshmem", "stream", "cta", 8),
                      ("lsa", "stream", "copy_engine", 1), ("nvshmem", "stream", "copy_engine", 1)]
            for backend, sync, issuer, ctas in points:
                d = Directives(backend=backend, placement="side_stream", sync_scope=sync,
                               issuer=issuer, chunk_bytes=chunk, comm_ctas=ctas)
                if not self.supported(d):
                    out.append(d)
        return out

    def tolerance(self) -> tuple[float, float]:
        """The cache of layer ``l`` carries the rounding of every layer before it: a bf16
        emulation of the chain (tests/test_kv_cpu.py) stays within ``eps (0.5 + 0.25 l)`` of
        max|ref| past ``2 eps |ref|``; this allows about twice that."""
        eps = EPS[self.dtype]
        return 2 * eps, eps * (2 + self.shape.layers / 2)

    # ---- GPU side -------------------------------------------------------------------------
    def _seed(self, seed: int, pair: int) -> int:
        return 1000 * seed + 10 * pair

    def make_inputs(self, ctx, seed: int) -> Buffers:
        if not self.is_prefill(ctx.rank):
            # the decode rank holds no inputs; it knows the prefill rank's seed to check arrivals
            import cupy
            return {"seed": cupy.asarray([seed], dtype=cupy.int64)}
        return make_prompt_and_weights(self.shape, self.dtype, self._seed(seed, ctx.rank))

    def kernels(self, ctx) -> LayerKernels:
        return LayerKernels(ctx, self.dtype)

    def chain(self, ctx) -> PrefillChain:
        """The layer chain in the workload dtype, its scratch shared by every program of this
        worker (they run one after the other on the job's stream)."""
        key = ("kv_chain", self.label)
        chain = ctx.scratch.get(key)
        if chain is None:
            chain = ctx.scratch[key] = PrefillChain(self.shape, self.dtype, self.kernels(ctx))
        return chain

    def compute(self, ctx, inputs: Buffers, cache_ptr: int, stream, **hooks) -> None:
        """Every layer of ``inputs`` on ``stream``, the K/V into ``cache_ptr``."""
        self.chain(ctx).run(layer_pointers(inputs, self.shape, self.dtype),
                            int(inputs["x"].data.ptr), cache_ptr, stream, **hooks)

    def reference(self, ctx, inputs: Buffers):
        """Prefill: the fp32 layer chain's cache. Decode: the prefill rank's bf16 chain run
        here from its seed (the decode rank receives a copy of it)."""
        s = self.shape
        if self.is_prefill(ctx.rank):
            return reference_cache(ctx, inputs, s, self.dtype, self.kernels(ctx))
        pair = self.peer(ctx.rank)
        src = make_prompt_and_weights(s, self.dtype, self._seed(int(inputs["seed"][0]), pair))
        cache = dtypes.empty(self.cache_elems, self.dtype)
        with ctx.stream:
            self.compute(ctx, src, int(cache.data.ptr), ctx.stream)
            ref = dtypes.to_float32(cache, self.dtype).reshape(s.layers, s.tokens, s.kv_dim)
        ctx.stream.synchronize()
        return ref

    def output_elems(self) -> int:
        return self.cache_elems

    def host_scratch(self, ctx) -> tuple:
        """What a host program's call leaves part of the answer in besides its output: the
        prefill rank's layer chain (:attr:`PrefillChain.scratch`, shared with every program
        of the worker, each of which rewrites it); the decode rank's only buffer is its output."""
        return self.chain(ctx).scratch if self.is_prefill(ctx.rank) else ()

    def host_sequence(self, ctx, inputs: Buffers, out):
        n, peer, s = self.cache_elems, self.peer(ctx.rank), ctx.stream
        o = int(out.data.ptr)
        if self.is_prefill(ctx.rank):
            return in_order(lambda: self.compute(ctx, inputs, o, s),
                            lambda: ctx.comm.send(o, n, self.dtype, peer, s.ptr),
                            output=out, scratch=self.host_scratch(ctx))
        return in_order(lambda: ctx.comm.recv(o, n, self.dtype, peer, s.ptr), output=out)

    def baselines(self, ctx, inputs: Buffers):
        """The host program overlapped by hand: each layer's send on a second stream."""
        import cupy
        out = dtypes.empty(self.cache_elems, self.dtype)
        o, peer, s, lb = int(out.data.ptr), self.peer(ctx.rank), ctx.stream, self.layer_bytes
        per_layer = self.shape.tokens * self.shape.kv_dim
        side = ctx.scratch.setdefault("kv_side", cupy.cuda.Stream(non_blocking=True))
        if self.is_prefill(ctx.rank):
            def send_layer(layer: int) -> None:
                ev = cupy.cuda.Event(disable_timing=True)
                ev.record(s)
                side.wait_event(ev)
                ctx.comm.send(o + layer * lb, per_layer, self.dtype, peer, side.ptr)

            def run():
                self.compute(ctx, inputs, o, s, after_kv=send_layer)
                done = cupy.cuda.Event(disable_timing=True)
                done.record(side)
                s.wait_event(done)
        else:
            def run():
                for layer in range(self.shape.layers):
                    ctx.comm.recv(o + layer * lb, per_layer, self.dtype, peer, s.ptr)
        run.scratch = self.host_scratch(ctx)  # type: ignore[attr-defined]
        return {"host_overlap": (run, out)}

    def compute_only(self, ctx, inputs: Buffers):
        """The layers of a random prompt with the set's weights: the input set's own prompt
        would leave its whole cache (the prefill rank's answer) in memory for the job."""
        if not self.is_prefill(ctx.rank):
            return lambda: None
        s = self.shape
        prompt = {**inputs, "x": dtypes.random(s.tokens * s.hidden, self.dtype, 13 + ctx.rank)}
        scratch = dtypes.empty(self.cache_elems, self.dtype)
        return lambda: self.compute(ctx, prompt, int(scratch.data.ptr), ctx.stream)

    def comm_only(self, ctx, inputs: Buffers):
        buf = dtypes.random(self.cache_elems, self.dtype, 11 + ctx.rank)
        p, n, peer, s = int(buf.data.ptr), self.cache_elems, self.peer(ctx.rank), ctx.stream
        prefill = self.is_prefill(ctx.rank)

        def run() -> None:  # holds ``buf``: the decode rank's receive must not land in a freed block
            if prefill:
                ctx.comm.send(p, n, self.dtype, peer, s.ptr)
            else:
                ctx.comm.recv(p, n, self.dtype, peer, s.ptr)
        run.keepalive = buf  # type: ignore[attr-defined]
        return run

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        return KVRunner(ctx, self, d, binary, arena, inputs)


class KVRunner:
    """Prefill: the layer chain on the compute stream hands each layer's chunks to the
    transfer (:meth:`KVTransfer.mode`); decode: opens its cache to the prefill rank, then
    waits until every chunk has arrived."""

    stress_us = 0.0

    def live_slots(self):
        """The slots of its sync region this variant's kernels write (the evaluator holds
        the rest at zero between calls: :class:`cuco.runtime.arena.LiveSlots`)."""
        return self.wl.live_slots(self.layout, self.d)

    def __init__(self, ctx, wl: KVTransfer, d: Directives, cubin: str, arena, inputs: Buffers):
        import cupy
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        self.mode = wl.mode(d)
        self.layout = own_layout(arena, wl.layout())
        self.n = wl.n_chunks(d)
        self.per_layer = wl.chunks_per_layer(d)
        self.chunk_bytes = wl.plan(d)["chunk_bytes"]
        self.kv_off = self.layout.data["kv"]
        self.output = arena_view(arena, self.kv_off, wl.cache_elems, wl.dtype)
        self.f = {name: ctx.function(cubin, name) for name in wl.functions(d)}
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.layer_done = [cupy.cuda.Event(disable_timing=True) for _ in range(wl.shape.layers)]
        self.prefill = wl.is_prefill(ctx.rank)
        # The LSA arena's arguments hold the device communicator, made on first use by
        # ncclDevCommCreate, a collective call: every rank makes it here, at the same point
        # of the job. Made by the prefill rank alone (below, for arena_base), it waited for
        # a decode rank that had gone on to the job's next collective: a hang.
        self.args = arena.args(ctx)
        if not self.prefill:
            return
        peer = wl.peer(ctx.rank)
        base = cupy.zeros(1, dtype=cupy.uint64)  # where the decode rank's arena is mapped here
        self.f["arena_base"]((1,), (1,), (*self.args, np.int32(peer), base), stream=ctx.stream)
        self.peer_base = int(base.get(stream=ctx.stream)[0])
        # every layer once, alone: no first launch (cuBLAS heuristics, module loads) beside a
        # spinning kernel or during a call
        wl.compute(ctx, inputs, arena.ptr + self.kv_off, ctx.stream)
        spin(ctx.stream, 0.0)
        ctx.stream.synchronize()

    def _flag(self, base: int, slot: int) -> int:
        return base + self.layout.flags + slot * 8

    def _send_chunk(self, c: int, epoch: int) -> None:
        """Chunk ``c`` to the decode rank, on the side stream (stream-ordered modes)."""
        import cupy
        a, cs = self.arena, self.comm_stream
        if self.mode == "copy_engine":
            off = self.kv_off + c * self.chunk_bytes
            cupy.cuda.runtime.memcpyAsync(self.peer_base + off, a.ptr + off, self.chunk_bytes,
                                          cupy.cuda.runtime.memcpyDefault, cs.ptr)
            stream_ops.write_value(cs.ptr, self._flag(self.peer_base, self.n + c), epoch)
        else:
            self.f["chunk_kernel"]((self.d.comm_ctas,), (THREADS,),
                                   (*self.args, np.uint64(self.kv_off),
                                    np.uint64(self.layout.flags), np.int32(self.wl.peer(self.ctx.rank)),
                                    np.int32(c)), stream=cs)

    def __call__(self) -> None:
        import cupy
        ctx, a, wl, s = self.ctx, self.arena, self.wl, self.ctx.stream
        a.epoch += 1
        e = np.uint64(a.epoch)
        flags = np.uint64(self.layout.flags)
        peer = wl.peer(ctx.rank)
        if not self.prefill:
            # arrival counters restart at zero each call, before the cache is opened
            cupy.cuda.runtime.memsetAsync(self._flag(a.ptr, self.n), 0, self.n * 8, s.ptr)
            self.f["set_peer_flag"]((1,), (1,), (*self.args, flags, np.int32(OPEN_SLOT),
                                                np.int32(peer), e), stream=s)
            self.f["wait_flags"]((1,), (256,), (*self.args, flags, np.int32(self.n),
                                               np.int32(self.n),
                                               np.uint64(wl.arrival_target(self.d, a.epoch))),
                                 stream=s)
            return
        cs = self.comm_stream
        self.start.record(s)
        cs.wait_event(self.start)
        if self.mode == "persistent":
            self.f["comm_kernel"]((self.d.comm_ctas,), (THREADS,),
                                  (*self.args, np.uint64(self.kv_off), flags, np.int32(peer), e),
                                  stream=cs)
        else:  # nothing is written to the decode rank before it opened its cache
            stream_ops.wait_value(cs.ptr, self._flag(a.ptr, OPEN_SLOT), a.epoch)

        def before_kv(layer: int) -> None:
            if self.stress_us:  # checked calls: the layer's K/V come late
                spin(s, self.stress_us)

        def after_kv(layer: int) -> None:
            chunks = range(layer * self.per_layer, (layer + 1) * self.per_layer)
            if self.mode == "persistent":
                for c in chunks:
                    self.f["set_own_flag"]((1,), (1,), (*self.args, flags, np.int32(c), e),
                                           stream=s)
                return
            ev = self.layer_done[layer]
            ev.record(s)
            cs.wait_event(ev)
            for c in chunks:
                self._send_chunk(c, a.epoch)

        wl.compute(ctx, self.inputs, a.ptr + self.kv_off, s, before_kv=before_kv, after_kv=after_kv)
        self.done.record(cs)
        s.wait_event(self.done)
