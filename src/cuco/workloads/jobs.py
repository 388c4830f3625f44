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
from cuco.workloads.in_kernel import runner_class
from cuco.workloads.side_stream import (
    CANARY, GUARD_BYTES, ArenaLayout, guards_intact, poison_arena, prepare_arenas,
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


def judge(ctx, job, runs: dict, targets: dict, runners: dict, layout, outer, check_fn, dtype: str,
          timed: dict, inputs, fingerprint) -> dict[str, Any]:
    """Check (``job.check``) and time (``job.time``) every program of a job on this rank.

    ``runs``/``targets``: each program and where its output lands; ``runners``: the
    fused variants among them, ``{name: (runner, arena)}`` (their arena data is poisoned
    and their compute stream stalled by ``job.stress_us`` while checked); ``outer``: the
    guard pages around the host program's output; ``check_fn(output)`` compares every
    element; ``timed``: makers of the extra programs timed beside them (the halves of
    the bound). A change of the inputs' fingerprint fails every program.
    """
    import cupy
    s = ctx.stream
    result: dict[str, Any] = {"rank": ctx.rank, "variants": {}}
    for name, fn in runs.items():
        rec: dict[str, Any] = {}
        if job.check:
            runner, arena = runners.get(name, (None, None))
            with s:
                dtypes.poison(targets[name], dtype)
                if runner is not None:
                    poison_arena(arena, layout, dtype, s)
                    runner.stress_us = job.stress_us
                fn()
                if runner is not None:
                    runner.stress_us = 0.0
                rec.update(check_fn(targets[name]))
                intact = all(bool((part == CANARY).all()) for part in outer)
                if runner is not None:
                    intact = intact and guards_intact(arena, layout)
                rec["guards_intact"] = intact
                if not intact:
                    rec["correct"] = False
            s.synchronize()
        result["variants"][name] = rec
    if job.time:
        with s:
            fns = dict(runs)
            fns.update({k: make() for k, make in timed.items()})
            tick = cupy.zeros(1, dtype=cupy.float32)
            p = int(tick.data.ptr)
        samples = time_interleaved(fns, s, warmup=job.warmup, iters=job.iters,
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
                runner = runner_class(d)(ctx, wl, d, v.cubin, arenas[d.backend.value], inputs, out)
                runs[v.name], targets[v.name] = runner, runner.output
                arena_of[v.name], runners[v.name] = arenas[d.backend.value], runner
        timed = {"gemm_only": lambda: wl.gemm_only(ctx, inputs),
                 "comm_only": lambda: wl.comm_only(ctx, inputs)}
        runners_on = {n: (r, arena_of[n]) for n, r in runners.items()}
        return judge(ctx, self, runs, targets, runners_on, layout, outer,
                     lambda got: compare(got, ref, self.dtype, rtol, atol), self.dtype, timed,
                     inputs, fingerprint)
