"""The job that checks and times fused variants of a workload on every rank.

Each rank draws its inputs from the seed, computes the fp32 reference (fp32
GEMM + fp32 NCCL collective), poisons the output with NaN before every
correctness run and compares every element; then it times the host-driven
program, the GEMM alone, the collective alone and every variant interleaved in
one loop. The parent merges ranks (max time, worst error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cuco.design import Directives
from cuco.runtime import dtypes
from cuco.runtime.checking import compare
from cuco.runtime.timing import median, time_interleaved
from cuco.workloads.base import get
from cuco.workloads.side_stream import (
    CANARY, GUARD_BYTES, ArenaLayout, SideStreamRunner, guards_intact, prepare_arenas,
)

BASELINES = ("host_nccl", "gemm_only", "comm_only")


@dataclass
class VariantSpec:
    """A compiled candidate: its name, directives (JSON) and cubin path."""

    name: str
    directives: str
    cubin: str


@dataclass
class WorkloadCase:
    family: str
    m: int
    n: int
    k: int
    dtype: str = "bf16"
    variants: list[VariantSpec] = field(default_factory=list)
    seed: int = 1
    check: bool = True
    time: bool = True
    warmup: int = 5
    iters: int = 30

    def __call__(self, ctx) -> dict[str, Any]:
        import cupy

        wl = get(self.family)(self.m, self.n, self.k, ctx.world_size, self.dtype)
        s = ctx.stream
        rtol, atol_f = wl.tolerance()
        with s:
            inputs = wl.make_inputs(ctx, self.seed)
            ref = wl.reference(ctx, inputs)
            atol = atol_f * float(abs(ref).max())
            rows, cols = wl.output_shape()
            # the output sits between two guard pages filled with a canary
            g = GUARD_BYTES // dtypes.ITEMSIZE[self.dtype]
            padded = dtypes.empty(rows * cols + 2 * g, self.dtype)
            out = padded[g:g + rows * cols]
            guard_bytes = padded.view(cupy.uint8)
            outer = (guard_bytes[:GUARD_BYTES], guard_bytes[-GUARD_BYTES:])
            for part in outer:
                part.fill(CANARY)
            directives = {v.name: Directives.from_json(v.directives) for v in self.variants}
            arenas = prepare_arenas(ctx, wl, {d.backend.value for d in directives.values()}) \
                if self.variants else {}
            runs = {"host_nccl": wl.host_sequence(ctx, inputs, out)}
            targets = {"host_nccl": out}
            arena_of = {}
            layout = ArenaLayout.for_workload(wl)
            for v in self.variants:
                d = directives[v.name]
                runner = SideStreamRunner(ctx, wl, d, v.cubin, arenas[d.backend.value], inputs, out)
                runs[v.name], targets[v.name] = runner, runner.output
                arena_of[v.name] = arenas[d.backend.value]
        result: dict[str, Any] = {"rank": ctx.rank, "variants": {}}
        for name, fn in runs.items():
            rec: dict[str, Any] = {}
            if self.check:
                with s:
                    dtypes.poison(targets[name], self.dtype)
                    fn()
                    rec.update(compare(targets[name], ref, self.dtype, rtol, atol))
                    intact = all(bool((part == CANARY).all()) for part in outer)
                    if name in arena_of:
                        intact = intact and guards_intact(arena_of[name], layout)
                    rec["guards_intact"] = intact
                    if not intact:
                        rec["correct"] = False
                s.synchronize()
            result["variants"][name] = rec
        if self.time:
            with s:
                fns = dict(runs)
                fns["gemm_only"] = wl.gemm_only(ctx, inputs)
                fns["comm_only"] = wl.comm_only(ctx, inputs)
                tick = cupy.zeros(1, dtype=cupy.float32)
                p = int(tick.data.ptr)
            samples = time_interleaved(fns, s, warmup=self.warmup, iters=self.iters,
                                       align=lambda: ctx.comm.all_reduce(p, p, 1, "fp32", s.ptr))
            for name, ms in samples.items():
                result["variants"].setdefault(name, {})["median_ms"] = median(ms)
        return result
