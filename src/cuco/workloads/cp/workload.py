"""Context-parallel attention: each rank's queries against every rank's keys and values,
over a load-balanced (zig-zag) split of the sequence.

The sequence is cut into ``2W`` chunks of ``C = S / 2W`` tokens; rank ``r`` holds chunks ``r``
and ``2W-1-r`` (its halves 0 and 1) of Q, K and V, laid out ``[2C, H, D]`` (bf16). Under a
causal mask every rank then does the same work. Its output is attention of its queries over
every key they may see (all of them; causal: every key at or before the query's position).

* host-driven (``host_nccl``): NCCL all-gather of K and V, then cuco's attention kernel
  (``cp_attention_core.cu.j2``) over the gathered slots in one pass;
  ``host_torch_flash``: the same all-gather, K/V put in sequence order, PyTorch's flash
  attention (one call per half);
* fused (``side_stream``): a persistent kernel pushes the halves of this rank's K/V that each
  peer needs, chunk by chunk, counting arrivals; the same attention kernel attends every q
  tile to the local slot first (state parked), then to each peer's chunks as they arrive,
  keeping the online softmax in registers and writing the output once.

The tile walk (which K/V tiles a q tile needs, which are skipped) is defined here and in
``cuco/ops/cp_attention.cuh`` alike; the CPU tests hold the two to a brute-force mask.
The reference is computed per head with bf16 products exact in fp32 (cuBLAS, fp32
accumulation), softmax in fp32 and the probabilities split into two bf16 terms for the
product with V (about 16 significant bits).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuco.design import CPProblem, Directives
from cuco.design.cores import peer_calls_violations
from cuco.design.pipeline_ops import CP_ATTENTION
from cuco.design.problem import CP_Q_TILE, DTYPE_BYTES
from cuco.runtime.emulated import persistent_sms
from cuco.design.tiles import sizes_cutting
from cuco.errors import DirectiveError, EnvironmentProblem, install_extra
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes, torch_bridge
from cuco.runtime.arena import ArenaLayout
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.workloads.base import EPS, Buffers, Runner, register
from cuco.workloads.cp.fused_call import FusedCall
from cuco.workloads.cp.library import LibraryRunner, fastest, library_compute, library_plan, single_call
from cuco.workloads.cp.peer_groups import default_peer_calls
from cuco.workloads.cp.receive_layout import grouped_receive
from cuco.workloads.cp.split import (  # noqa: F401 - the split's names, also read from here
    DIAGONAL, FULL, SKIP, needs_half, pair_kind, slot_order, token_positions, zigzag_chunk,
)
from cuco.workloads.pipeline import MAX_FLAGS, OPEN_SLOT, THREADS, PipelineWorkload, flag_plan_check

#: Query rows per work item and keys per K/V tile of the attention kernel
#: (``cuco/ops/cp_attention.cuh``: kBr, kBc).
Q_TILE, KV_TILE = CP_Q_TILE, 64
#: Threads per CTA of the attention kernel (kWarps x 32).
ATTN_THREADS = 256


@dataclass(frozen=True)
class KVTile:
    slot: int      # whose K/V
    token: int     # first key, relative to that rank's shard
    masked: bool   # a diagonal tile with keys after some of the tile's queries


def kv_tiles(me: int, w: int, chunk: int, row0: int, causal: bool, phase: str = "all") -> list[KVTile]:
    """The K/V tiles the q tile at shard row ``row0`` of rank ``me`` attends to, in the kernel's
    order; chunks the mask empties are not listed (never computed, never waited for)."""
    half = row0 // chunk
    qi, q0c = zigzag_chunk(me, half, w), row0 - half * chunk
    out = []
    for slot in slot_order(me, w, phase):
        for kh in (0, 1):
            kind = pair_kind(qi, zigzag_chunk(slot, kh, w), causal)
            n = chunk // KV_TILE if kind == FULL else (q0c + Q_TILE) // KV_TILE if kind == DIAGONAL else 0
            out += [KVTile(slot, kh * chunk + t * KV_TILE, kind == DIAGONAL and t * KV_TILE + KV_TILE - 1 > q0c)
                    for t in range(n)]
    return out


def kernel_constants() -> dict[str, int]:
    """The tile constants ``cuco/ops/cp_attention.cuh`` is written for (kBr, kBc, kWarps)."""
    text = (Path(__file__).parents[2] / "kernels" / "include" / "cuco" / "ops" / "cp_attention.cuh").read_text()
    m = re.search(r"kBr = (\d+), kBc = (\d+), kWarps = (\d+)", text)
    return {"kBr": int(m[1]), "kBc": int(m[2]), "kWarps": int(m[3])}


def attention_grid(sms: int, per_sm: int, items: int, reserve_sms: int = 0) -> int:
    """CTAs of the persistent attention kernel: every resident slot less ``reserve_sms`` whole
    SMs left to a communication kernel that cannot share an SM with it (CTAs that spin on a
    flag must never keep the kernel that raises it from starting), at most one per item."""
    return max(1, min(items, (sms - reserve_sms) * per_sm))


def parked_floats(wl_heads: int, head_dim: int, shard: int) -> int:
    """fp32 values of the state parked between a fused call's two phases, for every item."""
    items = (shard // Q_TILE) * wl_heads
    return items * (head_dim // 8 + 1) * ATTN_THREADS * 4


@functools.lru_cache(maxsize=1)
def cudnn_attention_gap() -> str | None:
    """Why PyTorch's cuDNN attention cannot be a host program here (None: it can): torch
    without the op, or cuDNN's attention refusing a small call on this GPU."""
    torch = _torch()
    if not hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention"):
        return f"torch {torch.__version__} has no cuDNN attention op"
    try:
        x = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
        torch.ops.aten._scaled_dot_product_cudnn_attention(x, x, x, None, True, 0.0, True, False)
    except (RuntimeError, AssertionError) as exc:  # no CUDA or cuDNN, or no such attention here
        return f"cuDNN attention refused a small call: {str(exc).splitlines()[0]}"
    return None


def _torch():
    try:
        return torch_bridge.on_current_device()
    except ImportError:
        raise EnvironmentProblem("cp_attention's host_torch_flash baseline runs PyTorch's flash "
                                 f"attention: install torch there ({install_extra('torch')})") from None


class AttentionKernel:
    """``cp_attend`` of a cubin: its shared memory opted in, its persistent grid sized."""

    def __init__(self, function, head_dim: int, dtype: str):
        import cupy
        drv = cupy.cuda.driver
        self.f = function
        self.smem = (Q_TILE + 4 * KV_TILE) * head_dim * DTYPE_BYTES[dtype]
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 in every CUDA release
        drv.funcSetAttribute(function.ptr, getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8),
                             self.smem)
        occupancy = getattr(drv, "occupancyMaxActiveBlocksPerMultiprocessor", None)
        self.per_sm = max(1, occupancy(function.ptr, ATTN_THREADS, self.smem)) if occupancy else 1
        self.sms = persistent_sms()

    def __call__(self, stream, items: int, q, out, slots, *, me: int, world: int, chunk: int,
                 flags: int = 0, need: int = 0, chunk_rows: int = KV_TILE, n_chunks: int = 1,
                 scratch=None, reserve_sms: int = 0) -> None:
        grid = attention_grid(self.sms, self.per_sm, items, reserve_sms)
        ptr = (lambda x: np.uint64(x if isinstance(x, int) else x.data.ptr))
        self.f((grid,), (ATTN_THREADS,),
               (ptr(q), ptr(out), ptr(slots), np.uint64(flags), np.uint64(need), np.int32(chunk_rows),
                np.int32(n_chunks), np.uint64(0 if scratch is None else scratch.data.ptr),
                np.int32(me), np.int32(world), np.int32(chunk), np.int32(scratch is not None)),
               stream=stream, shared_mem=self.smem)


@register
class CPAttention(PipelineWorkload):
    """``CPAttention(world_size, seq=..., heads=..., head_dim=..., causal=...)`` (fields of
    :class:`cuco.design.CPProblem`)."""

    op = CP_ATTENTION
    hides_transfer = True
    problem: CPProblem
    #: PyTorch's attention after the same all-gather (where torch runs) is what a user would
    #: pick, flash or cuDNN's, whichever is faster there (on H100, cuDNN's ran about twice as
    #: fast as flash, on H200 too: bench/results/cp_attention_kernel.json): the fastest correct one is the bar
    host_programs = ("host_nccl", "host_torch_flash", "host_torch_cudnn")

    def small_problem(self) -> CPProblem:
        """Two q tiles per chunk (512 tokens per rank), 4 heads of the same head dim, the same mask."""
        return self.problem.model_copy(update={"seq": 2 * Q_TILE * 2 * self.world_size, "heads": 4})

    @property
    def chunk(self) -> int:
        """Tokens per zig-zag chunk (a rank holds two)."""
        return self.shape.seq // (2 * self.world_size)

    @property
    def shard(self) -> int:
        return 2 * self.chunk

    @property
    def row_elems(self) -> int:
        return self.shape.heads * self.shape.head_dim

    @property
    def esz(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def items(self) -> int:
        """Work items of the attention kernel: q tiles x heads."""
        return self.shard // Q_TILE * self.shape.heads

    def sources(self, rank: int) -> list[int]:
        """Ranks whose keys ``rank`` attends to besides its own, in the order it uses them."""
        return [p for p in slot_order(rank, self.world_size, "remote")
                if any(needs_half(p, h, rank, self.world_size, self.shape.causal) for h in (0, 1))]

    def chunk_rows(self, d: Directives) -> int:
        """Tokens per transfer chunk: whole K/V tiles dividing a zig-zag chunk, at most
        ``chunk_bytes`` of K (a flag guards each)."""
        row_bytes = self.row_elems * self.esz
        cap = d.chunk_bytes // row_bytes
        fits = [r for r in range(KV_TILE, self.chunk + 1, KV_TILE) if self.chunk % r == 0 and r <= cap]
        if not fits:
            raise DirectiveError([f"chunk_bytes: a transfer chunk of {d.chunk_bytes} bytes holds fewer "
                                  f"than one K/V tile ({KV_TILE} tokens of {row_bytes} bytes); choose "
                                  f"chunk_bytes >= {KV_TILE * row_bytes}"])
        return max(fits)

    def layout(self) -> ArenaLayout:
        gathered = self.world_size * 2 * self.shard * self.row_elems * self.esz
        return ArenaLayout.build({"kvg": gathered}, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """One rank (all do the same under the zig-zag split): its queries against the keys
        they see (QK^T and PV), Q/K/V/O through HBM once, the K/V halves it receives."""
        s, w, shard = self.shape, self.world_size, self.shard
        keys = (s.seq + 1) / 2 if s.causal else s.seq  # mean keys a query sees
        halves = sum(needs_half(p, h, 0, w, s.causal) for p in range(1, w) for h in (0, 1))
        half_bytes = self.chunk * self.row_elems * self.esz
        return Work(4.0 * shard * keys * self.row_elems, 8 * half_bytes, 2 * halves * half_bytes)

    def plan(self, d: Directives) -> dict:
        """Transfer chunks of whole K/V tiles, a flag per chunk and source rank."""
        rows = self.chunk_rows(d)
        n = self.shard // rows
        flags = flag_plan_check(MAX_RANKS * n + MAX_RANKS, f"{n} chunks per rank")
        return {"n_chunks": n, "chunk_rows": rows, "flag_slots": flags}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.chunk * self.row_elems * self.esz, (1, 2, 4, 8))

    def core_source(self) -> str:
        """The attention kernel alone (what the host programs run after their all-gather)."""
        s = self.shape
        return render("cp_attention_core.cu.j2", ctype=CTYPES[self.dtype], head_dim=s.head_dim,
                      heads=s.heads, causal=s.causal)

    def merge_source(self) -> str:
        """The library cores' merge alone (``cp_merge``: what a fused call of ``core=flash`` /
        ``core=cudnn`` runs after its phases; the kernel benchmark builds it alone)."""
        s = self.shape
        return render("cp_merge.cu.j2", ctype=CTYPES[self.dtype], head_dim=s.head_dim, heads=s.heads)

    def merge_kernel_source(self) -> KernelSource:
        """:meth:`merge_source` as the kernel catalog lists it (what CI compiles)."""
        return KernelSource("cp_merge", self.merge_source(), (), ("cp_merge",))

    def core_kernel_source(self) -> KernelSource:
        """:meth:`core_source` as the kernel catalog lists it (what CI compiles)."""
        return KernelSource("cp_attention_core", self.core_source(), (), ("cp_attend",))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        s = self.shape
        src = render(self.op.template, backend=d.backend.value, issuer=d.issuer.value,
                     ctype=CTYPES[self.dtype], row_bytes=self.row_elems * self.esz,
                     heads=s.heads, head_dim=s.head_dim, causal=s.causal, comm_ctas=d.comm_ctas,
                     threads=THREADS, max_ranks=MAX_RANKS, open_slot=OPEN_SLOT,
                     name=d.full_name, core=d.core.value, library=d.core.library,
                     grouped=grouped_receive(d.peer_calls),
                     peer_calls=d.peer_calls.value, one_call=self.one_call(d), **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        kernels = ("comm_kernel", "set_peer_flag") + (("wait_flags", "cp_merge") if d.core.library
                                                     else ("cp_attend",))
        return KernelSource(self.kernel_name(d), src, needs, kernels)

    def one_call(self, d: Directives) -> bool:
        """Is a library core's plan one call of every query over every key (``all_keys``)?"""
        return d.core.library and single_call(*library_plan(0, self.world_size, self.shape.causal, d.peer_calls))

    def grid(self) -> list[Directives]:
        half_bytes = self.chunk * self.row_elems * self.esz
        own = self.grid_of(sizes_cutting(half_bytes, (1, 4, 16)),
                           [("lsa", "warp", 4), ("lsa", "cta", 8), ("lsa", "warp", 16),
                            ("nvshmem", "cta", 8)])
        # the library cores (where torch is there to run them) wait for a peer's whole halves,
        # so the chunk size matters less
        cores = [c.value for c in self.op.library_cores] if torch_bridge.installed() else []
        return own + self.grid_of(sizes_cutting(half_bytes, (1, 4)), [("lsa", "warp", 4), ("nvshmem", "cta", 8)],
                                  cores=cores, peer_calls=[v.value for v in self.op.peer_calls])

    def preferred(self) -> dict:
        """How a library core calls over the peers' K/V at this shape by default
        (:func:`~cuco.workloads.cp.peer_groups.default_peer_calls`)."""
        return {"peer_calls": default_peer_calls(self.problem)}

    def tolerance(self) -> tuple[float, float]:
        """The kernel rounds P to the dtype before P @ V and the output once."""
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

    def _gather(self, ctx, k, v, kg=None, vg=None):
        """K and V of every rank (slot r = rank r's shard), by NCCL all-gather (exact)."""
        n = self.shard * self.row_elems
        kg = dtypes.empty(self.world_size * n, self.dtype) if kg is None else kg
        vg = dtypes.empty(self.world_size * n, self.dtype) if vg is None else vg
        for src, dst in ((k, kg), (v, vg)):
            ctx.comm.all_gather(int(src.data.ptr), int(dst.data.ptr), n, self.dtype, ctx.stream.ptr)
        return kg, vg

    def key_positions(self) -> np.ndarray:
        """Global positions of the gathered keys (slot by slot)."""
        return np.concatenate([token_positions(p, self.world_size, self.chunk)
                               for p in range(self.world_size)])

    def reference(self, ctx, inputs: Buffers):
        """fp32-grade attention per head (see the module doc), [2C, H, D]."""
        import cupy
        s, rows = self.shape, self.shard
        kg, vg = self._gather(ctx, inputs["k"], inputs["v"])
        kvl, ld = s.seq, self.row_elems
        scores = cupy.empty((rows, kvl), dtype=cupy.float32)
        out = cupy.empty((rows, s.heads, s.head_dim), dtype=cupy.float32)
        if s.causal:
            qpos = cupy.asarray(token_positions(ctx.rank, self.world_size, self.chunk))
            masked = cupy.asarray(self.key_positions())[None, :] > qpos[:, None]
        tmp = cupy.empty((rows, s.head_dim), dtype=cupy.float32)
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
            for i, part in enumerate((hi, lo)):
                gemm(int(part.data.ptr), int(vg.data.ptr) + off, int(tmp.data.ptr), rows,
                     s.head_dim, kvl, self.dtype, ctx.stream, ldb=ld, out_dtype="fp32",
                     accumulate=i == 1)
            out[:, h, :] = tmp
        return out

    def output_elems(self) -> int:
        return self.shard * self.row_elems

    # ---- the attention kernel on the GPU ------------------------------------------------------
    def attention_kernel(self, ctx) -> AttentionKernel:
        """``cp_attend`` built for this shape (cached per worker), as the host programs run it."""
        cache = ctx.scratch.setdefault("cp_attend", {})
        key = self.core_source()
        if key not in cache:
            from cuco.kernels import Compiler
            built = Compiler().compile(key, needs=(), name=f"cp_attend.{self.label.replace('/', '.')}")
            cache[key] = AttentionKernel(ctx.function(str(built.path), "cp_attend"),
                                         self.shape.head_dim, self.dtype)
        return cache[key]

    def slots(self, kbases: list[int], vbases: list[int]):
        """The kernel's slot table: K base of every rank, then V base of every rank."""
        import cupy
        return cupy.asarray(np.array([*kbases, *vbases], dtype=np.uint64))

    def gathered_slots(self, kg, vg):
        step = self.shard * self.row_elems * self.esz
        w = self.world_size
        return self.slots([int(kg.data.ptr) + r * step for r in range(w)],
                          [int(vg.data.ptr) + r * step for r in range(w)])

    def host_sequence(self, ctx, inputs: Buffers, out):
        """NCCL all-gather of K and V, then the attention kernel over every slot in one pass."""
        attend = self.attention_kernel(ctx)
        n = self.shard * self.row_elems
        kg = dtypes.empty(self.world_size * n, self.dtype)
        vg = dtypes.empty(self.world_size * n, self.dtype)
        slots = self.gathered_slots(kg, vg)

        def run():
            self._gather(ctx, inputs["k"], inputs["v"], kg, vg)
            attend(ctx.stream, self.items, inputs["q"], out, slots, me=ctx.rank,
                   world=self.world_size, chunk=self.chunk)
        run.scratch = (kg, vg)  # every rank's K/V: scrubbed once verified (in_order's scratch)
        return run

    def compute_only(self, ctx, inputs: Buffers):
        """The compute alone, every K/V present: the fastest of cuco's attention kernel and,
        where torch runs in the worker, each library core's calls and merge (so the bound's
        compute half is never slower than what a variant's compute can be)."""
        attend = self.attention_kernel(ctx)
        kv = dtypes.random(self.shape.seq * self.row_elems, self.dtype, 21 + ctx.rank)
        slots = self.gathered_slots(kv, kv)
        out = dtypes.empty(self.shard * self.row_elems, self.dtype)

        def own():
            attend(ctx.stream, self.items, inputs["q"], out, slots, me=ctx.rank,
                   world=self.world_size, chunk=self.chunk)
        runs = {"own": own}
        if torch_bridge.unusable(ctx) is None:
            step = self.shard * self.row_elems * self.esz
            bases = [int(kv.data.ptr) + p * step for p in range(self.world_size)]
            for core, calls in itertools.product(self.op.library_cores, self.op.peer_calls):
                if not peer_calls_violations({"core": core, "peer_calls": calls}, self.problem):
                    runs[f"{core.value}.{calls.value}"] = library_compute(ctx, self, core, inputs["q"], bases,
                                                                          bases, out, calls)
        run = fastest(runs, ctx.stream) if len(runs) > 1 else own
        run.keepalive = (kv, runs)  # type: ignore[attr-defined]  # kv: reached only by address
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

    def baselines(self, ctx, inputs: Buffers) -> dict:
        """``host_torch_flash``: the all-gather, K/V put in sequence order, PyTorch's flash
        attention per half (what a user of torch writes); absent without torch."""
        try:
            _torch()
        except EnvironmentProblem:
            return {}
        out = dtypes.empty(self.output_elems(), self.dtype)
        found = {"host_torch_flash": (self.torch_flash(ctx, inputs, out), out)}
        if cudnn_attention_gap() is None:
            out = dtypes.empty(self.output_elems(), self.dtype)
            found["host_torch_cudnn"] = (self.torch_cudnn(ctx, inputs, out), out)
        return found

    def _bhsd(self, arr, rows: int):
        """A torch [1, H, rows, D] view of a CuPy storage array in the workload dtype."""
        torch = _torch()
        import cupy
        s = self.shape
        t = torch.as_tensor(arr.view(cupy.int16), device="cuda")
        t = t.view(torch.bfloat16 if self.dtype == "bf16" else torch.float16)
        return t.view(1, rows, s.heads, s.head_dim).transpose(1, 2)

    def _torch_program(self, ctx, inputs: Buffers, out, full, causal_half):
        """A torch host program: ``host_nccl``'s all-gather of K and V, then PyTorch's
        attention on [1, H, S, D] views. ``full(q, k, v)`` attends the shard's queries to every
        key (no mask; any key order); ``causal_half(q, k, v, qi)`` one query half (of chunk
        ``qi``) to the keys in sequence order, returning its rows of the output."""
        torch = _torch()
        s, w, c = self.shape, self.world_size, self.chunk
        n = self.shard * self.row_elems
        kg = dtypes.empty(w * n, self.dtype)
        vg = dtypes.empty(w * n, self.dtype)
        # gathered token index of every global position: sequence order
        order = torch.as_tensor(np.argsort(self.key_positions()), device="cuda")
        kt, vt = self._bhsd(kg, s.seq), self._bhsd(vg, s.seq)
        q, o = self._bhsd(inputs["q"], self.shard), self._bhsd(out, self.shard)
        stream = torch.cuda.ExternalStream(ctx.stream.ptr)

        def run():
            self._gather(ctx, inputs["k"], inputs["v"], kg, vg)
            with torch.cuda.stream(stream):
                if not s.causal:  # every key, in any order
                    o.copy_(full(q, kt, vt))
                    return
                ks, vs = kt.index_select(2, order), vt.index_select(2, order)
                for half in (0, 1):
                    rows = slice(half * c, (half + 1) * c)
                    o[:, :, rows].copy_(causal_half(q[:, :, rows], ks, vs, zigzag_chunk(ctx.rank, half, w)))
        run.scratch = (kg, vg)  # every rank's K/V: scrubbed once verified (in_order's scratch)
        return run

    def torch_flash(self, ctx, inputs: Buffers, out):
        """``host_torch_flash``: flash attention, a causal query half in one call over the keys
        up to its chunk's end (flash's causal mask is aligned bottom-right)."""
        fa, c = _torch().ops.aten._scaled_dot_product_flash_attention, self.chunk
        return self._torch_program(
            ctx, inputs, out, full=lambda q, k, v: fa(q, k, v, 0.0, False, False)[0],
            causal_half=lambda q, k, v, qi: fa(q, k[:, :, :(qi + 1) * c], v[:, :, :(qi + 1) * c], 0.0, True,
                                               False)[0])

    def torch_cudnn(self, ctx, inputs: Buffers, out):
        """``host_torch_cudnn``: cuDNN's attention. Its causal mask is aligned top-left, so a
        causal query half is two calls, the earlier chunks in full and its own chunk causal,
        merged by their log-sum-exps in fp32 (torch ops: what a user of torch writes)."""
        torch, c = _torch(), self.chunk
        cu = torch.ops.aten._scaled_dot_product_cudnn_attention

        def attend(q, k, v, causal):
            r = cu(q, k, v, None, True, 0.0, causal, False)
            return r[0], r[1].reshape(r[1].shape[:3]).unsqueeze(-1)

        def causal_half(q, k, v, qi):
            od, ld = attend(q, k[:, :, qi * c:(qi + 1) * c], v[:, :, qi * c:(qi + 1) * c], True)
            if qi == 0:
                return od
            op, lp = attend(q, k[:, :, :qi * c], v[:, :, :qi * c], False)
            m = torch.maximum(lp, ld)
            wp, wd = torch.exp(lp - m), torch.exp(ld - m)
            return (op.float() * wp + od.float() * wd) / (wp + wd)
        return self._torch_program(ctx, inputs, out, full=lambda q, k, v: cu(q, k, v, None, False, 0.0, False,
                                                                               False)[0],
                                   causal_half=causal_half)

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        if d.core.library:
            return LibraryRunner(ctx, self, d, binary, arena, inputs, out)
        return CPRunner(ctx, self, d, binary, arena, inputs, out)


class CPRunner(FusedCall):
    """The comm kernel pushes K/V chunks on a side stream; the attention kernel attends to the
    local slot, then to each peer's chunks as their flags say they arrived (``core=own``)."""

    def __init__(self, ctx, wl: CPAttention, d: Directives, cubin: str, arena, inputs: Buffers,
                 out):
        import cupy
        self._setup(ctx, wl, d, cubin, arena, inputs, out)
        self.attend = AttentionKernel(ctx.function(cubin, "cp_attend"), wl.shape.head_dim, wl.dtype)
        self.slots = wl.slots(*self.kv_bases)
        self.scratch = cupy.empty(parked_floats(wl.shape.heads, wl.shape.head_dim, wl.shard),
                                  dtype=cupy.float32)
        # the attention kernel once alone (no flags: it reads whatever the slots hold), so its
        # module is never first loaded beside a spinning kernel
        junk = dtypes.empty(wl.output_elems(), wl.dtype)
        self._attend(junk, flags=0)
        self._settle_modules()

    def _attend(self, out, flags: int) -> None:
        wl = self.wl
        self.attend(self.ctx.stream, wl.items, self.inputs["q"], out, self.slots, me=self.ctx.rank,
                    world=wl.world_size, chunk=wl.chunk, flags=flags, need=self.d.comm_ctas,
                    chunk_rows=self.rows, n_chunks=self.n, scratch=self.scratch,
                    reserve_sms=self.d.comm_ctas)

    def __call__(self) -> None:
        self._start()
        self._attend(self.output, flags=self.arena.ptr + self.layout.flags)
        self._finish()
