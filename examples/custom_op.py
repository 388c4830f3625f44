"""A new op from outside cuco: a GEMM whose output every rank gathers (GEMM + AllGather).

Rank r holds a row block A_r (M/W x K) of A and all of B (K x N); it computes C_r = A_r @ B,
and every rank ends with the whole C = A @ B (M x N): e.g. a sequence-parallel projection
whose next op needs every token. No built-in computes it (``allgather_gemm`` gathers the
GEMM's *input*), and it is not a tensor-parallel pattern: this file adds it, and nothing in
cuco changes. Why this op rather than an AllToAll feeding a GEMM: every byte that crosses
ranks here is known before the call (fixed blocks, no routing), each chunk has one producer
(the chunk's GEMM) and W-1 readers, so it fits cuco's side-stream pipeline shape exactly; an
AllToAll + GEMM is MoE's dispatch, which cuco already has.

What it brings, all here:

* ``GemmAllGatherProblem``: its typed problem (global M, K, N; each refusal names the field);
* ``GEMM_ALLGATHER``: its op object (a ``PipelineOp``: its problem class and its template);
* ``custom_op_templates/gemm_allgather.cu.j2``: its fused kernel, a template in a directory of
  its own that includes cuco's arena and flag partials: the compute stream runs the GEMM chunk
  by chunk into the symmetric arena and flags each chunk; a communication kernel on a second
  stream pushes each finished chunk into every peer's arena and counts its arrival there;
* ``GemmAllGather``: its workload: design space, render, inputs from a seed, the fp32
  reference, the host program (the fastest GEMM, then the faster NCCL all-gather), the halves
  of the bound, tolerance, arena layout, runner and ``work()`` (the analytic model's input).

Run it::

    python examples/custom_op.py --dry-run          # no GPU: a search of the analytic model
    python examples/custom_op.py                    # GPUs: the evaluator, then a search
    cuco --plugin examples/custom_op.py search --workload gemm_allgather --shape 4096x4096x4096 --dry-run

With one GPU the ranks share it (an emulated world): kernels are checked, never timed.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

import cuco
from cuco import CandidateDB, Directives, PipelineOp, Problem, ShapeError
from cuco.design import Backend, make_problem
from cuco.design.problem import DTYPE_BYTES, MAX_RANKS, ROW_BYTES
from cuco.design.tiles import largest_divisor, sizes_cutting
from cuco.errors import DirectiveError, run_script
from cuco.kernels import KernelSource
from cuco.kernels.render import CTYPES, render
from cuco.runtime import dtypes, host_collective, host_gemm
from cuco.runtime.arena import ArenaLayout, arena_view
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.runtime.timing import spin
from cuco.workloads import PipelineWorkload, for_problem, in_order, register
from cuco.workloads.pipeline import MAX_FLAGS, OPEN_SLOT, THREADS, flag_plan_check

TEMPLATES = Path(__file__).resolve().parent / "custom_op_templates"
#: The kernels of a build that the runner launches.
FUNCTIONS = ("comm_kernel", "wait_arrivals", "set_own_flag", "set_peer_flag")


class GemmAllGatherProblem(Problem):
    """C = A @ B, A (M x K) split by rows over the ranks, B (K x N) on every rank; every
    rank ends with all of C. ``--shape`` reads ``MxKxN`` or ``m=...,k=...,n=...``."""

    SHAPE: ClassVar[tuple[str, ...]] = ("m", "k", "n")
    X_SHAPE: ClassVar[bool] = True
    workload: Literal["gemm_allgather"] = "gemm_allgather"
    m: int = Field(8192, gt=0, description="rows of A and C over all ranks")
    k: int = Field(4096, gt=0)
    n: int = Field(4096, gt=0)

    @model_validator(mode="after")
    def _splits(self) -> "GemmAllGatherProblem":
        w, esz = self.world_size, DTYPE_BYTES[self.dtype]
        if w > MAX_RANKS:
            raise ShapeError(f"gemm_allgather: world_size={w} > {MAX_RANKS} (one open flag per "
                             "rank)", param="world_size", fix=MAX_RANKS)
        if self.m % w:
            raise ShapeError(f"gemm_allgather: M={self.m} rows are split over {w} ranks; choose "
                             f"M a multiple of {w}", param="m", fix=self.m - self.m % w or w)
        step = ROW_BYTES // esz
        for dim in ("k", "n"):
            value = getattr(self, dim)
            if value % step:
                raise ShapeError(f"gemm_allgather: {dim.upper()}={value} makes rows of "
                                 f"{value * esz} bytes, not whole {ROW_BYTES}-byte units; choose "
                                 f"{dim.upper()} a multiple of {step}", param=dim,
                                 fix=value - value % step or step)
        return self

    @property
    def label(self) -> str:
        return f"gemm_allgather/M{self.m}K{self.k}N{self.n}/{self.dtype}"


#: The op object: what it is (its problem class) and where its fused kernels come from.
GEMM_ALLGATHER = PipelineOp("gemm_allgather", GemmAllGatherProblem, "gemm_allgather.cu.j2")


def _ptr(array) -> int:
    return int(array.data.ptr)


@register
class GemmAllGather(PipelineWorkload):
    """``GemmAllGather(world_size, m=..., k=..., n=...)``."""

    op = GEMM_ALLGATHER
    problem: GemmAllGatherProblem

    # ---- description (CPU) --------------------------------------------------------------
    @property
    def esz(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def rows(self) -> int:
        """Rows of C each rank computes (its block)."""
        return self.problem.m // self.world_size

    @property
    def block_bytes(self) -> int:
        return self.rows * self.problem.n * self.esz

    def small_problem(self) -> GemmAllGatherProblem:
        return self.problem.model_copy(update={"m": 128 * self.world_size, "k": 256, "n": 512})

    def chunk_rows(self, d: Directives) -> int:
        """Rows per chunk: the most whole groups of 8 rows (or the whole block) in ``d``'s chunk."""
        row_bytes = self.problem.n * self.esz
        rows = largest_divisor(self.rows, max(1, min(d.chunk_bytes // row_bytes, self.rows)))
        if rows is None:
            raise DirectiveError([f"chunk_bytes: no chunk of at most {d.chunk_bytes} bytes holds "
                                  f"8 rows of {row_bytes} bytes; choose chunk_bytes >= {8 * row_bytes}"])
        return rows

    def plan(self, d: Directives) -> dict:
        rows = self.chunk_rows(d)
        n = self.rows // rows
        flag_plan_check(n * (1 + MAX_RANKS), f"{n} chunks per rank")
        return {"n_chunks": n, "chunk_rows": rows, "chunk_bytes": rows * self.problem.n * self.esz}

    def chunk_choices(self) -> list[int]:
        return sizes_cutting(self.block_bytes, (2, 4, 8, 16))

    def grid(self) -> list[Directives]:
        return self.grid_of(sizes_cutting(self.block_bytes, (2, 8)),
                            [("lsa", "warp", 8), ("lsa", "cta", 16), ("nvshmem", "cta", 8)])

    def render(self, d: Directives) -> KernelSource:
        self.check(d)
        src = render(self.op.template, template_dirs=[TEMPLATES], backend=d.backend.value,
                     issuer=d.issuer.value, ctype=CTYPES[self.dtype], comm_ctas=d.comm_ctas,
                     threads=THREADS, open_slot=OPEN_SLOT, name=d.full_name, **self.plan(d))
        needs = ("nvshmem",) if d.backend is Backend.NVSHMEM else ("nccl",)
        return KernelSource(self.kernel_name(d), src, needs, FUNCTIONS)

    def layout(self) -> ArenaLayout:
        """All of C lives in the arena (every rank's pushes land in it), then the flags."""
        return ArenaLayout.build({"c": self.output_elems() * self.esz}, MAX_FLAGS * 8, 0)

    def output_elems(self) -> int:
        return self.problem.m * self.problem.n

    def tolerance(self) -> tuple[float, float]:
        """One GEMM's: C is rounded once, and nothing is summed across ranks."""
        return host_gemm.tolerance(self.problem.k, self.dtype)

    def work(self) -> Work:
        """Its GEMM, A, B and all of C through HBM once, the W-1 blocks it receives."""
        p = self.problem
        return Work(2.0 * self.rows * p.n * p.k, (self.rows * p.k + p.k * p.n + p.m * p.n) * self.esz,
                    (self.world_size - 1) * self.block_bytes)

    # ---- GPU side (inside a worker) -----------------------------------------------------
    def make_inputs(self, ctx, seed: int):
        import cupy
        p = self.problem
        a = cupy.random.RandomState(1000 * seed + 10 * ctx.rank).standard_normal(
            (self.rows, p.k), dtype=cupy.float32)
        b = cupy.random.RandomState(1000 * seed + 7).standard_normal((p.k, p.n), dtype=cupy.float32)
        b *= cupy.float32(1.0 / math.sqrt(p.k))  # B is the same on every rank
        return {"a": dtypes.from_float32(a, self.dtype), "b": dtypes.from_float32(b, self.dtype)}

    def reference(self, ctx, inputs):
        """This rank's block in fp32 (fp32 GEMM), all blocks by an fp32 NCCL all-gather."""
        import cupy
        part = dtypes.to_float32(inputs["a"], self.dtype) @ dtypes.to_float32(inputs["b"], self.dtype)
        out = cupy.empty((self.problem.m, self.problem.n), dtype=cupy.float32)
        ctx.comm.all_gather(_ptr(part), _ptr(out), part.size, "fp32", ctx.stream.ptr)
        return out

    def block(self, c, rank: int):
        """Rank ``rank``'s rows of ``c`` (all of C, flat)."""
        size = self.rows * self.problem.n
        return c[rank * size:(rank + 1) * size]

    def host_parts(self, ctx):
        """The fastest GEMM of this rank's block, and the faster NCCL all-gather of it."""
        p = self.problem
        return (host_gemm.select(ctx, self.rows, p.n, p.k, self.dtype),
                host_collective.select(ctx, "all_gather", self.rows * p.n, self.dtype))

    def host_sequence(self, ctx, inputs, out):
        """The GEMM into this rank's block of the all-gather's buffer, then NCCL in place."""
        g, coll = self.host_parts(ctx)
        dst = coll.buffer(ctx, "recv", out)
        mine = self.block(dst, ctx.rank)
        return in_order(g.bind(_ptr(inputs["a"]), _ptr(inputs["b"]), _ptr(mine)),
                         coll.bind(ctx, mine, dst), output=dst)

    def compute_only(self, ctx, inputs):
        c = dtypes.empty(self.rows * self.problem.n, self.dtype)
        gemm_ = self.host_parts(ctx)[0].bind(_ptr(inputs["a"]), _ptr(inputs["b"]), _ptr(c))
        return in_order(gemm_, output=c)

    def comm_only(self, ctx, inputs):
        coll = self.host_parts(ctx)[1]
        dst = coll.buffer(ctx, "recv", dtypes.random(self.output_elems(), self.dtype, 7 + ctx.rank))
        return in_order(coll.bind(ctx, self.block(dst, ctx.rank), dst), output=dst)

    def host_notes(self, ctx) -> dict:
        g, coll = self.host_parts(ctx)
        return {**g.notes(), **coll.notes()}

    def runner(self, ctx, d: Directives, binary: str, arena, inputs, out):
        return GemmAllGatherRunner(ctx, self, d, binary, arena, inputs)


class GemmAllGatherRunner:
    """One fused call on ``ctx.stream``: the GEMM chunk by chunk into this rank's block of C in
    the arena, each chunk flagged; the communication kernel on a second stream pushes it to
    every peer; the call ends once every peer's chunks arrived here (the output: all of C)."""

    def __init__(self, ctx, wl: GemmAllGather, d: Directives, cubin: str, arena, inputs):
        import cupy
        self.ctx, self.wl, self.d, self.arena, self.inputs = ctx, wl, d, arena, inputs
        #: > 0 in checked calls: each chunk's GEMM and the transfers start late, so a push
        #: before the chunk's flag, or an end before the arrivals, meets poison
        self.stress_us = 0.0
        plan = wl.plan(d)
        self.chunk_rows, self.n_chunks = plan["chunk_rows"], plan["n_chunks"]
        self.layout = wl.layout()
        self.c_off = self.layout.data["c"]
        self.output = arena_view(arena, self.c_off, wl.output_elems(), wl.dtype)
        self.f = {name: ctx.function(cubin, name) for name in FUNCTIONS}
        self.comm_stream = ctx.scratch.setdefault("side_streams", {}).setdefault(
            "comm", cupy.cuda.Stream(non_blocking=True))
        self.start = cupy.cuda.Event(disable_timing=True)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.args = arena.args(ctx)
        # every kernel a call launches once alone (a first launch beside a spinning kernel can
        # wait for a module load forever; cuBLAS picks its algorithm)
        self._gemm_chunk(0)
        self.f["wait_arrivals"]((1,), (256,), (*self.args, np.uint64(self.layout.flags),
                                                np.uint64(0)), stream=ctx.stream)
        spin(ctx.stream, 0.0)
        spin(self.comm_stream, 0.0)
        ctx.stream.synchronize()
        self.comm_stream.synchronize()

    def _gemm_chunk(self, c: int) -> None:
        p, wl, esz = self.wl.problem, self.wl, self.wl.esz
        a = _ptr(self.inputs["a"]) + c * self.chunk_rows * p.k * esz
        dst = self.arena.ptr + self.c_off + (self.ctx.rank * wl.rows + c * self.chunk_rows) * p.n * esz
        gemm(a, _ptr(self.inputs["b"]), dst, self.chunk_rows, p.n, p.k, wl.dtype, self.ctx.stream)

    def __call__(self) -> None:
        import cupy
        ctx, a, s, cs = self.ctx, self.arena, self.ctx.stream, self.comm_stream
        a.epoch += 1
        e, flags = np.uint64(a.epoch), np.uint64(self.layout.flags)
        me, w, n = ctx.rank, ctx.world_size, self.n_chunks
        # arrival counters restart at zero, then every peer may write into our C
        cupy.cuda.runtime.memsetAsync(a.ptr + self.layout.flags + n * 8, 0, w * n * 8, s.ptr)
        for r in range(w):
            if r != me:
                self.f["set_peer_flag"]((1,), (1,), (*self.args, flags, np.int32(OPEN_SLOT + me),
                                                     np.int32(r), e), stream=s)
        self.start.record(s)
        cs.wait_event(self.start)
        if self.stress_us:
            spin(cs, self.stress_us)
        self.f["comm_kernel"]((self.d.comm_ctas,), (THREADS,),
                              (*self.args, np.uint64(self.c_off), flags, e), stream=cs)
        for c in range(n):
            if self.stress_us:
                spin(s, self.stress_us)
            self._gemm_chunk(c)
            self.f["set_own_flag"]((1,), (1,), (*self.args, flags, np.int32(c), e), stream=s)
        self.f["wait_arrivals"]((1,), (256,), (*self.args, flags, np.uint64(self.d.comm_ctas)),
                                stream=s)
        self.done.record(cs)
        s.wait_event(self.done)


def main(argv: list[str] | None = None) -> int:
    from cuco.runtime import WorkerGroup, visible_gpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x4096x4096", help="MxKxN or m=...,k=...,n=...")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--db", default="custom_op.db")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--dry-run", action="store_true", help="score the analytic model, no GPU")
    args = ap.parse_args(argv)

    problem = make_problem("gemm_allgather", args.shape, world_size=args.world_size)  # by name
    space = for_problem(problem).space()  # the registered workload of the name
    print(f"{problem.label}: {space.size} valid points; the fast path starts at "
          f"{space.default().full_name}")
    gpus = visible_gpus()
    dry_run = args.dry_run or not gpus
    if dry_run and not args.dry_run:
        print("no GPU visible: a dry run (the analytic model) instead")
    db = CandidateDB(args.db)
    group = None
    try:
        if dry_run:
            result = cuco.search(problem, db=db, budget=args.budget, islands=2, dry_run=True)
        else:  # fewer GPUs than ranks: the ranks share one GPU (checked, never timed)
            group = WorkerGroup(problem.world_size, emulate=gpus < problem.world_size,
                                nvshmem=True).start()
            ev = cuco.Evaluator(for_problem(problem), group=group, db=db)
            r = ev.evaluate(space.default())
            print(f"fast path {space.default().full_name}: {r.status} at {r.stage_reached}, "
                  f"speedup {r.speedup}{'' if r.error is None else ', ' + r.error}")
            result = cuco.search(problem, db=db, budget=args.budget, islands=2, evaluator=ev)
    finally:
        if group is not None:
            group.close()
    best = db.best(problem.workload, run_id=result.run_id)
    if best is None:
        print(f"run {result.run_id}: no candidate passed ({result.evaluations} evaluated)")
        return 1
    cand, ev_ = best
    print(f"run {result.run_id}: {result.evaluations} evaluated; best "
          f"{Directives(**cand.directives).full_name}: {ev_.status}, speedup "
          f"{ev_.speedup_label()}")
    return 0


if __name__ == "__main__":
    run_script(main)
