"""The verification of one job on one rank: every call of every program, in the order of
one schedule, verified; the timed ones timed. It judges every program cuco times: a
workload's (:class:`cuco.evaluate.jobs.Case`) and the collectives'
(:class:`cuco.evaluate.collective_job.CollectiveCase`).

Every call of every program is verified against the fp32 reference of its input set:
checked calls (outputs and arena poisoned with a pattern drawn per call, the call stressed
from outside, guards checked) by a full comparison on the host, all other calls by a count
of the elements out of tolerance on the device, enqueued after the call's closing event so
it costs no measured time. The halves of the bound are only timed. A change of any input
set's fingerprint, at the end of the job or before a trusted program's checked call (those
set the accuracy bar), fails every program. A program's first failing call is reported
(iteration, input set, checked or timed, elements that differ). The steps, in order:
:func:`judge` runs :meth:`Verification.run` (each call: :meth:`~Verification.poison`, the
ranks start together, then :meth:`~Verification.checked_call` or
:meth:`~Verification.timed_call`), then :meth:`~Verification.tally` (the device counts),
:meth:`~Verification.first_failures`, :meth:`~Verification.accuracy_rule` and
:meth:`~Verification.inputs_rule`, and returns a typed
:class:`~cuco.runtime.records.RankResult`. The comparisons themselves run where the job's
checker puts them (:mod:`cuco.evaluate.checkers`): in the rank's verifier process by default,
out of the candidate's reach, or in this worker (``inline``).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from cuco.evaluate.checkers import Checker, make_checker
from cuco.evaluate.programs import InputSet, Program, drop_references, fingerprint_of, ref_intact
from cuco.evaluate.schedule import Call, make_schedule
from cuco.evaluate.sync_watch import Blame, CallMade, SyncWatch, own_state_blames
from cuco.runtime import dtypes
from cuco.runtime.arena import CANARY, GUARD_BYTES, guards_intact, poison_arena, slack_written
from cuco.runtime.checking import compare, rel_l2
from cuco.runtime.records import OWN_SLACK, OWN_TAIL, OWN_ZEROED, FailedCall, ProgramRecord, RankResult
from cuco.runtime.timing import median, spin
from cuco.workloads.base import EPS, Workload, scratch_of

#: The iteration a program's first launch reports when it is wrong (it comes before every
#: call of the schedule: :meth:`Verification.first_launches`).
FIRST_LAUNCH = -1_000_000

#: CUCO_TRACE_CALLS=1: each rank names every call on stderr before making it (which call a
#: hung job was in)
TRACE_CALLS = os.environ.get("CUCO_TRACE_CALLS", "") not in ("", "0")

#: A program whose relative L2 error exceeds this multiple of the host program's (in the
#: same job, on the same inputs) is wrong: a kernel that compresses what it sends can stay
#: inside the element-wise tolerance while moving fewer bytes than the workload asks. The
#: default of :attr:`cuco.workloads.base.Workload.accuracy_slack`; a workload whose honest
#: variants are measured closer to the host program sets a tighter one.
ACCURACY_SLACK = Workload.accuracy_slack
#: The program every other is held to for accuracy (the strongest host program).
HOST = "host_nccl"


class ScheduledJob(Protocol):
    """What the verification reads of a job (a workload's :class:`~cuco.evaluate.jobs.Case`,
    a collective's :class:`~cuco.evaluate.collective_job.CollectiveCase`): how its schedule
    is drawn, and the stress and spin around its calls."""

    time: bool  # False: a check-only job
    #: the accuracy rule's multiple of the host program's L2 error (the workload's)
    accuracy_slack: float
    warmup: int
    iters: int
    n_checked: int
    busy_us: float
    stress_us: float
    schedule_seed: int


def job_schedule(job: ScheduledJob, shares: dict[str, tuple[str, ...]], extras: list[str], *,
                 world_size: int, sms: int, dtype: str, n_sets: int) -> list[Call]:
    """The order of a job's calls, drawn from its settings (:func:`make_schedule`): every
    program in ``shares`` verified, ``extras`` only timed."""
    return make_schedule(shares, extras, seed=job.schedule_seed, check_only=not job.time, warmup=job.warmup,
                         iters=job.iters, n_checked=job.n_checked, world_size=world_size, sms=sms,
                         dtype=dtype, n_sets=n_sets)


def load_check_kernels(ctx, dtype: str, hog_stream) -> None:
    """Run every kernel the schedule's checks launch (poison of both kinds, the host-side
    comparison, the device count, the guard reads, the stress) once on a few elements, while
    nothing else runs. CUDA loads a module when its first kernel is launched, and a module
    load waits for the device's running kernels: loaded in the middle of a schedule, beside
    a fused call whose communication kernel waits on work queued behind it, it never
    returned (the MoE pipeline on 2 x H200 hung in the first device count)."""
    import random

    import cupy
    from cuco.runtime.checking import count_bad_async, tag_tally_async
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
        slot, sums = cupy.zeros(1, dtype=cupy.uint64), cupy.zeros(2, dtype=cupy.float64)
        count_bad_async(got, ref, dtype, 1e-3, 1e-3, slot, s, stats=sums)
        slot.fill(0)  # the per-call zeroing before each count
        tag_tally_async(slot, sums, 0, 1, cupy.zeros(1, dtype=cupy.uint64), s)
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


def check_streams(ctx, dtype: str):
    """The stream the stress's hog kernel runs on, with every check kernel of ``dtype``
    loaded (once per worker)."""
    import cupy
    if "hog_stream" not in ctx.scratch:
        ctx.scratch["hog_stream"] = cupy.cuda.Stream(non_blocking=True)
    hog_stream = ctx.scratch["hog_stream"]
    loaded = ctx.scratch.setdefault("check_kernels_loaded", set())
    if dtype not in loaded:
        load_check_kernels(ctx, dtype, hog_stream)
        loaded.add(dtype)
    return hog_stream


def bound_halves(ctx, job: ScheduledJob, extras: dict[str, Callable[[], Callable[[], None]]]
                 ) -> dict[str, Callable[[], None]]:
    """A timing job's only-timed programs (the halves of the bound), made on the job's
    stream, each launched once alone (:func:`first_launches_alone`; the verified programs'
    first launches are :meth:`Verification.first_launches`)."""
    if not job.time:
        return {}
    with ctx.stream:  # their buffers are made on the job's stream, ordered with every call
        fns = {name: make() for name, make in extras.items()}
        first_launches_alone(ctx, list(fns.values()))
    return fns


def _words(arena, offset: int, nbytes: int):
    """``nbytes`` of ``arena`` from ``offset`` as 8-byte words (a CuPy view)."""
    import cupy
    mem = cupy.cuda.UnownedMemory(arena.ptr + offset, nbytes, arena)
    return cupy.ndarray((nbytes // 8,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _runner(prog: Program | None, call: Call):
    """The runner of ``call``'s input set (a fused variant's), or None."""
    return prog.runners[call.input_set] if prog is not None and prog.runners else None


def _runner_buffers(prog: Program, call: Call, kind: str) -> list:
    """The buffers the runner of ``call``'s input set names under ``kind``
    (``poisoned_each_call``, ``zero_after_each_call``; none where it has no such method)."""
    named = getattr(_runner(prog, call), kind, None)
    return list(named()) if named is not None else []


class Verification:
    """One job's schedule run on one rank, and what it found: a typed record per program.

    ``rtol`` and each set's ``atol``: the element-wise tolerance; ``layout``: the arena's
    (poisoned before each call of a variant that has one, its guards read after each
    checked call); ``floor_ms``: the physical floor of one call, reported with every program;
    ``checker``: who compares (:mod:`cuco.evaluate.checkers`; default: in the worker);
    ``watch``: a shared job's sync regions (:mod:`cuco.evaluate.sync_watch`), snapshotted
    each time the ranks start a call together, checked and timed calls alike.
    """

    def __init__(self, ctx, job: ScheduledJob, programs: dict[str, Program], sets: list[InputSet], rtol: float,
                 dtype: str, layout, floor_ms: float, hog_stream, checker: Checker | None = None,
                 watch: SyncWatch | None = None) -> None:
        self.ctx, self.job, self.programs, self.sets = ctx, job, programs, sets
        self.rtol, self.dtype, self.layout, self.hog_stream = rtol, dtype, layout, hog_stream
        self.records = {n: ProgramRecord(floor_ms=floor_ms) for n in programs}
        self.marks: dict[str, list[tuple[Any, Any]]] = {}  # program -> (start, end) of timed calls
        self.verify_marks: list[tuple[Any, Any]] = []  # around each device count
        self.failures: dict[str, list[tuple[int, Call, int]]] = {}  # program -> (index, call, bad)
        self.check_s = 0.0
        #: an input set found changed before a trusted program's checked call (see
        #: :meth:`checked_call`): the job's inputs rule then fails every program
        self.inputs_changed = False
        self.checker = checker if checker is not None else make_checker(ctx, None)
        self.begun = False
        self.watch = watch
        self.last_call: CallMade | None = None  # the call made since the last snapshot
        #: programs that changed a sync region not their own, at their first such call
        self.sync_blame: dict[str, Blame] = {}
        #: a program's first call after which it had left state between calls (its sync
        #: region's unused slots, its arena's tail, its runner's zeroed memory: :meth:`check_slack`),
        #: and per program the indices of its region's unused words (None: not named)
        self.slack_blame: dict[str, Blame] = {}
        self.slack_words: dict[str, Any] = {}

    def begin(self, calls: int) -> None:
        """The checker's job of ``calls`` schedule calls starts (before any call is made);
        room for a snapshot before each call, each first launch, and one after the last."""
        self.checker.begin(calls)
        if self.watch is not None:
            self.watch.start(self.checker, calls + len(self.programs) + 2)
        self.begun = True

    def together(self, p: int) -> None:
        """The ranks start the next call together (an all-reduce of the scalar at ``p`` on the
        job's stream); then, in a shared job, a snapshot of the sync regions (every rank's
        previous call has ended, and with it every write it made into this rank) and a second
        all-reduce (no rank's next call starts before every rank's snapshot is taken)."""
        self.ctx.comm.all_reduce(p, p, 1, "fp32", self.ctx.stream.ptr)
        if self.watch is not None:
            self.watch.snapshot(self.checker, self.last_call)
            # and every rank's snapshot taken before any rank starts the next call: a peer's
            # next call writes into this rank's regions (its flags), which must not land in a
            # row charged to this call (seen at 4 emulated ranks: an honest variant charged
            # with its neighbour's flags)
            self.ctx.comm.all_reduce(p, p, 1, "fp32", self.ctx.stream.ptr)

    def first_launches(self) -> None:
        """Each verified program's first launch alone (:func:`first_launches_alone`'s reasons:
        the device idle around it), on input set 0, judged like a checked call though neither
        counted nor timed: its output and arena poisoned first, compared in full after. The
        job's first epoch tells a kernel which launch is its first, so a launch left unjudged
        could do what no call may."""
        import random

        import cupy
        s, st = self.ctx.stream, self.sets[0]
        rng = random.Random(secrets.randbits(64))
        with s:
            tick = cupy.ones(1, dtype=cupy.float32)
            p = int(tick.data.ptr)
            for name, prog in self.programs.items():
                call = Call(name, FIRST_LAUNCH, 0, checked=True, timed=False,
                            poison=dtypes.Poison.draw(rng, self.dtype))
                self.poison(call, prog)
                self.together(p)
                self.last_call = CallMade(name, FIRST_LAUNCH, call)
                prog.calls[0]()
                if prog.settle:
                    prog.settle[0]()
                s.synchronize()
                got = self.checker.full(prog.outputs[0], st, self.dtype, self.rtol)
                if not got["correct"]:
                    self.failures.setdefault(name, []).append((-1, call, got["bad_elements"]))
                self.scrub(call, prog)
                s.synchronize()

    def run(self, schedule: list[Call], fns: dict[str, Callable[[], None]]) -> None:
        """Every call in the schedule's order, on the job's stream; the device counts of the
        calls not checked on the host are read at the end (:meth:`tally`)."""
        import cupy
        s = self.ctx.stream
        if not self.begun:
            self.begin(len(schedule))
        with s:
            tick = cupy.zeros(1, dtype=cupy.float32)
            p = int(tick.data.ptr)
            for idx, call in enumerate(schedule):
                prog = self.programs.get(call.program)
                if prog is not None:
                    self.poison(call, prog)
                self.together(p)  # every rank starts the call together
                self.last_call = CallMade(call.program, idx, call)
                if TRACE_CALLS:
                    print(f"cuco trace: rank {self.ctx.rank} call {idx} {call.program} "
                          f"{'checked' if call.checked else 'timed'} set {call.input_set}",
                          file=sys.stderr, flush=True)
                if call.checked:
                    self.checked_call(idx, call, self.programs[call.program])
                else:
                    self.timed_call(idx, call, prog, fns)
            if self.watch is not None:
                self.together(p)  # the last call's snapshot
            s.synchronize()

    def poison(self, call: Call, prog: Program) -> None:
        """Nothing a call finds in its buffers is left from another call: its output and its
        arena's data hold this call's poison."""
        call.poison.apply(prog.outputs[call.input_set])
        if prog.arena is not None:
            poison_arena(prog.arena, self.layout, call.poison, self.dtype, self.ctx.stream)
        for buf in _runner_buffers(prog, call, "poisoned_each_call"):
            call.poison.apply(buf)


    def checked_call(self, idx: int, call: Call, prog: Program) -> None:
        """A checked call: stressed from outside, compared in full on the host, guards read."""
        s, t0 = self.ctx.stream, time.perf_counter()
        out, st = prog.outputs[call.input_set], self.sets[call.input_set]
        if prog.arena is None and not self.inputs_changed:
            # a trusted program's checked call sets the accuracy bar: its inputs must be the
            # ones made, not ones a kernel changed after reading them and restores later
            self.inputs_changed = fingerprint_of(st.inputs) != st.fingerprint
        runner = _runner(prog, call)
        _set_stress(runner, self.job.stress_us)
        call.stress.before(self.ctx, s, self.hog_stream)
        prog.calls[call.input_set]()
        call.stress.after(s, self.hog_stream)
        if prog.settle:
            prog.settle[call.input_set]()
        _set_stress(runner, 0.0)
        got = self.checker.full(out, st, self.dtype, self.rtol)
        intact = all(bool((g == CANARY).all()) for g in prog.guards)
        if prog.arena is not None:
            intact = intact and guards_intact(prog.arena, self.layout)
            self.check_slack(idx, call, prog)
        rec = self.records[call.program]
        rec.calls_checked += 1
        rec.calls_verified += 1
        rec.rel_l2_error = max(rec.rel_l2_error, got["rel_l2_error"])
        # compared on the host: no device memory a candidate could write went into it
        rec.checked_l2 = max(rec.checked_l2, got["rel_l2_error"])
        rec.guards_intact = rec.guards_intact and intact
        if not (got["correct"] and intact):
            self.failures.setdefault(call.program, []).append((idx, call, got["bad_elements"]))
        self.scrub(call, prog)
        s.synchronize()
        self.check_s += time.perf_counter() - t0

    def check_slack(self, idx: int, call: Call, prog: Program) -> None:
        """After every call of a program with an arena (checked and timed alike, so no tell of
        a checked call helps): nothing it may not keep between calls holds anything. Host-
        synchronous, so no kernel runs on this rank while it is read. In order:

        - the words of its sync region outside the slots its kernels use (its runner's
          ``live_slots``: :class:`~cuco.runtime.arena.LiveSlots`), zeroed at the job's start
          (``OWN_SLACK``): a memo of earlier calls kept there;
        - the arena past every sync region up to its mapped end (``OWN_TAIL``);
        - memory its runner leaves at zero between calls (``zero_after_each_call``: a split-K
          build's arrival counters; ``OWN_ZEROED``).

        The program's first such call is its failure (tampered: no second try)."""
        import cupy
        runner = _runner(prog, call)
        lay = getattr(runner, "layout", None)
        if lay is None or call.program in self.slack_blame:
            return
        found = None
        if call.program not in self.slack_words:  # None: the runner names no live slots
            live = getattr(runner, "live_slots", None)
            slots = live() if live is not None else None
            self.slack_words[call.program] = None if slots is None else cupy.asarray(slots.slack_words(lay.region_bytes))
        slack = self.slack_words[call.program]
        if slack is not None and slack_written(_words(prog.arena, lay.flags, lay.region_bytes), slack):
            found = OWN_SLACK
        tail = prog.arena.size - lay.size
        if found is None and tail > 0 and int(cupy.count_nonzero(_words(prog.arena, lay.size, tail))):
            found = OWN_TAIL
        if found is None and any(int(cupy.count_nonzero(b)) for b in _runner_buffers(prog, call, "zero_after_each_call")):
            found = OWN_ZEROED
        if found is not None:
            self.slack_blame[call.program] = Blame(idx, call, found)

    def timed_call(self, idx: int, call: Call, prog: Program | None,
                   fns: dict[str, Callable[[], None]]) -> None:
        """A call between CUDA events (a warm-up, a timed or a stressed one), then, for a
        verified program, its count of bad elements enqueued after the closing event."""
        import cupy
        s = self.ctx.stream
        fn = prog.calls[call.input_set] if prog is not None else fns[call.program]
        runner = _runner(prog, call)
        spin(s, self.job.busy_us)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        if call.stress is not None:  # stressed as a checked call is, verified as a timed one
            _set_stress(runner, self.job.stress_us)
            call.stress.before(self.ctx, s, self.hog_stream)
        start.record(s)
        fn()
        end.record(s)
        if call.stress is not None:
            call.stress.after(s, self.hog_stream)
            _set_stress(runner, 0.0)
        if call.timed:
            self.marks.setdefault(call.program, []).append((start, end))
        if prog is not None:
            self.count_bad(idx, call, prog)
            if prog.arena is not None:
                self.check_slack(idx, call, prog)

    def count_bad(self, idx: int, call: Call, prog: Program) -> None:
        """The device's count of a call's elements out of tolerance (and its L2 sums), never
        waited on; a host or peer program's output is scrubbed right after."""
        import cupy
        s, st = self.ctx.stream, self.sets[call.input_set]
        v0, v1 = cupy.cuda.Event(), cupy.cuda.Event()
        v0.record(s)
        if prog.settle:
            prog.settle[call.input_set]()
        self.checker.count(idx, prog.outputs[call.input_set], st, self.dtype, self.rtol)
        self.scrub(call, prog)
        v1.record(s)
        self.verify_marks.append((v0, v1))

    @staticmethod
    def scrub(call: Call, prog: Program) -> None:
        """A trusted program's output is a right answer, and so are its buffers between steps
        (its call's ``scratch``: :func:`~cuco.workloads.base.in_order`): poisoned as soon as
        the call is verified, so no kernel finds them between calls."""
        if not prog.scrub:
            return
        call.poison.apply(prog.outputs[call.input_set])
        for buf in scratch_of(prog.calls[call.input_set]):
            call.poison.apply(buf)

    def tally(self, schedule: list[Call]) -> None:
        """The device counts of every call not checked on the host, into the records; a call
        whose count or sums no longer match their tag was tampered with (wrong)."""
        counts, sums, intact = self.checker.tally(len(schedule))  # checked calls' rows unread
        tally_device_counts(self.records, self.failures, schedule, counts, sums, intact)
        if self.watch is not None:  # its records are marked by first_failures
            self.sync_blame = self.watch.blame(*self.checker.snapshots())
        own, disturbed = own_state_blames(self.slack_blame, self.sync_blame)
        for name, b in own.items():  # a neighbour's region, where both, first
            self.sync_blame.setdefault(name, b)
        for name, b in disturbed.items():  # a neighbour wrote there: wrong here, not a tamperer
            self.failures.setdefault(name, []).append((b.idx, b.call, DISTURBED))

    def first_failures(self) -> None:
        """Each wrong program's first failing call, in the schedule's order."""
        mark_first_failures(self.records, self.failures, self.ctx.rank, self.sync_blame)

    def accuracy_rule(self) -> None:
        """No program less accurate than the host program allows (:func:`apply_accuracy_rule`,
        at the job's ``accuracy_slack``)."""
        trusted = {name for name, prog in self.programs.items() if prog.scrub}
        apply_accuracy_rule(self.records, self.dtype, self.job.accuracy_slack, trusted)

    def inputs_rule(self) -> None:
        """Inputs or references written: nobody passes, and the cached sets are dropped."""
        if self.inputs_changed or any(fingerprint_of(st.inputs) != st.fingerprint or not ref_intact(st)
                                      for st in self.sets):
            drop_references(self.ctx)
            for rec in self.records.values():
                rec.correct, rec.inputs_intact = False, False

    def result(self) -> RankResult:
        """The records, with each timed program's median (the only-timed ones get a record
        of their own, ``verified=False``), and the seconds verification took."""
        import cupy
        for name, ms in self.marks.items():
            rec = self.records.setdefault(name, ProgramRecord(verified=False))
            rec.median_ms = median([cupy.cuda.get_elapsed_time(a, b) for a, b in ms])
            rec.samples = len(ms)
        verify_s = self.check_s + sum(cupy.cuda.get_elapsed_time(a, b) for a, b in self.verify_marks) / 1e3
        return RankResult(self.ctx.rank, self.records, verify_s, verifier=self.checker.kind)


def _set_stress(runner, stress_us: float) -> None:
    """A runner that can stall its own compute stream does so before each chunk while set."""
    if runner is not None:
        runner.stress_us = stress_us


#: ``bad_elements`` of a failure whose count was tampered with: nothing it says can be believed.
TAMPERED = -1
#: ``bad_elements`` of a call whose sync region a neighbour wrote into (:func:`own_state_blames`).
DISTURBED = -2


def tally_device_counts(records: dict[str, ProgramRecord], failures: dict[str, list[tuple[int, Call, int]]],
                        schedule: list[Call], bad, sums, intact: Sequence[bool] | None = None) -> None:
    """``bad[i]`` (elements out of tolerance) and ``sums[i]`` (the L2 sums) of each call
    ``i`` verified on the device, into its program's record and failures; ``intact[i]``
    False: the count or sums were changed after the check wrote them (a :data:`TAMPERED`
    failure)."""
    for idx, call in enumerate(schedule):
        if call.checked or call.program not in records:
            continue
        rec = records[call.program]
        rec.calls_verified += 1
        if intact is not None and not intact[idx]:
            failures.setdefault(call.program, []).append((idx, call, TAMPERED))
            continue
        # the accuracy rule holds for every call, not only the checked ones: a kernel lossy
        # on some calls only (within the element-wise tolerance) meets it anyway
        rec.rel_l2_error = max(rec.rel_l2_error, rel_l2(*[float(x) for x in sums[idx]]))
        if bad[idx]:
            failures.setdefault(call.program, []).append((idx, call, int(bad[idx])))


def mark_first_failures(records: dict[str, ProgramRecord],
                        failures: dict[str, list[tuple[int, Call, int]]], rank: int,
                        sync_blame: dict[str, Blame] | None = None) -> None:
    """Each program with failures is wrong at its first failing call in the schedule's order;
    one that changed another variant's sync region (``sync_blame``) is wrong at that call,
    whatever else it got wrong: that, not its output, decides its verdict."""
    for name, b in (sync_blame or {}).items():
        records[name].sync_intact = False
        records[name].fail(FailedCall(b.call.iteration, b.call.input_set, b.call.checked, 0, rank,
                                      tampered=True, wrote_into=b.wrote_into))
    for name, failed in failures.items():
        if sync_blame and name in sync_blame:
            continue
        _, call, n_bad = min(failed, key=lambda f: f[0])
        records[name].fail(FailedCall(call.iteration, call.input_set, call.checked, max(int(n_bad), 0), rank,
                                      tampered=n_bad == TAMPERED, disturbed=n_bad == DISTURBED))


def apply_accuracy_rule(records: dict[str, ProgramRecord], dtype: str,
                        slack: float = ACCURACY_SLACK, trusted: Collection[str] = ()) -> None:
    """A correct program whose relative L2 error (on any verified call) exceeds ``slack``
    times the host program's is wrong; the ``trusted`` ones (other host programs, peer
    libraries: the baselines) are held to :data:`ACCURACY_SLACK`, so a workload's tighter
    bar for its candidates never drops a library from the baseline, which would make a
    slower program the bar. The host program's error is
    taken from its host-compared (checked) calls only: the device sums of the other calls
    sit in memory a candidate's kernel could find and inflate, which would raise the limit
    its own lossy calls must meet."""
    host = records.get(HOST)
    if host is None or not host.correct:
        return
    host_l2 = host.checked_l2 if host.calls_checked else host.rel_l2_error
    floor = max(host_l2, EPS[dtype] / 4)
    for name, rec in records.items():
        limit = (ACCURACY_SLACK if name in trusted else slack) * floor
        if rec.correct and rec.rel_l2_error > limit:
            rec.correct, rec.less_accurate_than_host = False, host_l2


def judge(ctx, job: ScheduledJob, programs: dict[str, Program], extras: dict[str, Callable[[], Callable[[], None]]],
          sets: list[InputSet], rtol: float, dtype: str, layout, floor_ms: float = 0.0,
          verifier=None) -> RankResult:
    """Verify and time every program of a job on this rank, in the order of one schedule
    (the module's docstring says how). ``extras``: makers of the halves of the bound, only
    timed. ``floor_ms``: the physical floor of one call
    (:func:`cuco.runtime.peaks.physical_floor_ms`), reported with every program.
    ``verifier``: the rank's verifier process the checks go to (None: in this worker; the
    input sets' references must have been handed to the same one)."""
    import cupy
    hog_stream = check_streams(ctx, dtype)
    fns = bound_halves(ctx, job, extras)
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    schedule = job_schedule(job, {n: p.shares for n, p in programs.items()}, list(fns),
                            world_size=ctx.world_size, sms=sms, dtype=dtype, n_sets=len(sets))
    v = Verification(ctx, job, programs, sets, rtol, dtype, layout, floor_ms, hog_stream,
                     make_checker(ctx, verifier), SyncWatch.of(programs))
    try:
        v.begin(len(schedule))
        if job.time:  # a check-only schedule waits after every call: no launch needs to go first
            v.first_launches()
        v.run(schedule, fns)
        v.tally(schedule)
    finally:
        v.checker.end()
    v.first_failures()
    v.accuracy_rule()
    v.inputs_rule()
    return v.result()
