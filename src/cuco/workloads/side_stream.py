"""Launch a ``side_stream`` fused variant inside a worker.

One call: the communication kernel starts on a second stream; the compute
stream runs the GEMM chunk by chunk (waiting for a chunk's arrival first for
AllGather+GEMM, raising its flag afterwards for the reductions); the compute
stream then waits for the communication stream. Buffers that peers read or
write live in a symmetric arena (an NCCL window, or NVSHMEM symmetric memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuco.design import Directives
from cuco.design.tiles import ChunkPlan
from cuco.kernels.tp import FLAG_STRIDE, THREADS
from cuco.runtime.cublas import gemm
from cuco.runtime.timing import spin
from cuco.workloads.base import Buffers, Workload

MAX_CTAS = 1024
#: Per-slot arrival counts the host keeps for an arena (AllGather's rolling targets).
COUNTER_SLOTS = 4096
PAGE = 4096
#: A page after every data region, filled with CANARY; a candidate that writes
#: there wrote outside its outputs.
GUARD_BYTES = PAGE
CANARY = 0xA5


def _page(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True)
class ArenaLayout:
    """Offsets (bytes) of one workload's buffers in the arena."""

    data: dict[str, int]
    flags: int
    bar: int
    size: int
    guards: tuple[int, ...] = ()

    @classmethod
    def for_workload(cls, wl: Workload) -> "ArenaLayout":
        esz = 2 if wl.dtype in ("bf16", "fp16") else 4
        m, n, k, w = wl.m, wl.n, wl.k, wl.world_size
        # p: this rank's partial (side stream) or staged tiles (dedicated_ctas); o: the
        # all-reduced output; r: receive slots of the in-kernel placements, [src][M/w][N]
        if wl.pattern_name == "gemm_allreduce":
            regions = {"p": m * n * esz, "o": m * n * esz, "r": m * n * esz}
        elif wl.pattern_name == "gemm_reducescatter":
            regions = {"p": m * n * esz, "r": m * n * esz}
        else:
            regions = {"xf": m * k * esz}
        # flags: the side-stream variants' (chunk counters) first, then the in-kernel variants'
        # (epoch-valued): a counter and an epoch never share a slot across variants of one job
        return cls.build(regions, 2 * w * FLAG_STRIDE * 8, w * MAX_CTAS * 8)

    @classmethod
    def build(cls, regions: dict[str, int], flag_bytes: int, bar_bytes: int) -> "ArenaLayout":
        """Data regions (bytes) each followed by a guard page, then flags, then barrier slots."""
        off, data, guards = 0, {}, []
        for name, size in regions.items():
            data[name] = off
            off += _page(size)
            guards.append(off)
            off += GUARD_BYTES
        flags = off
        off += _page(flag_bytes)
        bar = off
        off += _page(bar_bytes)
        return cls(data, flags, bar, off, tuple(guards))

    @property
    def in_kernel_flags(self) -> int:
        """Second half of the flag area: the in-kernel variants' epoch flags (the side-stream
        variants' chunk counters use the first half; one job may run both)."""
        return self.flags + (self.bar - self.flags) // 2

    @property
    def sync_bytes(self) -> int:
        """Flags and barrier slots: zeroed before a job's first fused call."""
        return self.size - self.flags


class Arena:
    """A symmetric buffer on every rank, of one backend."""

    def __init__(self, ctx, backend: str, size: int):
        if backend == "gin":
            raise RuntimeError("backend=gin kernels are rendered and compile-checked but not run "
                               "yet: GIN needs ranks on different hosts with a GIN-capable network "
                               "(RDMA), and its arena carries receive slots after the barrier "
                               "slots; use lsa or nvshmem on one host")
        self.backend, self.size = backend, size
        if backend == "lsa":
            self.window = ctx.comm.alloc_window(size)
            self.ptr = self.window.ptr
        else:
            if ctx.nvshmem is None:
                raise RuntimeError("backend=nvshmem needs WorkerGroup(nvshmem=True)")
            self.ptr = ctx.nvshmem.malloc(size)
        self.epoch = 0
        self.counts = np.zeros(COUNTER_SLOTS, dtype=np.int64)  # AllGather chunk counters

    def args(self, ctx) -> tuple:
        if self.backend == "lsa":
            return (np.uint64(ctx.devcomm.ptr), np.uint64(self.window.handle))
        return (np.uint64(self.ptr),)

    def free(self, ctx) -> None:
        if self.backend == "lsa":
            ctx.comm.free_window(self.window)
        else:
            ctx.nvshmem.free(self.ptr)


def prepare_arenas(ctx, layout: ArenaLayout, backends: set[str], first_epoch: int = 1) -> dict[str, Arena]:
    """Arenas for this job, flags zeroed, guards filled, the next call's epoch
    ``first_epoch`` (random per job in the evaluator's jobs, so no kernel can count on a
    job's first call carrying epoch 1); collective (every rank calls it in step, with
    the same ``first_epoch``). An arena is kept across jobs and grown when a layout
    needs more."""
    import cupy
    arenas = ctx.scratch.setdefault("arenas", {})
    for b in sorted(backends):
        a = arenas.get(b)
        if a is None or a.size < layout.size:
            if a is not None:
                a.free(ctx)
            a = arenas[b] = Arena(ctx, b, layout.size)
        cupy.cuda.runtime.memsetAsync(a.ptr + layout.flags, 0, layout.sync_bytes, ctx.stream.ptr)
        for g in layout.guards:
            cupy.cuda.runtime.memsetAsync(a.ptr + g, CANARY, GUARD_BYTES, ctx.stream.ptr)
        a.epoch = first_epoch - 1  # runners raise it before each call
        a.counts[:] = 0
    # no peer may flag into our arena before it is zeroed: a collective orders that
    one = cupy.ones(1, dtype=cupy.float32)
    ctx.comm.all_reduce(int(one.data.ptr), int(one.data.ptr), 1, "fp32", ctx.stream.ptr)
    ctx.stream.synchronize()
    if ctx.nvshmem is not None and "nvshmem" in backends:
        ctx.nvshmem.barrier_all()
    return {b: arenas[b] for b in backends}


class SideStreamRunner:
    """``runner()`` performs one fused call of one variant on ``ctx.stream``."""

    def __init__(self, ctx, wl: Workload, d: Directives, cubin: str, arena: Arena,
                 inputs: Buffers, out):
        import cupy
        self.ctx, self.wl, self.d, self.arena = ctx, wl, d, arena
        self.plan = ChunkPlan.for_problem(wl.pattern_problem, d)
        self.pattern = wl.pattern_name
        #: > 0 during correctness runs: the compute stream sleeps this long before
        #: each chunk's GEMM, so a consumer that reads a chunk before its flag says
        #: so meets NaN poison every time instead of stale data some of the time.
        self.stress_us = 0.0
        self.layout = ArenaLayout.for_workload(wl)
        self.comm = ctx.function(cubin, "comm_kernel")
        self.signal = ctx.function(cubin, "signal_chunk")
        self.wait = ctx.function(cubin, "wait_chunk")
        streams = ctx.scratch.setdefault("side_streams", {})
        if "comm" not in streams:
            streams["comm"] = cupy.cuda.Stream(non_blocking=True)
        self.comm_stream = streams["comm"]
        self.inputs, self.out = inputs, out
        # where the result lands: the all-reduced output stays in the arena (every rank's O)
        if self.pattern == "gemm_allreduce":
            rows, cols = wl.output_shape()
            self.output = _arena_view(arena, self.layout.data["o"], rows * cols, wl.dtype)
        else:
            self.output = out
        self.start, self.done = cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True)
        self._warm_gemm()

    def _warm_gemm(self) -> None:
        """Run the chunk-shaped GEMM, the epilogue and the stress spin once alone, so
        no first launch (module loading, which waits for running kernels; library
        heuristics) ever happens while the communication kernel spins."""
        wl, plan = self.wl, self.plan
        m, n, k = wl.local_gemm()
        esz = plan.dtype_bytes
        x, w = int(self.inputs["x"].data.ptr), int(self.inputs["w"].data.ptr)
        dst = self.arena.ptr + self.layout.data["p"] if "p" in self.layout.data else int(self.out.data.ptr)
        gemm(x, w, dst, plan.rows, n, k, wl.dtype, self.ctx.stream)
        wl.chunk_epilogue(self.ctx, self.inputs, dst, 0, plan.rows, self.ctx.stream)
        spin(self.ctx.stream, 0.0)
        self.ctx.stream.synchronize()

    def __call__(self) -> None:
        ctx, a, wl, plan, lay = self.ctx, self.arena, self.wl, self.plan, self.layout
        s, cs = ctx.stream, self.comm_stream
        a.epoch += 1
        e = np.uint64(a.epoch)
        base = a.ptr
        u64 = np.uint64
        self.start.record(s)
        cs.wait_event(self.start)
        grid, block = (self.d.comm_ctas,), (THREADS,)
        esz = plan.dtype_bytes
        x, w = int(self.inputs["x"].data.ptr), int(self.inputs["w"].data.ptr)
        m, n, k = wl.local_gemm()
        if self.pattern in ("gemm_allreduce", "gemm_reducescatter"):
            # the reduced result goes to the arena's O (all-reduce) or this rank's `out`
            dest = u64(lay.data["o"]) if self.pattern == "gemm_allreduce" else self.out
            self.comm(grid, block, (*a.args(ctx), u64(lay.data["p"]), dest, u64(lay.flags),
                                    u64(lay.bar), e), stream=cs)
            for j, _, row in plan.order():
                if self.stress_us:
                    spin(s, self.stress_us)
                dst = base + lay.data["p"] + row * n * esz
                gemm(x + row * k * esz, w, dst, plan.rows, n, k, wl.dtype, s)
                wl.chunk_epilogue(ctx, self.inputs, dst, row, plan.rows, s)
                self.signal((1,), (1,), (*a.args(ctx), u64(lay.flags), np.int32(j), e), stream=s)
        else:  # allgather_gemm: own shard first from X itself, then peers' as they arrive
            self.comm(grid, block, (*a.args(ctx), self.inputs["x"], u64(lay.data["xf"]),
                                    u64(lay.flags), u64(lay.bar), e), stream=cs)
            a.counts[: plan.chunks_per_block] += self.d.comm_ctas
            me, W = ctx.rank, ctx.world_size
            o = int(self.out.data.ptr)
            for step in range(W):
                src = (me + step) % W
                for c in range(plan.chunks_per_block):
                    row = src * plan.block_rows + c * plan.rows
                    if self.stress_us:
                        spin(s, self.stress_us)
                    if src == me:
                        a_ptr = x + c * plan.rows * k * esz
                    else:
                        self.wait((1,), (1,), (*a.args(ctx), u64(lay.flags), np.int32(src),
                                               np.int32(c), u64(int(a.counts[c]))), stream=s)
                        a_ptr = base + lay.data["xf"] + row * k * esz
                    gemm(a_ptr, w, o + row * n * esz, plan.rows, n, k, wl.dtype, s)
                    wl.chunk_epilogue(ctx, self.inputs, o + row * n * esz, row, plan.rows, s)
        self.done.record(cs)
        s.wait_event(self.done)


def _arena_view(arena: Arena, offset: int, n: int, dtype: str):
    import cupy
    from cuco.runtime import dtypes
    nbytes = n * dtypes.ITEMSIZE[dtype]
    mem = cupy.cuda.UnownedMemory(arena.ptr + offset, nbytes, arena)
    return cupy.ndarray((n,), dtype=dtypes.STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0))


def poison_arena(arena: Arena, layout: ArenaLayout, poison, dtype: str, stream) -> None:
    """``poison`` (a :class:`cuco.runtime.dtypes.Poison`) over every data region of the
    arena (partials, gathered inputs, outputs): a candidate that reads a region before
    its producer wrote it this call reads poison, never a value left by an earlier call."""
    from cuco.runtime import dtypes
    esz = dtypes.ITEMSIZE[dtype]
    for (name, off), end in zip(sorted(layout.data.items(), key=lambda kv: kv[1]), layout.guards):
        with stream:
            poison.apply(_arena_view(arena, off, (end - off) // esz, dtype))


def guards_intact(arena: Arena, layout: ArenaLayout) -> bool:
    """Whether every guard page of the arena still holds the canary."""
    import cupy
    for g in layout.guards:
        mem = cupy.cuda.UnownedMemory(arena.ptr + g, GUARD_BYTES, arena)
        page = cupy.ndarray((GUARD_BYTES,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
        if bool((page != CANARY).any()):
            return False
    return True
