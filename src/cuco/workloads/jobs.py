"""The job that checks and times fused variants of a workload on every rank.

Each rank draws its inputs from the seed, computes the fp32 reference (fp32
GEMM + fp32 NCCL collective), poisons the output with NaN before every
correctness run and compares every element; then it times the host-driven
program, the GEMM alone, the collective alone and every variant interleaved in
one loop. The parent merges ranks (max time, worst error).

Inputs and reference of a seed are kept in the worker across jobs (a search
checks many candidates on the same seeds), with a fingerprint of the inputs: a
candidate that writes to its inputs is wrong, and the entry is dropped.
During correctness runs the arena's data regions are poisoned too and the
compute stream sleeps before each chunk, so a candidate that reads a chunk
before its flag says so fails every time, not some of the time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from cuco.design import Directives
from cuco.runtime import dtypes
from cuco.runtime.checking import compare
from cuco.runtime.timing import median, time_interleaved
from cuco.workloads.base import get
from cuco.workloads.side_stream import (
    CANARY, GUARD_BYTES, ArenaLayout, SideStreamRunner, guards_intact, poison_arena, prepare_arenas,
)

BASELINES = ("host_nccl", "gemm_only", "comm_only")
#: Microseconds the compute stream sleeps before each chunk in correctness runs.
STRESS_US = 20.0
#: Seeds whose inputs and reference a worker keeps.
CACHED_SEEDS = 6


def _fingerprint(inputs) -> tuple:
    import cupy
    return tuple(int(cupy.sum(v.view(cupy.uint8), dtype=cupy.uint64)) for _, v in sorted(inputs.items()))


def _class_key(cls: type) -> str:
    """Same class (or the same code of a notebook class) -> same key."""
    import cloudpickle
    return hashlib.sha1(cloudpickle.dumps(cls)).hexdigest()


def inputs_and_reference(ctx, wl, cls: type, seed: int):
    """``(inputs, fp32 reference, fingerprint)`` of ``seed``, made once per worker."""
    cache = ctx.scratch.setdefault("references", {})
    key = (_class_key(cls), wl.label, ctx.world_size, seed)
    hit = cache.pop(key, None)
    if hit is None:
        inputs = wl.make_inputs(ctx, seed)
        ref = wl.reference(ctx, inputs)
        hit = (inputs, ref, _fingerprint(inputs))
        while len(cache) >= CACHED_SEEDS:
            cache.pop(next(iter(cache)))
    cache[key] = hit  # most recent last
    return hit


def guarded_output(n: int, dtype: str):
    """``(out, guards)``: an output of ``n`` elements between two guard pages that hold
    a canary; a candidate that writes past its output changes a guard."""
    import cupy
    g = GUARD_BYTES // dtypes.ITEMSIZE[dtype]
    padded = dtypes.empty(n + 2 * g, dtype)
    guard_bytes = padded.view(cupy.uint8)
    outer = (guard_bytes[:GUARD_BYTES], guard_bytes[-GUARD_BYTES:])
    for part in outer:
        part.fill(CANARY)
    return padded[g:g + n], outer


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
    #: A user workload class (sent with the job); None: the registry's ``family``.
    workload_cls: type | None = None
    stress_us: float = STRESS_US

    def __call__(self, ctx) -> dict[str, Any]:
        import cupy

        cls = self.workload_cls or get(self.family)
        wl = cls(self.m, self.n, self.k, ctx.world_size, self.dtype)
        s = ctx.stream
        rtol, atol_f = wl.tolerance()
        with s:
            inputs, ref, fingerprint = inputs_and_reference(ctx, wl, cls, self.seed)
            atol = atol_f * float(abs(ref).max())
            rows, cols = wl.output_shape()
            out, outer = guarded_output(rows * cols, self.dtype)
            directives = {v.name: Directives.from_json(v.directives) for v in self.variants}
            arenas = prepare_arenas(ctx, ArenaLayout.for_workload(wl), {d.backend.value for d in directives.values()}) \
                if self.variants else {}
            runs = {"host_nccl": wl.host_sequence(ctx, inputs, out)}
            targets = {"host_nccl": out}
            arena_of, runners = {}, {}
            layout = ArenaLayout.for_workload(wl)
            for v in self.variants:
                d = directives[v.name]
                runner = SideStreamRunner(ctx, wl, d, v.cubin, arenas[d.backend.value], inputs, out)
                runs[v.name], targets[v.name] = runner, runner.output
                arena_of[v.name], runners[v.name] = arenas[d.backend.value], runner
        result: dict[str, Any] = {"rank": ctx.rank, "variants": {}}
        for name, fn in runs.items():
            rec: dict[str, Any] = {}
            if self.check:
                with s:
                    dtypes.poison(targets[name], self.dtype)
                    if name in runners:
                        poison_arena(arena_of[name], layout, self.dtype, s)
                        runners[name].stress_us = self.stress_us
                    fn()
                    if name in runners:
                        runners[name].stress_us = 0.0
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
        s.synchronize()
        if _fingerprint(inputs) != fingerprint:  # someone wrote to the inputs: nobody passes
            ctx.scratch["references"].clear()
            for name in runs:
                rec = result["variants"].setdefault(name, {})
                rec["correct"], rec["inputs_intact"] = False, False
        return result
