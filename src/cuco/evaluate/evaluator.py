"""Evaluator: the cascade every candidate goes through before it may score.

``static`` (directives valid, forbidden constructs, edits only inside
EVOLVE-BLOCKs, each block a lambda of its own, naming only constant macros) -> ``compile`` (cached, parallel for batches) -> ``small``
(correctness at a small shape, the candidate's block edits spliced into the
template rendered for it) -> ``full`` (correctness at the target shape on two
fresh seeds) -> ``timing`` (interleaved with the host-driven program, the compute
alone and the communication alone) -> score.

What the score rests on (:mod:`cuco.evaluate.jobs`): every call of every stage, timed
ones included, is verified element by element against an fp32 reference; each job
holds three input sets in different buffers and never gives a call the set that last
wrote a buffer it shares, so a stale output is wrong; outputs and arena are poisoned
before every call with a pattern drawn for it; checked calls (stressed from outside the
kernel, compared on the host, guard pages read) sit at random places among the timed ones; the first
epoch of a job is random; the kernel's arguments are the same in checked and timed
calls. A time below the physical floor (:mod:`cuco.runtime.peaks`) is ``suspect``
and scores nothing. In a batch (:meth:`Evaluator.evaluate_many`) the candidates built by
the time the GPUs are free (up to :data:`CHECK_BATCH`) share each check stage's job, and up
to :data:`TIMING_BATCH` candidates that passed their checks share one timing job: the host
programs and the halves of the bound are timed once for all of them, interleaved with them
(the same run); every candidate of a shared job that failed is checked or timed again
alone, and so is a candidate found wrong in a shared job that points beyond it (another
candidate or the host program wrong too, the inputs changed, a candidate changed another's
sync region); the only one wrong among right neighbours keeps that verdict, as it would
alone, and one that changed another's sync region keeps its own (each variant of a shared
job has flags, barrier slots and call state of its own, watched between calls:
:mod:`cuco.evaluate.sync_watch`), so no kernel gets a second try. A hang or a crash costs a respawn of the worker group, never
the search.

Two places to extend. The *workload* (any :class:`cuco.workloads.Workload`: the six
built-ins or a user's subclass) owns what is computed and how its kernels are made:
inputs, the higher-precision reference, the tolerance, the host-driven program, the
halves of the bound, its templates, small shape and runner; it travels to the workers
with each job, so a class defined in a notebook or script works. The *evaluator* owns how a
candidate is judged: override ``template``, ``static_checks``,
``small_problem``, ``small_directives`` or ``case``. See
``examples/custom_evaluator.py``.
"""

from __future__ import annotations

import os
import platform
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco.db import CandidateDB
from cuco.design import Backend, Directives, Problem
from cuco.errors import CompileError, DirectiveError, EnvironmentProblem, InputError
from cuco.evaluate.batching import in_build_batches, shared_names, shared_timeout
from cuco.evaluate.static import static_violations
from cuco.kernels import Compiler
from cuco.kernels import evolve, macros
from cuco.runtime.emulated import spinning_grid_refusal
from cuco.runtime.records import ProgramResult, merge_ranks
from cuco.runtime.peaks import below_floor
from cuco.runtime.verifier_mode import PROCESS, verifier_mode
from cuco.workloads import Workload
from cuco.workloads.base import for_problem
from cuco.evaluate.jobs import N_CHECKED, Case, VariantSpec
from cuco.evaluate.verification import HOST


#: Candidates of a batch checked in one job per check stage (small, full): those whose builds
#: are done when the GPUs are free, up to this many (the host program's calls, the job's
#: dispatch, input sets and fingerprints once for all of them).
CHECK_BATCH = 8

#: Candidates of a batch timed in one job (the timing stage is most of a candidate's GPU time,
#: and much of it times the host programs and the bound, the same for every candidate). 8
#: against 4: 0.40 against 0.48 s of timing a candidate, 72.98 against 62.66 evolved in-kernel
#: candidates a minute (bench/results/evaluator_w1_b8.json, evaluator_w1_b4.json, 1 x H200).
TIMING_BATCH = 8


@dataclass
class StageTimeouts:
    """Seconds each GPU stage may take before the group is reset (``hang``)."""

    small: float = 60.0
    full: float = 240.0
    timing: float = 300.0


@dataclass
class EvalResult:
    """The verdict, in the shape :meth:`CandidateDB.add_evaluation` stores."""

    status: str
    stage_reached: str
    error: str | None = None
    max_error: float | None = None
    rank_times_ms: list[float] | None = None
    time_ms: float | None = None
    baseline_ms: float | None = None
    bound_ms: float | None = None
    speedup: float | None = None
    overlap_eff: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """Speedup over the host-driven program; zero unless everything passed."""
        return self.speedup if self.status == "ok" and self.speedup else 0.0


@dataclass
class Candidate:
    """What the evaluator takes: directives, and optionally an edited source."""

    directives: Directives
    source: str | None = None
    candidate_id: int | None = None


@dataclass
class _Checked:
    """A built candidate on its way through the checks, then waiting for its timing: what it
    is, its builds (``small``: the small shape's), its worst check error, and where its time
    went so far (``seconds``: collecting its builds and its shares of the GPU jobs)."""

    cand: Candidate
    small_problem: Problem
    small: VariantSpec
    spec: VariantSpec
    compile_s: float
    seconds: float
    build_wait_s: float
    stage_s: dict[str, float] = field(default_factory=dict)
    worst: float = 0.0

    @property
    def gpu_s(self) -> float:
        return sum(self.stage_s.values())

    def spent(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "gpu_s": self.gpu_s, "build_wait_s": self.build_wait_s,
                "stage_s": dict(self.stage_s)}


def one_build(prepared: dict[str, Any]) -> bool:
    """Whether the small shape's source is the candidate's own (kernels that take their
    shape per launch, like the in-kernel placements'): then one binary is built, and the
    small check runs the very binary that is timed."""
    return prepared["small_source"] == prepared["source"]


class Evaluator:
    """Runs the cascade for one workload on one worker group.

    >>> ev = Evaluator(GemmAllReduce(m=8192, n=8192, k=8192, world_size=2), group=group, db=db)  # doctest: +SKIP
    >>> result = ev.evaluate(Directives(placement="side_stream", ...))          # doctest: +SKIP
    """

    def __init__(self, workload: Workload | Problem, *, group=None, db: CandidateDB | None = None,
                 compiler: Compiler | None = None, seeds: tuple[int, int] | None = None,
                 timeouts: StageTimeouts | None = None, timing_iters: int = 30,
                 run_id: int | None = None, timing_batch: int = TIMING_BATCH, peers: bool = True,
                 check_batch: int = CHECK_BATCH, verifier: str | None = None):
        if timing_iters <= N_CHECKED:  # the job would fail on every rank after the correctness job
            raise InputError(f"timing_iters={timing_iters} leaves no timed call beside the {N_CHECKED} "
                             f"checked ones",
                             param="timing_iters", fix=4 * N_CHECKED)
        if isinstance(workload, Problem):  # make_problem's result: its workload
            workload = for_problem(workload)
        elif not isinstance(workload, Workload):
            raise InputError(f"Evaluator takes a workload or a problem, not {type(workload).__name__}",
                             param="workload", fix="cuco.make_problem('gemm_allreduce', '8192x8192x8192')")
        self.workload = workload
        #: where the checks run (None: the worker group's choice, its verifier process by
        #: default; ``"inline"``: in the workers): :mod:`cuco.runtime.verifier_mode`
        self.verifier = None if verifier is None else verifier_mode(verifier)
        if self.verifier == PROCESS and getattr(group, "verifier", PROCESS) != PROCESS:
            raise ValueError("Evaluator(verifier='process') needs a worker group that starts verifier "
                             "processes: WorkerGroup(..., verifier='process') (the default)")
        #: where the last job's checks ran, as its ranks reported (every verdict's extra["verifier"])
        self.verifier_used: str | None = None
        self.problem = workload.problem
        self.group = group
        self.db = db
        self.compiler = compiler
        # fresh seeds per evaluator (nothing can be tuned to them); every candidate
        # of one evaluator is checked on the same ones, so workers cache their references
        self.seeds = seeds or (1 + secrets.randbelow(1 << 20), (1 << 20) + secrets.randbelow(1 << 20))
        self.timeouts = timeouts or StageTimeouts()
        self.timing_iters = timing_iters
        self.timing_batch = max(1, timing_batch)
        self.check_batch = max(1, check_batch)
        #: Other libraries' fused ops (torch's, where torch runs in the workers) join every
        #: timing job as verified programs, and the fastest correct one can be the baseline a
        #: candidate is scored against (:meth:`Workload.strongest_host`). Not in an emulated
        #: world, where nothing is timed.
        self.peers = peers
        #: trusted programs wrong in a timing job of no candidate (None: not yet asked)
        self._wrong_alone: set[str] | None = None
        self.run_id = run_id
        self.warm = False
        self.warmup_timeout_s = 600.0
        #: Seconds spent verifying (checked calls, device counts of the others) over this
        #: evaluator's life, slowest rank per job (``bench/evaluator.py``'s overhead).
        self.verify_s = 0.0
        #: Seconds in GPU jobs, and seconds the GPUs waited on builds started in the
        #: background (``evaluate_many``), over this evaluator's life.
        self.gpu_s = 0.0
        self.build_wait_s = 0.0

    # ---- hooks ------------------------------------------------------------------------
    def workload_at(self, problem: Problem) -> Workload:
        """The evaluator's workload at ``problem`` (its own shape, or the small one)."""
        return self.workload if problem == self.problem else self.workload.at(problem)

    def template(self, problem: Problem, d: Directives) -> tuple[str, tuple[str, ...]]:
        """The unedited kernel source for ``d`` at ``problem``, and what it needs."""
        src = self.workload_at(problem).render(d)
        return src.source, src.needs

    def static_checks(self, source: str) -> list[str]:
        return static_violations(source)

    def small_problem(self) -> Problem:
        """A shape small enough to check in a second, of the same workload and world size
        (the workload's :meth:`~cuco.workloads.Workload.small_problem`)."""
        return self.workload.small_problem()

    def small_directives(self, d: Directives, small: Problem) -> Directives:
        """``d`` for the small shape (the workload's
        :meth:`~cuco.workloads.Workload.small_directives`: its chunk cut to fit)."""
        return self.workload.small_directives(d, self.workload_at(small))

    def case(self, problem: Problem, spec: VariantSpec | list[VariantSpec], *,
             seed: int | tuple[int, ...], time_it: bool) -> Case:
        """The job of one stage: the workload at ``problem`` (it travels with the job, so a
        class defined in a notebook works) and the candidate (or, in a batch's timing job,
        several), on the input sets of ``seed`` (several seeds: all their sets in one job)."""
        specs = spec if isinstance(spec, list) else [spec]
        return Case(self.workload_at(problem), variants=specs, seed=seed, time=time_it,
                    iters=self.timing_iters, baselines=time_it,
                    peers=time_it and self.peers and not getattr(self.group, "emulated", False),
                    verifier=self.verifier)

    # ---- the cascade --------------------------------------------------------------------
    def _compiler(self) -> Compiler:
        if self.compiler is None:
            self.compiler = Compiler()
        return self.compiler

    def prepare(self, cand: Candidate) -> tuple[EvalResult | None, dict[str, Any]]:
        """``static`` stage; returns a failure or the sources to compile."""
        d = cand.directives
        try:
            template, needs = self.template(self.problem, d)
            small_p = self.small_problem()
            small_template, _ = self.template(small_p, self.small_directives(d, small_p))
        except DirectiveError as exc:
            return EvalResult("invalid", "static", str(exc)), {}
        refused = self.grid_refusal(d)
        if refused:
            return EvalResult("invalid", "static", refused), {}
        source = cand.source if cand.source is not None else template
        problems = self.static_checks(source) + evolve.edit_violations(template, source)
        if not problems:
            try:
                problems = macros.edit_violations(self._compiler(), template, needs, source)
            except CompileError as exc:  # the template does not preprocess
                return EvalResult("compile_error", "compile", exc.summary), {}
        if problems:
            return EvalResult("invalid", "static", "\n".join(problems)), {}
        small_source = evolve.splice(small_template, evolve.blocks(source))
        return None, {"source": source, "small_source": small_source, "needs": needs,
                      "small_problem": small_p}

    def prebuild(self, cands: list[Candidate | Directives]) -> list[str | None]:
        """Build the candidates' kernels on all cores now, without a GPU and without a verdict:
        each build lands in the kernel cache, where a later :meth:`evaluate` finds it (a test
        suite or a notebook that evaluates candidates one at a time then waits on no build).
        Returns, per candidate, None where it is built, else why not (its static or compile
        verdict's text). ::

            ev = Evaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=2))
            ev.prebuild([Directives(placement="side_stream", comm_ctas=8, chunk_bytes=1 << 20)])
        """
        why: list[str | None] = [None] * len(cands)
        items, owner = [], []
        for i, c in enumerate(cands):
            cand = c if isinstance(c, Candidate) else Candidate(c)
            fail, prep = self.prepare(cand)
            if fail is not None:
                why[i] = fail.error or fail.status
                continue
            sources = [prep["source"]] + ([] if one_build(prep) else [prep["small_source"]])
            items += [(self._name(cand), src, prep["needs"]) for src in sources]
            owner += [i] * len(sources)
        for i, built in zip(owner, self._compiler().compile_many(items)):
            if isinstance(built, CompileError) and why[i] is None:
                why[i] = built.summary
        return why

    def grid_refusal(self, d: Directives) -> str | None:
        """Why the group cannot run ``d``'s communication grid (its CTAs spin on their peers,
        so every rank's must be resident together: in an emulated world each rank has its
        share of one GPU), or ``None``. One-kernel placements size their grid to that share
        themselves."""
        infos = getattr(self.group, "infos", None) or []
        fits = [i["persistent_sms"] for i in infos if "persistent_sms" in i]
        if d.placement.in_kernel or not fits:
            return None
        emulated = bool(getattr(self.group, "emulated", False))
        return spinning_grid_refusal(d.comm_ctas, min(fits), len(infos), emulated)

    def compile(self, name: str, prepared: dict[str, Any],
                pending: tuple[Future, Future] | None = None) -> tuple[EvalResult | None, dict]:
        """``compile`` stage (or collect the builds ``evaluate_many`` started in the background)."""
        comp = self._compiler()
        t0 = time.perf_counter()
        try:
            if pending is not None:
                try:
                    big, small = pending[0].result(), pending[1].result()
                finally:  # the GPUs idled this long waiting for background builds
                    self.build_wait_s += time.perf_counter() - t0
            else:
                big = comp.compile(prepared["source"], needs=prepared["needs"], name=name)
                small = big if one_build(prepared) else comp.compile(
                    prepared["small_source"], needs=prepared["needs"], name=name + ".small")
        except CompileError as exc:
            return EvalResult("compile_error", "compile", exc.summary), {}
        seconds = big.seconds + (0.0 if small is big else small.seconds)
        return None, {"cubin": str(big.path), "small_cubin": str(small.path), "compile_s": seconds}

    def warm_up(self) -> None:
        """First use of a fresh group loads cuBLAS, creates the device communicator and
        allocates arenas; that is not the candidate's time, so it gets its own generous
        timeout before any stage timeout applies."""
        job = Case(self.workload_at(self.small_problem()), variants=[], seed=1, time=False,
                   verifier=self.verifier)
        res = self.group.run(job, timeout=self.warmup_timeout_s)
        if not res.ok:
            raise RuntimeError(f"the worker group cannot run the host reference:\n{res.error_text()}")
        self.warm, self._respawns = True, self.group.respawns

    def _run(self, job, timeout: float, stage: str) -> tuple[EvalResult | None, dict | None]:
        if not self.warm or self.group.respawns != self._respawns:
            self.warm_up()
        t0 = time.perf_counter()
        res = self.group.run(job, timeout=timeout)
        self.gpu_s += time.perf_counter() - t0
        if res.status == "environment":  # a verifier process died: no verdict on anyone
            raise EnvironmentProblem(next(e for e in res.errors if e).splitlines()[0])
        if res.ok:
            self.verify_s += max(r.verify_s for r in res.results)
            self.verifier_used = "+".join(sorted({r.verifier for r in res.results}))
        if res.status in ("hang", "crash"):
            return EvalResult(res.status, stage, res.error_text()[-4000:],
                              extra={"respawn_s": res.respawn_s}), None
        if not res.ok:
            return EvalResult("error", stage, res.error_text()[-4000:]), None
        return None, merge_ranks(res.results)

    def _check(self, merged: dict[str, ProgramResult], name: str, stage: str) -> EvalResult | None:
        rec = merged[name]
        if rec.correct:
            return None
        if not rec.sync_intact:
            why = (rec.failed_call.describe() if rec.failed_call is not None else
                   "changed another variant's sync region in a job it shared")
            failed = asdict(rec.failed_call) if rec.failed_call is not None else None
            return EvalResult("wrong", stage, why, max_error=rec.rel_l2_error,
                              extra={"failed_call": failed, "tampered": True})
        if not rec.inputs_intact:
            why = "wrote to its inputs (their fingerprint changed)"
        elif not rec.guards_intact:
            why = "wrote outside its outputs (a guard page changed)"
        elif rec.less_accurate_than_host is not None:
            why = (f"relative L2 error {rec.rel_l2_error:.3g} is more than "
                   f"{self.workload.accuracy_slack:g}x the host program's {rec.less_accurate_than_host:.3g} on the "
                   "same inputs: it loses precision the workload does not allow (e.g. it "
                   "compresses what it sends)")
        elif rec.failed_call is not None:
            why = rec.failed_call.describe()
        else:
            why = f"{rec.bad_elements} elements differ from the reference"
        failed = asdict(rec.failed_call) if rec.failed_call is not None else None
        return EvalResult("wrong", stage, why, max_error=rec.rel_l2_error, extra={"failed_call": failed})

    def evaluate(self, cand: Candidate | Directives, source: str | None = None) -> EvalResult:
        """Run the whole cascade for one candidate (and store the verdict if a DB is set)."""
        if isinstance(cand, Directives):
            cand = Candidate(cand, source)
        return self._judge(cand, self.prepare(cand))

    def _judge(self, cand: Candidate, prepared: tuple[EvalResult | None, dict[str, Any]],
               pending: tuple[Future, Future] | None = None) -> EvalResult:
        result = self._evaluate(cand, prepared, pending)
        self._store(cand, result)
        return result

    def _evaluate(self, cand: Candidate, prepared: tuple[EvalResult | None, dict[str, Any]],
                  pending: tuple[Future, Future] | None = None) -> EvalResult:
        """The whole cascade for one candidate, its jobs its own (not stored)."""
        fail, checked = self._checked_many([(cand, prepared, pending)])[0]
        return fail if fail is not None else self._timed([checked])[0]

    def evaluate_many(self, cands: list[Candidate | Directives]) -> list[EvalResult]:
        """Batch: every candidate compiles in the background on all cores while the
        GPUs check the ones already built, as their builds finish: whatever is built when
        the GPUs are free (up to :attr:`check_batch`) shares each check stage's job; those
        that pass are timed :attr:`timing_batch` at a time in one job (results come back in
        the order of ``cands``)."""
        cands = [c if isinstance(c, Candidate) else Candidate(c) for c in cands]
        prepared = [self.prepare(c) for c in cands]
        comp = self._compiler()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            pending = []
            for c, (fail, prep) in zip(cands, prepared):
                if fail is not None:
                    pending.append(None)
                    continue
                name = self._name(c)
                big = pool.submit(comp.compile, prep["source"], needs=prep["needs"], name=name)
                pending.append((big, big if one_build(prep) else pool.submit(
                    comp.compile, prep["small_source"], needs=prep["needs"], name=name + ".small")))
            results: list[EvalResult | None] = [None] * len(cands)
            waiting: list[tuple[int, _Checked]] = []

            def settle(i: int, r: EvalResult) -> None:
                results[i] = r
                self._store(cands[i], r)

            def time_waiting() -> None:
                for (i, _), r in zip(waiting, self._timed([c for _, c in waiting]) if waiting else []):
                    settle(i, r)
                waiting.clear()

            try:
                for ready in in_build_batches(pending, self.check_batch):
                    items = [(cands[i], prepared[i], pending[i]) for i in ready]
                    for i, (fail, checked) in zip(ready, self._checked_many(items)):
                        if fail is not None:
                            settle(i, fail)
                            continue
                        waiting.append((i, checked))
                        if len(waiting) >= self.timing_batch:
                            time_waiting()
                time_waiting()
                return results  # type: ignore[return-value]
            finally:
                for f in pending:
                    for part in f or ():
                        part.cancel()

    def _name(self, cand: Candidate) -> str:
        return f"{self.problem.workload}.{cand.directives.full_name}"

    def _checked_many(self, items: list[tuple[Candidate, tuple[EvalResult | None, dict[str, Any]],
                                              tuple[Future, Future] | None]]
                      ) -> list[tuple[EvalResult | None, _Checked | None]]:
        """Every stage before timing, for candidates whose builds are done (or failed): each
        check stage one job for all that reached it (:meth:`_check_stage`). Per candidate, a
        failure (with where its time went; not stored) or the candidate ready to be timed."""
        out = [self._built(*item) for item in items]
        live = [(j, c) for j, (_, c) in enumerate(out) if c is not None]
        if any(c.small_problem != live[0][1].small_problem for _, c in live):
            raise ValueError("small_problem() gave the candidates of one batch different shapes")
        stages = (("small", live[0][1].small_problem if live else None, self.seeds[0], self.timeouts.small),
                  ("full", self.problem, self.seeds, self.timeouts.full))
        for stage, problem, seed, timeout in stages:
            if not live:
                break
            specs = [c.small if stage == "small" else c.spec for _, c in live]
            verdicts = self._check_stage(stage, problem, specs, seed, timeout)
            for (j, c), (fail, worst, seconds) in zip(live, verdicts):
                c.stage_s[stage] = seconds
                c.seconds += seconds
                c.worst = worst
                if fail is not None:
                    self._spent(fail, c.spent())
                    out[j] = (fail, None)
            live = [(j, c) for j, c in live if out[j][1] is not None]
        return out

    def _built(self, cand: Candidate, prepared: tuple[EvalResult | None, dict[str, Any]],
               pending: tuple[Future, Future] | None) -> tuple[EvalResult | None, _Checked | None]:
        """``static`` and ``compile``: a failure (with where its time went), or the candidate
        with its builds, for the check stages."""
        t0, wait0 = time.perf_counter(), self.build_wait_s
        fail, prep = prepared
        if fail is None:
            fail, built = self.compile(self._name(cand), prep, pending)
        if fail is None and self.group is None:
            fail = EvalResult("error", "compile", "no worker group: GPU stages need one "
                              "(Evaluator(..., group=WorkerGroup(world_size)))",
                              extra={"compile_s": built["compile_s"]})
        seconds, wait_s = time.perf_counter() - t0, self.build_wait_s - wait0
        if fail is not None:
            self._spent(fail, {"seconds": seconds, "gpu_s": 0.0, "build_wait_s": wait_s, "stage_s": {}})
            return fail, None
        d, small_p = cand.directives, prep["small_problem"]
        small = VariantSpec("candidate", self.small_directives(d, small_p).to_json(), built["small_cubin"])
        return None, _Checked(cand, small_p, small, VariantSpec("candidate", d.to_json(), built["cubin"]),
                              built["compile_s"], seconds, wait_s)

    def _check_stage(self, stage: str, problem: Problem, specs: list[VariantSpec],
                     seed: int | tuple[int, ...], timeout: float) -> list[tuple[EvalResult | None, float, float]]:
        """One check-only job of ``stage`` for every candidate of ``specs``; per candidate its
        failure (or None), its worst error and its seconds (its share of the job). A candidate
        wrong in a job it shared is checked again alone (that verdict its own) only where the
        job points beyond it (:func:`second_tries`); the only one wrong among right
        neighbours and a right host program keeps its verdict: alone, too, it had one try;
        so does one that changed another's sync region."""
        named = shared_names(specs)
        gpu0 = self.gpu_s
        fail, merged = self._run(self.case(problem, named, seed=seed, time_it=False),
                                 shared_timeout(timeout, len(specs)), stage)
        share = (self.gpu_s - gpu0) / len(specs)
        wrong = [fail or self._check(merged, n.name, stage) for n in named]
        again = second_tries([n.name for n in named], fail, merged, wrong)
        out = []
        for spec, n, w, retry in zip(specs, named, wrong, again):
            if retry:
                alone, worst, seconds = self._check_stage(stage, problem, [spec], seed, timeout)[0]
                out.append((alone, worst, share + seconds))
            else:
                out.append((w, merged[n.name].rel_l2_error if w is None else 0.0, share))
        return out

    def _timed(self, checked: list[_Checked]) -> list[EvalResult]:
        """Time the candidates in one job (each a variant of its own name, interleaved with
        the host programs and the halves of the bound) and score each (not stored). Where
        the job held others, every candidate is timed again alone when the job failed or
        disturbed a baseline, and a wrong one is when the job points beyond it
        (:func:`second_tries`); the only one wrong among right neighbours and a right
        host program keeps that verdict, as it would alone: no second try; nor does one that
        changed another's sync region, whatever the job did."""
        specs = shared_names([c.spec for c in checked])
        gpu0 = self.gpu_s
        fail, merged = self._run(self.case(self.problem, specs, seed=self.seeds[-1] + 1, time_it=True),
                                 shared_timeout(self.timeouts.timing, len(checked)), "timing")
        disturbed = self.disturbed_baselines(merged) if fail is None else []
        if disturbed and len(checked) == 1:
            fail = EvalResult("wrong", "timing", f"{', '.join(disturbed)} gave wrong output in the timing "
                              "job beside this candidate and right output in a job without it: a "
                              "candidate that disturbs a baseline (making a slower one the bar) "
                              "scores nothing", extra={"disturbed_baselines": disturbed})
        share = (self.gpu_s - gpu0) / len(checked)
        wrong = [fail or self._check(merged, spec.name, "timing") for spec in specs]
        names = [spec.name for spec in specs]
        if (fail is not None or disturbed) and len(checked) > 1:  # all but a tampering one again
            tamperers = tampered(merged, names)
            again = [name not in tamperers for name in names]
        else:
            again = second_tries(names, fail, merged, wrong)
        results = []
        for spec, c, r, retry in zip(specs, checked, wrong, again):
            if retry:
                results.append(self._timed([c])[0])  # its verdict from a job of its own
                continue
            r = r or self._score(c, merged, spec.name)
            r.extra.setdefault("timed_with", len(checked))
            self._spent(r, {"seconds": c.seconds + share, "gpu_s": c.gpu_s + share,
                            "build_wait_s": c.build_wait_s, "stage_s": {**c.stage_s, "timing": share}})
            results.append(r)
        return results

    def disturbed_baselines(self, merged: dict[str, ProgramResult]) -> list[str]:
        """The workload's trusted programs (other host programs, torch's fused op) that were
        wrong, or not timed, in a timing job with candidates but are right without any: some
        kernel of the job disturbed them. Dropping such a program from the baseline silently
        would score the candidate against a slower one. One that is wrong on its own too (a
        library less accurate than the rule allows) stays out of the baseline, and the
        verdict says so (``extra["baselines_wrong_alone"]``)."""
        suspect = [n for n in self._no_bar(merged) if n != HOST]
        if not suspect:
            return []
        wrong_alone = self._baselines_wrong_alone()
        return [n for n in suspect if n not in wrong_alone]

    def _no_bar(self, merged: dict[str, ProgramResult]) -> list[str]:
        """The workload's trusted programs that ran verified in ``merged`` but cannot be the
        bar there: wrong, or not timed (the complement of what
        :meth:`Workload.strongest_host` picks from)."""
        return [n for n in self.workload.host_programs
                if n in merged and merged[n].verified and not (merged[n].correct and merged[n].timed)]

    def _baselines_wrong_alone(self) -> set[str]:
        """The trusted programs that are wrong (or untimed) in a timing job of no candidate,
        run once per evaluator when first needed; a job that fails counts every one as right
        alone (so nothing found wrong beside a candidate is excused)."""
        if self._wrong_alone is None:
            fail, merged = self._run(self.case(self.problem, [], seed=self.seeds[-1] + 1, time_it=True),
                                     self.timeouts.timing, "timing")
            self._wrong_alone = set() if fail is not None else set(self._no_bar(merged))
        return self._wrong_alone

    def _score(self, c: _Checked, merged: dict[str, ProgramResult], name: str) -> EvalResult:
        """The verdict of a candidate whose every call was right in a timing job."""
        host_program = merged[HOST]
        if not host_program.correct:
            return EvalResult("error", "timing", "the host-driven program's output was wrong in "
                              f"the timing job: {host_program}")
        rec = merged[name]
        t = rec.ms
        baseline = self.workload.strongest_host(merged)
        host = merged[baseline].ms
        compute, comm = merged["compute_only"].ms, merged["comm_only"].ms
        bound = max(compute, comm)
        default = merged.get("host_nccl_default")
        result = EvalResult("ok", "scored", None, max_error=c.worst,
                            rank_times_ms=rec.rank_ms, time_ms=t,
                            baseline_ms=host, bound_ms=bound, speedup=host / t,
                            overlap_eff=bound / t,
                            extra={"compute_ms": compute, "comm_ms": comm,
                                   # what the strongest host program is made of, and the old one
                                   "host": {k: host_program.notes.get(k) for k in ("gemm", "collective")},
                                   "host_default_ms": default.ms if default is not None else None,
                                   "baseline": baseline,
                                   # the peers (torch's fused ops) that could not join, and why
                                   "peers_skipped": host_program.notes.get("peers_skipped"),
                                   # trusted programs wrong even without a candidate: not the bar
                                   "baselines_wrong_alone": sorted(self._wrong_alone or ()),
                                   "floor_ms": rec.floor_ms,
                                   "calls_verified": rec.calls_verified,
                                   "compile_s": c.compile_s})
        if getattr(self.group, "emulated", False):
            return emulated_verdict(result, c.cand.directives)
        if below_floor(rec):
            result.status, result.stage_reached = "suspect", "timing"
            result.error = (f"{t:.4f} ms is below the physical floor {rec.floor_ms:.4f} ms (this rank's "
                            "GEMM at the measured peak rate, its bytes through HBM and over the "
                            "links at their measured rates, with headroom): it cannot have done "
                            "the work; not scored")
        return result

    @staticmethod
    def _spent(result: EvalResult, spent: dict[str, Any]) -> None:
        """Where the candidate's time went (``cuco search`` shows them per generation)."""
        result.extra.setdefault("seconds", round(spent["seconds"], 3))
        result.extra.setdefault("gpu_s", round(spent["gpu_s"], 3))
        result.extra.setdefault("build_wait_s", round(spent["build_wait_s"], 3))
        result.extra.setdefault("stage_s", {k: round(v, 3) for k, v in spent["stage_s"].items()})

    def _store(self, cand: Candidate, r: EvalResult) -> None:
        if self.verifier_used is not None:  # "process": the checks ran out of the candidate's process
            r.extra.setdefault("verifier", self.verifier_used)
        if self.db is not None:
            store_result(self.db, self.problem.workload, cand, r, self.run_id)


def emulated_verdict(result: EvalResult, d: Directives | None = None) -> EvalResult:
    """A verdict from an emulated world (ranks sharing one GPU): every check stands, but its
    timings measure ranks fighting over one GPU's SMs and HBM, so it carries no speedup, no
    bound and no time; they stay in ``extra`` under ``emulated_*`` for diagnosis only. A GIN
    candidate (``d``) ran on the emulated GIN, not NCCL's: ``extra["gin"] = "emulated"``."""
    extra = dict(result.extra)
    extra.update(emulated=True, emulated_ms=result.time_ms, emulated_baseline_ms=result.baseline_ms,
                 emulated_rank_ms=result.rank_times_ms)
    if d is not None and d.backend is Backend.GIN:
        extra["gin"] = "emulated"
    return EvalResult("ok", "checked", None, max_error=result.max_error, extra=extra)


def neighbours_suspect(fail: EvalResult | None, merged: dict[str, ProgramResult] | None,
                       wrong: list[EvalResult | None]) -> bool:
    """Whether a shared check job's wrong candidates may owe it to another program of the job:
    the job failed (a hang, a crash: whose, it does not say), more than one candidate was
    wrong, the host program was wrong, or the inputs changed (which fails every program).
    Otherwise one candidate wrong among right ones is wrong by its own doing."""
    if fail is not None:
        return True
    assert merged is not None
    return (sum(w is not None for w in wrong) > 1 or not merged[HOST].correct
            or any(not r.inputs_intact for r in merged.values()))


def tampered(merged: dict[str, ProgramResult] | None, names: list[str]) -> set[str]:
    """The candidates of a shared job that changed another's sync region (on any rank)."""
    if merged is None:
        return set()
    return {n for n in names if n in merged and not merged[n].sync_intact}


def second_tries(names: list[str], fail: EvalResult | None, merged: dict[str, ProgramResult] | None,
                 wrong: list[EvalResult | None]) -> list[bool]:
    """Per candidate of a job (``names``, their verdicts there ``wrong``): whether it is judged
    again alone. Never alone already, never one that changed another's sync region (what it
    did in the job is its verdict). Every other wrong one is when a candidate of the job
    tampered (it was disturbed), or where the job points beyond it
    (:func:`neighbours_suspect`); the only one wrong among right neighbours keeps its verdict."""
    if len(names) < 2:
        return [False] * len(names)
    tamperers = tampered(merged, names)
    again = bool(tamperers) or neighbours_suspect(fail, merged, wrong)
    return [w is not None and again and n not in tamperers for n, w in zip(names, wrong)]


def store_result(db: CandidateDB, workload: str, cand: Candidate, r: EvalResult,
                 run_id: int | None = None) -> int:
    """Write a verdict (and the candidate, if it has no row yet); returns the evaluation id."""
    if cand.candidate_id is None:
        cand.candidate_id = db.add_candidate(workload, directives=cand.directives,
                                             source=cand.source, origin="user", run_id=run_id)
    fields = asdict(r)
    extra = dict(fields.pop("extra"))
    versions = extra.pop("versions", None)
    # a dry run's verdict (extra.model) is stored as the model's (evidence), never as measured
    evidence = extra.pop("evidence", None)
    machine = "analytic-model" if extra.get("model") else platform.node()
    return db.add_evaluation(cand.candidate_id, machine=machine, versions=versions,
                             extra=extra, evidence=evidence, **fields)


def evaluator_for(problem: Problem, **kw) -> Evaluator:
    """Evaluator for the registered workload of ``problem`` (any workload)."""
    return Evaluator(for_problem(problem), **kw)
