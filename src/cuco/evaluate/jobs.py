"""The job that verifies and times fused variants of a workload on every rank.

Each rank draws :data:`~cuco.evaluate.schedule.N_SETS` input sets from each of the job's seeds
(different buffers, different values) and their fp32 references (fp32 GEMM + fp32
NCCL collective). One schedule (:mod:`cuco.evaluate.schedule`) orders every call of
every program; *every* call is verified against its input set's reference: checked
calls (outputs and the arena's data poisoned with a pattern drawn per call, the call
stressed from outside the kernel, guard pages checked) in full on the host, all others
by a count of the elements out of tolerance on the device, after the call's closing
event. Timing jobs place the checked calls at random among the timed ones; the epoch a
job starts from is random. So a kernel cannot tell a checked call from a timed one, and
one that reuses a stale result or skips work when timed is wrong. The parent merges
ranks (max time, worst error).

Inputs and reference of a seed are kept in the worker across jobs (a search checks
many candidates on the same seeds), with a fingerprint of the inputs: a candidate that
writes to its inputs is wrong, and the entry is dropped.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuco.design import Directives
from cuco.runtime.arena import CANARY, GUARD_BYTES, guards_intact, poison_arena, prepare_arenas
from cuco.runtime.checking import compare, fingerprint, rel_l2
from cuco.runtime.peaks import MeasurePeaks, physical_floor_ms
from cuco.runtime.sealed import SealedReference, scrubbed_allocations
from cuco.runtime.timing import median, spin
from cuco.workloads.base import EPS, Buffers, Workload
from cuco.evaluate.schedule import N_SETS, Call, make_schedule, set_seed
from cuco.runtime import dtypes

#: Microseconds the compute stream sleeps before each chunk in checked calls.
STRESS_US = 20.0
#: Seeds whose inputs and reference a worker keeps (three jobs of N_SETS sets, and more).
CACHED_SEEDS = 4 * N_SETS
#: Iterations of each verified program checked (stressed, compared on the host) in a timing job.
N_CHECKED = 4
#: A program whose relative L2 error exceeds this multiple of the host program's (in the
#: same job, on the same inputs) is wrong: a kernel that compresses what it sends can stay
#: inside the element-wise tolerance while moving fewer bytes than the workload asks.
ACCURACY_SLACK = 2.0


def fresh_seed() -> int:
    """A job's schedule seed (order, checked positions, poison, stress, first epoch)."""
    import secrets
    return secrets.randbits(48)


def first_epoch(schedule_seed: int) -> int:
    """The epoch a job's first call carries: random per job, the same on every rank."""
    return 1 + random.Random(schedule_seed ^ 0x5EED).randrange(1 << 40)


def _fingerprint(inputs) -> tuple:
    return tuple(fingerprint(v) for _, v in sorted(inputs.items()))


def _class_key(cls: type) -> str:
    """Same class (or the same code of a notebook class) -> same key."""
    import cloudpickle
    return hashlib.sha1(cloudpickle.dumps(cls)).hexdigest()


def inputs_and_reference(ctx, wl, cls: type, seed: int):
    """``(inputs, sealed fp32 reference, fingerprints of both)`` of ``seed``, made once per
    worker. The reference is sealed (:class:`~cuco.runtime.sealed.SealedReference`) and its
    temporaries scrubbed, so no kernel finds the answer in device memory."""
    cache = ctx.scratch.setdefault("references", {})
    key = (_class_key(cls), wl.label, ctx.world_size, seed)
    hit = cache.pop(key, None)
    if hit is None:
        with scrubbed_allocations():
            inputs = wl.make_inputs(ctx, seed)
            ref = SealedReference.seal(_fp32(wl.reference(ctx, inputs)))
        hit = (inputs, ref, _fingerprint(inputs), _fingerprint({"ref": ref.bits}))
        while len(cache) >= CACHED_SEEDS:
            cache.pop(next(iter(cache)))
    cache[key] = hit  # most recent last
    return hit


def _fp32(ref):
    """A workload's reference as one C-contiguous fp32 array (a copy only where it is not)."""
    import cupy
    if ref.dtype == cupy.float32 and ref.flags.c_contiguous:
        return ref
    return cupy.ascontiguousarray(ref, dtype=cupy.float32)


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
class InputSet:
    """One of a job's input sets on this rank: inputs, sealed fp32 reference, fingerprint
    and the absolute tolerance (``atol_factor * max|ref|``)."""

    inputs: Buffers
    ref: SealedReference
    fingerprint: tuple
    atol: float
    ref_fingerprint: tuple


def input_sets(ctx, wl, cls: type, seed: int, atol_factor: float) -> list[InputSet]:
    """The job's :data:`~cuco.evaluate.schedule.N_SETS` input sets, each with its own seed
    and buffers (cached per worker like any seed)."""
    out = []
    for j in range(N_SETS):
        inputs, ref, fp, ref_fp = inputs_and_reference(ctx, wl, cls, set_seed(seed, j))
        out.append(InputSet(inputs, ref, fp, atol_factor * ref.amax, ref_fp))
    return out


@dataclass
class Program:
    """A program a job verifies: one callable per input set and where each lands.

    A fused variant has one output buffer for all sets (``outputs`` repeats it), its
    runners (one per set, whose ``stress_us`` checked calls raise) and its arena; a
    program's ``shares`` name the buffers it shares with other programs (the arena).
    """

    calls: list[Callable[[], None]]
    outputs: list[Any]
    guards: tuple = ()
    runners: list[Any] = field(default_factory=list)
    arena: Any = None
    shares: tuple[str, ...] = ()
    #: per set, run after the call's closing event and before its check (a peer's result
    #: into its checked output: never timed)
    settle: list[Callable[[], None]] = field(default_factory=list)
    #: poison the output again as soon as it is verified: a host program's (or a peer
    #: library's) output is a right answer, which a candidate reading memory it was not
    #: given must not find lying there between calls
    scrub: bool = False


def host_program(make: Callable[[Buffers, Any], Callable[[], None]], sets: list[InputSet], elems: int,
                 dtype: str) -> Program:
    """A host-driven program, one callable per input set, each writing the guarded output
    it is given, or the buffer its callable names as ``output`` (e.g. a registered NCCL
    window the result lands in)."""
    out, outer = guarded_output(elems, dtype)
    calls = [make(st.inputs, out) for st in sets]
    outputs = [getattr(c, "output", out) for c in calls]
    return Program(calls, outputs, outer if all(o is out for o in outputs) else (), scrub=True)


def peer_programs(wl: Workload, ctx, sets: list[InputSet], elems: int) -> dict[str, Program]:
    """Other libraries' fused ops of ``wl`` (:meth:`Workload.peers`), one program each, all
    writing one guarded output (checked right after each call, so they can share it)."""
    out, outer = guarded_output(elems, wl.dtype)
    per_set = [wl.peers(ctx, st.inputs, out) for st in sets]
    return {name: Program([p[name].call for p in per_set], [out] * len(sets), outer,
                          settle=[p[name].settle for p in per_set], scrub=True) for name in per_set[0]}


def variant_program(make: Callable[[Buffers, Any], Any], arena, sets: list[InputSet], elems: int,
                    dtype: str) -> Program:
    """A fused variant: ``make(inputs, out)`` builds its runner for one input set; every
    runner writes the same output (a guarded buffer of its own, or the arena's), so what
    one set's call left there is wrong for the next call's set."""
    out, outer = guarded_output(elems, dtype)
    runners = [make(st.inputs, out) for st in sets]
    own = runners[0].output is out
    return Program(runners, [r.output for r in runners], outer if own else (), runners, arena,
                   (f"arena:{arena.backend}",))


def load_check_kernels(ctx, dtype: str, hog_stream) -> None:
    """Run every kernel the schedule's checks launch (poison of both kinds, the host-side
    comparison, the device count, the guard reads, the stress) once on a few elements, while
    nothing else runs. CUDA loads a module when its first kernel is launched, and a module
    load waits for the device's running kernels: loaded in the middle of a schedule, beside
    a fused call whose communication kernel waits on work queued behind it, it never
    returned (the MoE pipeline on 2 x H200 hung in the first device count)."""
    import random

    import cupy
    from cuco.runtime.checking import count_bad_async
    from cuco.runtime.dtypes import Poison
    from cuco.runtime.stress import Stress
    s = ctx.stream
    with s:
        got = dtypes.empty(256, dtype)
        ref = cupy.zeros(256, dtype=cupy.float32)
        rng, kinds = random.Random(0), {}
        while len(kinds) < 2:  # a NaN pattern and random bytes
            poison = Poison.draw(rng, dtype)
            kinds.setdefault(poison.kind, poison)
        for poison in kinds.values():
            poison.apply(got)
        compare(got, ref, dtype, 1e-3, 1e-3)
        count_bad_async(got, ref, dtype, 1e-3, 1e-3, cupy.zeros(1, dtype=cupy.uint64), s)
        page = cupy.full(GUARD_BYTES, CANARY, dtype=cupy.uint8)
        (page == CANARY).all().get()  # the guard reads
        (page != CANARY).any().get()
        stress = Stress(skew_rank=ctx.rank, skew_us=1.0, hog_sms=1, hog_us=1.0)
        stress.before(ctx, s, hog_stream)
        stress.after(s, hog_stream)
        spin(s, 0.0)
    s.synchronize()
    hog_stream.synchronize()


def first_launches_alone(ctx, calls: list[Callable[[], None]]) -> None:
    """Each call once, the ranks together, the device idle before and after it. A timing
    schedule does not wait between calls, and a program's first launch of a kernel loads
    its module, which waits for the running kernels: beside a fused call whose
    communication kernel waits on work queued behind the load, it never returns (the MoE
    pipeline's compute half, first launching its SwiGLU kernel, on 2 x H200). A check-only
    schedule needs none of this: it waits after every call."""
    import cupy
    tick = cupy.ones(1, dtype=cupy.float32)
    p = int(tick.data.ptr)
    for call in calls:
        ctx.comm.all_reduce(p, p, 1, "fp32", ctx.stream.ptr)
        call()
        ctx.stream.synchronize()


def _failure(call: Call, bad: int, rank: int) -> dict[str, Any]:
    return {"iteration": call.iteration, "input_set": call.input_set, "checked": call.checked,
            "bad_elements": int(bad), "rank": rank}


def judge(ctx, job, programs: dict[str, Program], extras: dict[str, Callable[[], Callable[[], None]]],
          sets: list[InputSet], rtol: float, dtype: str, layout, floor_ms: float = 0.0) -> dict[str, Any]:
    """Verify and time every program of a job on this rank, in the order of one schedule.

    Every call of every program is verified against the fp32 reference of its input
    set: checked calls (outputs and arena poisoned with a pattern drawn per call, the
    call stressed from outside, guards checked) by a full comparison on the host, all
    other calls by a count of the elements out of tolerance on the device, enqueued
    after the call's closing event so it costs no measured time. ``extras`` (makers of
    the halves of the bound) are only timed. A change of any input set's fingerprint
    fails every program. A program's first failing call is reported (iteration, input
    set, checked or timed, elements that differ). ``floor_ms``: the physical floor of one
    call (:func:`cuco.runtime.peaks.physical_floor_ms`), reported with every program.
    """
    import cupy
    from cuco.runtime.checking import count_bad_async
    s = ctx.stream
    if "hog_stream" not in ctx.scratch:
        ctx.scratch["hog_stream"] = cupy.cuda.Stream(non_blocking=True)
    hog_stream = ctx.scratch["hog_stream"]
    loaded = ctx.scratch.setdefault("check_kernels_loaded", set())
    if dtype not in loaded:
        load_check_kernels(ctx, dtype, hog_stream)
        loaded.add(dtype)
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    with s:  # their buffers are made on the job's stream, ordered with every call
        fns = {name: make() for name, make in extras.items()} if job.time else {}
        if job.time:
            first_launches_alone(ctx, [p.calls[0] for p in programs.values()] + list(fns.values()))
    schedule = make_schedule({n: p.shares for n, p in programs.items()}, list(fns),
                             seed=job.schedule_seed, check_only=not job.time, warmup=job.warmup,
                             iters=job.iters, n_checked=job.n_checked, world_size=ctx.world_size,
                             sms=sms, dtype=dtype, n_sets=len(sets))
    recs: dict[str, dict[str, Any]] = {
        n: {"correct": True, "bad_elements": 0, "rel_l2_error": 0.0, "checked_l2": 0.0, "guards_intact": True,
            "calls_verified": 0, "calls_checked": 0, "floor_ms": floor_ms} for n in programs}
    marks: dict[str, list[tuple]] = {n: [] for n in [*programs, *fns]}
    verify_marks: list[tuple] = []
    failures: dict[str, list[tuple[int, Call, int]]] = {}  # program -> (schedule index, call, bad)
    check_s = 0.0
    with s:  # on the job's stream: zeroed before any count lands (the legacy stream is not ordered with it)
        counts = cupy.zeros(len(schedule), dtype=cupy.uint64)
        sums = cupy.zeros((len(schedule), 2), dtype=cupy.float64)  # each call's L2 sums
        tick = cupy.zeros(1, dtype=cupy.float32)
        p = int(tick.data.ptr)
        for idx, call in enumerate(schedule):
            prog = programs.get(call.program)
            if prog is not None:  # nothing a call finds in its buffers is left from another
                call.poison.apply(prog.outputs[call.input_set])
                if prog.arena is not None:
                    poison_arena(prog.arena, layout, call.poison, dtype, s)
            ctx.comm.all_reduce(p, p, 1, "fp32", s.ptr)  # every rank starts the call together
            if call.checked:
                t0 = time.perf_counter()
                out, st = prog.outputs[call.input_set], sets[call.input_set]
                runner = prog.runners[call.input_set] if prog.runners else None
                if runner is not None:
                    runner.stress_us = job.stress_us
                call.stress.before(ctx, s, hog_stream)
                prog.calls[call.input_set]()
                call.stress.after(s, hog_stream)
                if prog.settle:
                    prog.settle[call.input_set]()
                if runner is not None:
                    runner.stress_us = 0.0
                got = compare(out, st.ref, dtype, rtol, st.atol)
                intact = all(bool((g == CANARY).all()) for g in prog.guards)
                if prog.arena is not None:
                    intact = intact and guards_intact(prog.arena, layout)
                rec = recs[call.program]
                rec["calls_checked"] += 1
                rec["calls_verified"] += 1
                rec["rel_l2_error"] = max(rec["rel_l2_error"], got["rel_l2_error"])
                # compared on the host: no device memory a candidate could write went into it
                rec["checked_l2"] = max(rec["checked_l2"], got["rel_l2_error"])
                rec["guards_intact"] = rec["guards_intact"] and intact
                if not (got["correct"] and intact):
                    failures.setdefault(call.program, []).append((idx, call, got["bad_elements"]))
                if prog.scrub:
                    call.poison.apply(out)
                s.synchronize()
                check_s += time.perf_counter() - t0
                continue
            fn = prog.calls[call.input_set] if prog is not None else fns[call.program]
            runner = prog.runners[call.input_set] if prog is not None and prog.runners else None
            spin(s, job.busy_us)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            if call.stress is not None:  # stressed as a checked call is, verified as a timed one
                if runner is not None:
                    runner.stress_us = job.stress_us
                call.stress.before(ctx, s, hog_stream)
            start.record(s)
            fn()
            end.record(s)
            if call.stress is not None:
                call.stress.after(s, hog_stream)
                if runner is not None:
                    runner.stress_us = 0.0
            if call.timed:
                marks[call.program].append((start, end))
            if prog is not None:
                st = sets[call.input_set]
                v0, v1 = cupy.cuda.Event(), cupy.cuda.Event()
                v0.record(s)
                if prog.settle:
                    prog.settle[call.input_set]()
                count_bad_async(prog.outputs[call.input_set], st.ref, dtype, rtol, st.atol,
                                counts[idx:idx + 1], s, stats=sums[idx])
                if prog.scrub:
                    call.poison.apply(prog.outputs[call.input_set])
                v1.record(s)
                verify_marks.append((v0, v1))
        s.synchronize()
    bad, l2 = counts.get(), sums.get()
    for idx, call in enumerate(schedule):
        if call.checked or call.program not in programs:
            continue
        rec = recs[call.program]
        rec["calls_verified"] += 1
        # the accuracy rule below holds for every call, not only the checked ones: a kernel
        # lossy on some calls only (within the element-wise tolerance) meets it anyway
        rec["rel_l2_error"] = max(rec["rel_l2_error"], rel_l2(*l2[idx].tolist()))
        if bad[idx]:
            failures.setdefault(call.program, []).append((idx, call, int(bad[idx])))
    for name, failed in failures.items():  # the first failing call in the schedule's order
        idx, call, n_bad = min(failed, key=lambda f: f[0])
        recs[name].update(correct=False, bad_elements=n_bad, failed_call=_failure(call, n_bad, ctx.rank))
    result: dict[str, Any] = {"rank": ctx.rank, "variants": recs}
    for name, ms in marks.items():
        if ms:
            result["variants"].setdefault(name, {})["median_ms"] = median(
                [cupy.cuda.get_elapsed_time(a, b) for a, b in ms])
    result["verify_s"] = check_s + sum(cupy.cuda.get_elapsed_time(a, b) for a, b in verify_marks) / 1e3
    host = recs.get("host_nccl")
    if host is not None and host["correct"]:  # no less accurate than the host program
        # the host program's error from its host-compared calls only: the device sums of the
        # other calls sit in memory a candidate's kernel could find and inflate, which would
        # raise the limit its own lossy calls must meet
        host_l2 = host["checked_l2"] if host["calls_checked"] else host["rel_l2_error"]
        limit = ACCURACY_SLACK * max(host_l2, EPS[dtype] / 4)
        for name in programs:
            rec = recs[name]
            if rec["correct"] and rec["rel_l2_error"] > limit:
                rec["correct"], rec["less_accurate_than_host"] = False, host_l2
    if any(_fingerprint(st.inputs) != st.fingerprint or _fingerprint({"ref": st.ref.bits}) != st.ref_fingerprint
           for st in sets):  # inputs or references written: nobody passes
        ctx.scratch["references"].clear()
        for name in programs:
            recs[name]["correct"], recs[name]["inputs_intact"] = False, False
    return result


@dataclass
class VariantSpec:
    """A compiled candidate: its name, directives (JSON) and cubin path."""

    name: str
    directives: str
    cubin: str


@dataclass
class Case:
    """The job that verifies and times fused variants of any workload on every rank
    (see :func:`judge`): the host-driven program (``host_nccl``: the strongest one the
    workload has), the workload's extra baselines and every variant are verified and
    timed in one schedule; the compute alone and the communication alone (the halves of
    the bound) are timed beside them. ``peers``: other libraries' fused ops (torch) join
    the schedule as programs, and their pieces alone (torch's GEMM) are timed; a missing
    one is named with the reason under ``host_nccl``'s ``notes["peers_skipped"]``."""

    workload: Workload
    variants: list[VariantSpec] = field(default_factory=list)
    #: the seed of the job's input sets, or several: :data:`N_SETS` sets each, all in one
    #: schedule (the evaluator's full-shape check of two fresh seeds is one job)
    seed: int | tuple[int, ...] = 1
    #: False: a check-only job (every program once per input set, every call checked)
    time: bool = True
    warmup: int = 5
    iters: int = 30
    n_checked: int = N_CHECKED
    busy_us: float = 40.0
    stress_us: float = STRESS_US
    schedule_seed: int = field(default_factory=fresh_seed)
    peers: bool = False
    #: the workload's other host programs (:meth:`Workload.baselines`) join the job; the
    #: evaluator's check-only stages leave them out (they matter where they are timed:
    #: the baseline is the fastest), keeping ``host_nccl``, the accuracy bar
    baselines: bool = True

    def __call__(self, ctx) -> dict[str, Any]:
        wl, s = self.workload, ctx.stream
        if wl.world_size != ctx.world_size:
            raise ValueError(f"{wl.label} is a problem for {wl.world_size} ranks; this worker "
                             f"group has {ctx.world_size}")
        rtol, atol_f = wl.tolerance()
        elems = wl.output_elems()
        with s:
            seeds = (self.seed,) if isinstance(self.seed, int) else tuple(self.seed)
            sets = [st for seed in seeds for st in input_sets(ctx, wl, type(wl), seed, atol_f)]
            directives = {v.name: Directives.from_json(v.directives) for v in self.variants}
            layout = wl.layout()
            arenas = prepare_arenas(ctx, layout, {d.backend.value for d in directives.values()},
                                    first_epoch(self.schedule_seed)) if self.variants else {}
            programs = {"host_nccl": host_program(lambda x, o: wl.host_sequence(ctx, x, o), sets,
                                                  elems, wl.dtype)}
            per_set = [wl.baselines(ctx, st.inputs) if self.baselines else {} for st in sets]
            for name in per_set[0]:
                programs[name] = Program([b[name][0] for b in per_set], [b[name][1] for b in per_set],
                                         scrub=True)  # the other host programs: right answers too
            gaps = wl.peer_gaps(ctx) if self.peers else {}
            if self.peers:
                programs.update(peer_programs(wl, ctx, sets, elems))
            for v in self.variants:
                d = directives[v.name]
                arena = arenas[d.backend.value]
                programs[v.name] = variant_program(
                    lambda x, o, d=d, v=v, a=arena: wl.runner(ctx, d, v.cubin, a, x, o),
                    arena, sets, elems, wl.dtype)
        extras = {"compute_only": lambda: wl.compute_only(ctx, sets[0].inputs),
                  "comm_only": lambda: wl.comm_only(ctx, sets[0].inputs)}
        if self.peers:
            extras.update({name: (lambda make=make: make(sets[0].inputs))
                           for name, make in wl.timed_alone(ctx).items()})
        work = wl.work()  # peaks are measured (once per worker) only where there is work to bound
        floor = physical_floor_ms(work, MeasurePeaks()(ctx)) if work is not None else 0.0
        result = judge(ctx, self, programs, extras, sets, rtol, wl.dtype, layout, floor)
        notes = wl.host_notes(ctx)
        if self.peers:
            notes["peers_skipped"] = gaps
        result["variants"]["host_nccl"]["notes"] = notes
        return result
