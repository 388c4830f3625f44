"""MoE layer: token dispatch -> expert SwiGLU FFN -> combine, experts split across ranks.

DeepSeek-V3-like by default (256 experts, top-8, hidden 7168, expert FFN 2048).
Each rank holds ``tokens`` tokens ``x [T, H]``, the router's picks (``ids [T, K]``,
drawn from a seeded router with realistic imbalance, or one of the edge routings)
and ``experts / w`` experts; expert ``e`` lives on rank ``e // (E / w)`` and computes
``(silu(x Wg_e) * (x Wu_e)) Wd_e`` (SwiGLU with a gate, as DeepSeek-V3's experts). The
weights are stored with K contiguous, as the GEMMs read them: ``wgu [E/w, 2F, H]`` (gate
rows then up rows) and ``wd [E/w, H, F]``. Each rank's output is
``out[t] = sum_k weight[t, k] * expert_{ids[t, k]}(x[t])``.

* host-driven (:mod:`cuco.workloads.moe.host`): sort, gather, counts on the host, NCCL
  all-to-all, a grouped GEMM per projection, NCCL back, a fused weighted sum;
* fused (``side_stream``, ``moe.cu.j2``): device-side end to end; routing tables and the
  exchange of counts in a kernel, rows stored straight into the owner's expert-major
  buffer, one CUTLASS grouped GEMM per projection whose sizes the device writes
  (:mod:`cuco.workloads.moe.grouped_gemm`), and a combine that reads each pair's output from its
  owner and writes the weighted sum. No host synchronisation in a call;
* fused for ranks on different hosts (``backend=gin``, ``moe_gin.cu.j2``,
  :mod:`cuco.workloads.moe.gin`): the same call with every byte that crosses ranks a GIN put
  (the rows staged in the arena first), and the combine pushed: each owner puts its experts'
  outputs back to the pairs' sources.

The layout both sides agree on is :func:`routing_tables` (numpy; the kernel computes the
same on the device). The fp32 reference all-gathers tokens and picks, computes every local
expert's weighted output for every token that picked it (bf16 products exact in fp32; the
activation split into two bf16 terms), and reduce-scatters the partial sums in fp32.
"""

from __future__ import annotations

import math

import numpy as np

from cuco.design import Backend, Directives, MoEProblem
from cuco.design.pipeline_ops import MOE
from cuco.design.problem import DTYPE_BYTES
from cuco.design.tiles import sizes_cutting
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes
from cuco.runtime.arena import ArenaLayout
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.workloads.moe import gin as moe_gin
from cuco.workloads.moe import host as moe_host
from cuco.workloads.moe.gin import MoEGinRunner
from cuco.workloads.moe.grouped_gemm import default_config
from cuco.workloads.moe.runner import MoERunner
from cuco.workloads.base import EPS, Buffers, Runner, register
from cuco.workloads.pipeline import MAX_FLAGS, OPEN_SLOT, THREADS, PipelineWorkload, flag_plan_check

#: Shared memory the routing kernel may use for its per-warp expert counters.
ROUTE_SMEM = 40 << 10


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


def routing_tables(ids: list[np.ndarray], experts: int) -> list[dict[str, np.ndarray]]:
    """What ``route_kernel`` computes on each rank, from every rank's ``ids [T, K]``:

    * ``dest [T*K]``: pair p's row in its expert's owner's expert-major receive buffer, where
      expert e's rows come before e+1's, inside one expert the sources' in rank order, and
      inside one source its pairs in order;
    * ``order [T*K]``: this rank's pairs sorted by expert (stable); ``send_start [E+1]``: where
      each expert's pairs start in it;
    * ``local_start [E/w + 1]``: where each local expert's rows start in this rank's buffer
      (the last entry: rows it receives).
    """
    W = len(ids)
    el = experts // W
    flat = [i.reshape(-1).astype(np.int64) for i in ids]
    C = np.stack([np.bincount(f, minlength=experts) for f in flat])      # [source, expert]
    total = C.sum(axis=0)
    start = np.concatenate([[0], np.cumsum(total)])                     # over all experts
    owner_first = (np.arange(experts) // el) * el
    out = []
    for s, f in enumerate(flat):
        order = np.argsort(f, kind="stable")
        send_start = np.concatenate([[0], np.cumsum(C[s])])
        rank = np.empty_like(f)
        rank[order] = np.arange(f.size) - send_start[f[order]]
        base = start[:-1] - start[owner_first] + C[:s].sum(axis=0)
        out.append({"dest": (base[f] + rank).astype(np.int32), "order": order.astype(np.int32),
                    "send_start": send_start.astype(np.int32),
                    "local_start": (start[s * el:(s + 1) * el + 1] - start[s * el]).astype(np.int32)})
    return out


@register
class MoE(PipelineWorkload):
    """``MoE(world_size, tokens=..., hidden=..., ffn=..., experts=..., topk=..., routing=...)``
    (fields of :class:`cuco.design.MoEProblem`)."""

    op = MOE
    problem: MoEProblem
    #: torch's grouped GEMM (host_nccl, where torch runs) or CUTLASS's: the faster is the baseline
    host_programs = ("host_nccl", "host_cutlass")

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
    def rows_per_expert(self) -> float:
        """Rows an expert receives on average (every rank's tokens, top-k each)."""
        s = self.shape
        return self.world_size * s.tokens * s.topk / s.experts

    @property
    def grouped_gemm_config(self) -> str:
        """The expert GEMMs' configuration for this row regime (fused and host programs alike)."""
        return default_config(self.rows_per_expert)

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

    def route_warps(self) -> int:
        """Warps of the routing kernel: one counter row per warp and expert in shared memory."""
        return max(1, min(32, ROUTE_SMEM // (4 * self.shape.experts)))

    def layout(self) -> ArenaLayout:
        """Every rank's receive buffer, expert outputs and count matrix; where the ranks span
        hosts (the only problems with GIN variants) also the rows a GIN variant stages for its
        puts (``send``) and the outputs its peers put back (``ret``), one row per pair each."""
        rows = self.max_recv_rows * self.row_bytes
        regions = {"recv": rows, "y": rows, "counts": self.world_size * self.shape.experts * 4}
        if self.problem.has_network:
            regions.update(send=self.pairs * self.row_bytes, ret=self.pairs * self.row_bytes)
        return ArenaLayout.build(regions, MAX_FLAGS * 8, 0)

    def work(self) -> Work:
        """An average rank (the busiest does at least as much): its share of the pairs
        through the three expert projections, the rows through HBM once (not the weights: an
        expert no token picked need not read them), the rows it receives from peers for
        dispatch and reads back for combine."""
        s, w = self.shape, self.world_size
        rows_in = self.pairs * (w - 1) / w
        return Work(6.0 * self.pairs * s.hidden * s.ffn, 3 * self.pairs * self.row_bytes,
                    2 * rows_in * self.row_bytes)

    def live_flag_slots(self, d: Directives) -> tuple[tuple[int, int], ...] | None:
        """The plan's flags, and under GIN each group's "outputs computed" flag
        (``moe_gin.cu.j2``'s ``[kComputed + g]``)."""
        out = super().live_flag_slots(d)
        if out is not None and d.backend is Backend.GIN:
            out += ((moe_gin.COMPUTED_SLOT, moe_gin.COMPUTED_SLOT + self.groups(d)),)
        return out

    def plan(self, d: Directives) -> dict:
        """One chunk per group of experts (any chunk size groups the experts somehow)."""
        g = self.groups(d)
        flags = flag_plan_check(g * MAX_RANKS + 3 * MAX_RANKS, self.family)
        if d.backend is Backend.GIN:
            moe_gin.plan_check(g)
        return {"groups": g, "flag_slots": flags}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.pairs * self.row_bytes, (1, 2, 4, 8, 16))

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        s = self.shape
        src = render(self.op.template_for(d.backend), backend=d.backend.value, issuer=d.issuer.value,
                     ctype=CTYPES[self.dtype], experts=s.experts, experts_per_rank=self.local_experts,
                     tokens=s.tokens, topk=s.topk, hidden=s.hidden, ffn=s.ffn,
                     row_bytes=self.row_bytes, max_ranks=MAX_RANKS, threads=THREADS,
                     open_slot=OPEN_SLOT, route_warps=self.route_warps(), name=d.full_name,
                     **moe_gin.template_constants(), **self.plan(d))
        needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, self.runner_class(d).KERNELS)

    def grid(self) -> list[Directives]:
        return self.grid_of(sizes_cutting(self.pairs * self.row_bytes, (1, 4, 16)),
                            [("lsa", "warp", 16), ("lsa", "cta", 32), ("nvshmem", "warp", 16)])

    def tolerance(self) -> tuple[float, float]:
        """The gate/up outputs, the activation, each expert's output and the weighted sum are
        each rounded to the dtype once."""
        eps = EPS[self.dtype]
        return 4 * eps, 4 * eps * (1 + math.sqrt(self.shape.ffn / 65536.0))

    # ---- GPU side -------------------------------------------------------------------------
    def make_inputs(self, ctx, seed: int) -> Buffers:
        import cupy
        s, el = self.shape, self.local_experts
        ids, w = route(s, self.world_size, seed, ctx.rank)
        rs = cupy.random.RandomState(1000 * seed + 10 * ctx.rank)
        x = dtypes.from_float32(rs.standard_normal((s.tokens, s.hidden), dtype=cupy.float32),
                                self.dtype)
        wgu = cupy.empty((el, 2 * s.ffn, s.hidden), dtype=cupy.uint16)
        wd = cupy.empty((el, s.hidden, s.ffn), dtype=cupy.uint16)
        for e in range(el):  # expert by expert: no fp32 copy of all weights at once
            wgu[e] = dtypes.from_float32(rs.standard_normal((2 * s.ffn, s.hidden), dtype=cupy.float32)
                                         * cupy.float32(1 / math.sqrt(s.hidden)), self.dtype)
            wd[e] = dtypes.from_float32(rs.standard_normal((s.hidden, s.ffn), dtype=cupy.float32)
                                        * cupy.float32(1 / math.sqrt(s.ffn)), self.dtype)
        return {"x": x, "ids": cupy.asarray(ids), "weights": cupy.asarray(w), "wgu": wgu, "wd": wd}

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
            h = cupy.empty((n, 2 * F), dtype=cupy.float32)
            gemm(int(xe.data.ptr), int(inputs["wgu"][j].data.ptr), int(h.data.ptr), n, 2 * F, H,
                 self.dtype, ctx.stream, out_dtype="fp32", trans_b=True)
            g, u = h[:, :F], h[:, F:]
            act = cupy.ascontiguousarray(g / (1 + cupy.exp(-g)) * u)
            hi = dtypes.from_float32(act, self.dtype)
            lo = dtypes.from_float32(act - dtypes.to_float32(hi, self.dtype), self.dtype)
            y = cupy.empty((n, H), dtype=cupy.float32)
            for i, part in enumerate((hi, lo)):
                gemm(int(part.data.ptr), int(inputs["wd"][j].data.ptr), int(y.data.ptr), n, H, F,
                     self.dtype, ctx.stream, out_dtype="fp32", accumulate=i == 1, trans_b=True)
            partial[tok] += wg[tok, slot][:, None] * y  # an expert sees a token at most once
        out = cupy.empty((T, H), dtype=cupy.float32)
        ctx.comm.reduce_scatter(int(partial.data.ptr), int(out.data.ptr), T * H, "fp32", st)
        return out

    def output_elems(self) -> int:
        return self.shape.tokens * self.shape.hidden

    # -- host programs (cuco.workloads.moe.host) --
    def expert_major_order(self, C: np.ndarray, owner: int) -> np.ndarray:
        """For each row of ``owner``'s expert-major buffer, its row in the [source][expert]
        buffer NCCL delivers (segments of ``C[s, e]`` rows, e local to ``owner``)."""
        W, el = self.world_size, self.local_experts
        Cl = C[:, owner * el:(owner + 1) * el].astype(np.int64)        # [source, local expert]
        src_start = (np.cumsum(Cl.reshape(-1)) - Cl.reshape(-1)).reshape(W, el)
        n = Cl.T.reshape(-1)                                            # expert-major segments
        dst_start = np.cumsum(n) - n
        return np.repeat(src_start.T.reshape(-1) - dst_start, n) + np.arange(int(n.sum()))

    def host_sequence(self, ctx, inputs: Buffers, out):
        """NCCL all-to-all + a grouped GEMM per projection (torch's where torch runs in the
        worker, CUTLASS's otherwise)."""
        return moe_host.host_program(self, ctx, inputs, out, moe_host.ffn_choice(ctx))

    def baselines(self, ctx, inputs: Buffers) -> dict:
        """The per-expert cuBLAS program, and the CUTLASS grouped GEMM program where the
        host program runs torch's."""
        out = {}
        names = ["per_expert"] + (["cutlass"] if moe_host.ffn_choice(ctx) == "torch" else [])
        for ffn in names:
            buf = dtypes.empty(self.output_elems(), self.dtype)
            out[f"host_{ffn}"] = (moe_host.host_program(self, ctx, inputs, buf, ffn), buf)
        return out

    def host_notes(self, ctx) -> dict:
        return {"grouped_gemm": moe_host.ffn_choice(ctx)}

    def compute_only(self, ctx, inputs: Buffers):
        return moe_host.compute_only(self, ctx, inputs)

    def comm_only(self, ctx, inputs: Buffers):
        return moe_host.comm_only(self, ctx, inputs)

    @staticmethod
    def runner_class(d: Directives) -> type[MoERunner]:
        """The fused call of ``d``: GIN's (puts, signals, its proxy) or one host's."""
        return MoEGinRunner if d.backend is Backend.GIN else MoERunner

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        return self.runner_class(d)(ctx, self, d, binary, arena, inputs, out)
