"""The evaluator's static and compile stages, and EVOLVE-BLOCK handling (no GPU)."""

from __future__ import annotations

import pytest

from cuco import CandidateDB, Directives
from cuco.evaluate import Evaluator, static_violations
from cuco.kernels import Compiler, evolve
from cuco.workloads import GemmAllReduce, GemmReduceScatter

D = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=16, chunk_bytes=1 << 20)


@pytest.fixture
def ev(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    return Evaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=2), db=db,
                     compiler=Compiler(arch="sm_90a", cache_dir=tmp_path / "k"))


def test_templates_pass_their_own_static_checks():
    for wl in (GemmAllReduce(m=1024, n=1024, k=2048, world_size=2), GemmReduceScatter(m=1024, n=1024, k=2048, world_size=2)):
        src, _ = Evaluator(wl).template(wl.problem, D)
        assert static_violations(src) == []
        assert evolve.edit_violations(src, src) == []


@pytest.mark.parametrize("planted,why", [
    ("printf(\"%d\", 1);", "printf in a kernel"),
    ("__managed__ int leak;", "host or managed memory"),
    ("asm volatile(\"multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];\" : \"=f\"(x) : \"l\"(p));",
     "multimem"),
    ("cudaDeviceSynchronize();", "host synchronisation"),
    ("long long t = clock64();", "reading clocks"),
    # reading host memory: through an address baked in, or a cast of a host pointer value
    ("const uint4 h = *(const uint4*)0x7f3a5c000000ull;", "integer constant"),
    ("auto h = reinterpret_cast<const volatile unsigned*>(139880000000000ull);", "integer constant"),
])
def test_forbidden_constructs_are_refused_before_compiling(ev, planted, why):
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    bad = evolve.splice(src, {"chunk_allreduce": body + "    " + planted + "\n"})
    r = ev.evaluate(D, bad)
    assert r.status == "invalid" and r.stage_reached == "static"
    assert why in r.error
    assert ev.db.evaluations()[-1].status == "invalid"


def test_edits_outside_blocks_are_refused(ev):
    src, _ = ev.template(ev.problem, D)
    r = ev.evaluate(D, src.replace("const size_t slice = kChunkUnits / W;",
                                   "const size_t slice = kChunkUnits / W / 2;"))
    assert r.status == "invalid" and "outside EVOLVE-BLOCKs" in r.error
    r = ev.evaluate(D, src.replace("// EVOLVE-BLOCK-END chunk_allreduce", ""))
    assert r.status == "invalid" and "EVOLVE-BLOCK" in r.error


def test_a_block_is_a_scope_its_frozen_markers_open_and_close(ev):
    """The braces are part of the frozen markers: a candidate that takes one off or moves it
    into a comment is refused, with how a block is written (its body cannot close the scope:
    test_verification_cpu's brace_escape)."""
    src, _ = ev.template(ev.problem, D)
    start, end = evolve.markers("chunk_allreduce")
    how = f"'chunk_allreduce' is not a scope of its own: write '{start}' and '{end}'"
    for bad in (src.replace(end, end[2:]), src.replace(start, start[2:]),
                src.replace(start, start[2:] + " {"), src.replace(end, "}\n" + end[2:])):
        r = ev.evaluate(D, bad)
        assert (r.status, r.stage_reached) == ("invalid", "static") and how in r.error, r.error


def test_compile_errors_come_back_short(ev):
    src, _ = ev.template(ev.problem, D)
    bad = evolve.splice(src, {"chunk_allreduce": "    this is not C++;\n"})
    r = ev.evaluate(D, bad)
    assert r.status == "compile_error" and r.stage_reached == "compile"
    assert "error" in r.error and len(r.error.splitlines()) <= 20


def test_invalid_directives_and_missing_template(ev):
    r = ev.evaluate(Directives(placement="epilogue"))
    assert r.status == "invalid" and "set sync_scope=chunk" in r.error
    r = ev.evaluate(D.replace(chunk_bytes=64 << 20))
    assert r.status == "invalid" and "chunk_bytes" in r.error


def test_without_a_group_gpu_stages_say_what_is_missing(ev):
    r = ev.evaluate(D)
    assert r.status == "error" and "no worker group" in r.error
    # both the target and the small-shape kernel were compiled
    assert r.extra["compile_s"] >= 0


def test_splice_moves_edits_to_another_shape(ev):
    src, _ = ev.template(ev.problem, D)
    small = ev.small_problem()
    small_src, _ = ev.template(small, ev.small_directives(D, small))
    edited = evolve.splice(src, {"chunk_allreduce": "    // edited\n" + evolve.blocks(src)["chunk_allreduce"]})
    moved = evolve.splice(small_src, evolve.blocks(edited))
    assert "// edited" in moved and evolve.edit_violations(small_src, moved) == []
    with pytest.raises(ValueError, match="no EVOLVE-BLOCK named"):
        evolve.splice(small_src, {"nope": ""})


def test_batch_compiles_then_evaluates_each(ev):
    results = ev.evaluate_many([D, Directives(placement="epilogue"),
                                D.replace(issuer="warp")])
    assert [r.status for r in results] == ["error", "invalid", "error"]
    assert len(ev.db.candidates()) == 3 and len(ev.db.evaluations()) == 3


def test_a_user_workload_reuses_a_pattern_and_travels_with_its_jobs(tmp_path):
    from cuco.errors import ShapeError
    from cuco.evaluate.evaluator import Candidate

    class Scaled(GemmAllReduce):  # a "GEMM + epilogue, then AllReduce" of the user's
        family = "scaled_gemm_allreduce"
        pattern = "gemm_allreduce"

    with pytest.raises(ShapeError, match="K=1024 is split over 3 ranks"):
        Scaled(m=1024, n=1024, k=1024, world_size=3)
    wl = Scaled(m=1024, n=1024, k=2048, world_size=2)
    assert wl.problem.workload == "scaled_gemm_allreduce"
    assert wl.pattern_problem.workload == "gemm_allreduce"
    db = CandidateDB(tmp_path / "c.db")
    ev = Evaluator(wl, db=db, compiler=Compiler(arch="sm_90a", cache_dir=tmp_path / "k"))
    job = ev.case(ev.problem, None, seed=1, time_it=False)  # the instance travels with the job
    assert type(job.workload) is Scaled and job.workload.problem == wl.problem
    small = ev.case(ev.small_problem(), None, seed=1, time_it=False).workload
    assert type(small) is Scaled and small.problem.m == 512  # the same class at the small shape
    import cloudpickle
    assert type(cloudpickle.loads(cloudpickle.dumps(job)).workload).__name__ == "Scaled"
    r = ev.evaluate(Candidate(D))
    assert r.stage_reached == "compile" and "no worker group" in r.error  # static + compile passed
    assert [c.workload for c in db.candidates()] == ["scaled_gemm_allreduce"]


def test_a_search_reports_where_each_generation_spent_its_time(ev):
    """Build CPU seconds, GPU job seconds and GPU seconds waiting on builds reach the
    generation summary (what `cuco search`'s live view shows); the builds are real nvcc runs."""
    from cuco.agents import EvolutionAgent
    from cuco.design import DesignSpace

    space = DesignSpace(ev.problem, backend=["lsa"], placement=["side_stream"], sync_scope=["chunk"],
                        issuer=["cta", "warp"], comm_ctas=[16], chunk_bytes=[1 << 20],
                        tile_n=[128], stages=[4], tile_m=[128])
    seen = []
    EvolutionAgent(ev, ev.db, space=space, islands=1, population=2, children=1, budget=2,
                   on_progress=seen.append).run()
    assert seen and all({"compile_s", "gpu_s", "build_wait_s"} <= set(s) for s in seen)
    assert sum(s["compile_s"] for s in seen) > 0  # two candidates were compiled from scratch
    assert sum(s["gpu_s"] for s in seen) == 0  # no worker group: no GPU job ran


def _sleeps(pool, *seconds: float):
    """Futures of real processes of these lengths (stand-ins for a candidate's builds)."""
    import subprocess

    def build(s: float) -> float:
        subprocess.run(["sleep", str(s)], check=True)
        return s
    return tuple(pool.submit(build, s) for s in seconds)


def test_a_batch_is_judged_in_the_order_its_builds_finish():
    """evaluate_many's order: candidates with nothing to build first, then each as soon as
    both its builds are done."""
    from concurrent.futures import ThreadPoolExecutor
    from cuco.evaluate.batching import in_build_batches

    with ThreadPoolExecutor(max_workers=6) as pool:
        pending = [_sleeps(pool, 1.2, 0.1),   # slow: waits on its slow half
                   None,                      # failed before building
                   _sleeps(pool, 0.1, 0.2),   # fast
                   _sleeps(pool, 0.6, 0.1)]
        order = [i for batch in in_build_batches(pending, 1) for i in batch]
        assert order == [1, 2, 3, 0]
        assert all(f.done() for p in pending if p for f in p)


def test_what_is_built_when_the_gpus_are_free_is_checked_together():
    """Each time the caller comes back from the GPUs, every candidate built meanwhile comes
    in one group (at most ``most``); while none is built, it waits for the first."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from cuco.evaluate.batching import in_build_batches

    with ThreadPoolExecutor(max_workers=8) as pool:
        pending = [_sleeps(pool, 2.0), None, _sleeps(pool, 0.1, 0.2), _sleeps(pool, 0.4), _sleeps(pool, 0.3)]
        batches = []
        for batch in in_build_batches(pending, 2):
            batches.append(batch)
            if len(batches) == 1:
                time.sleep(1.0)  # the GPUs busy with the first group: three builds finish
        assert batches == [[1], [2, 3], [4], [0]]


def test_shared_jobs_name_each_candidate_and_scale_their_timeout():
    from cuco.evaluate.batching import shared_names, shared_timeout
    from cuco.evaluate.jobs import VariantSpec
    specs = [VariantSpec("x", D.to_json(), f"{j}.cubin") for j in range(3)]
    assert [s.name for s in shared_names(specs[:1])] == ["candidate"]
    assert [(s.name, s.cubin) for s in shared_names(specs)] == [
        ("candidate0", "0.cubin"), ("candidate1", "1.cubin"), ("candidate2", "2.cubin")]
    assert shared_timeout(60.0, 1) == 60.0 and shared_timeout(60.0, 3) == 120.0


def test_only_timing_jobs_carry_the_other_host_programs(ev):
    """The baseline is the fastest host program, so the others are timed (and verified) where
    it is chosen; check-only stages check the candidate against host_nccl's accuracy alone."""
    from cuco.evaluate.jobs import VariantSpec
    spec = VariantSpec("candidate", D.to_json(), "unused.cubin")
    check = ev.case(ev.problem, spec, seed=1, time_it=False)
    timing = ev.case(ev.problem, spec, seed=1, time_it=True)
    assert (check.time, check.baselines) == (False, False)
    assert (timing.time, timing.baselines) == (True, True)


def test_torchs_fused_ops_join_timing_jobs_unless_asked_not_to_or_emulated(ev):
    """A TP candidate's baseline may be torch's fused op (issue #36): the timing job carries
    the peers (verified like any program), check-only stages do not; an emulated world times
    nothing, so it carries none; ``peers=False`` leaves them out."""
    from types import SimpleNamespace

    from cuco.evaluate.jobs import VariantSpec
    from cuco.workloads.tp import torch_fused
    spec = VariantSpec("candidate", D.to_json(), "unused.cubin")
    assert torch_fused.PEER in ev.workload.host_programs  # it can be chosen as the baseline
    assert ev.case(ev.problem, spec, seed=1, time_it=True).peers
    assert not ev.case(ev.problem, spec, seed=1, time_it=False).peers
    ev.group = SimpleNamespace(emulated=True)
    assert not ev.case(ev.problem, spec, seed=1, time_it=True).peers
    ev.group, ev.peers = None, False
    assert not ev.case(ev.problem, spec, seed=1, time_it=True).peers


def test_the_full_stage_checks_both_fresh_seeds_in_one_job(ev):
    """One job carries both seeds' input sets (the checks of two jobs, one dispatch)."""
    from cuco.evaluate.jobs import VariantSpec
    spec = VariantSpec("candidate", D.to_json(), "unused.cubin")
    full = ev.case(ev.problem, spec, seed=ev.seeds, time_it=False)
    assert full.seed == ev.seeds and len(set(ev.seeds)) == 2
    assert (full.time, full.baselines) == (False, False)


class _StandInJob:
    """What a GPU stage job returns, from a CPU worker: every program right and timed,
    except the candidate named ``wrong_together``, whose timed calls go wrong only when it
    shares its timing job with other candidates (as one that disturbed the others would);
    in check-only jobs (the candidates told by ``comm_ctas``: the small stage's directives are
    cut to fit), ``wrong_checked_together``'s is wrong only beside other candidates,
    ``wrong_checked``'s always, and a full-stage job (``full``) that ``fail_shared_full``'s
    shares with others fails as a whole."""

    def __init__(self, specs, time_it: bool, wrong_together: str, wrong_checked_together: int = 0,
                 wrong_checked: int = 0, full: bool = False, fail_shared_full: int = 0):
        self.names = [s.name for s in specs]
        self.directives = [s.directives for s in specs]
        self.time_it, self.wrong_together = time_it, wrong_together
        self.wrong_checked_together, self.wrong_checked, self.full = wrong_checked_together, wrong_checked, full
        self.fail_shared_full = fail_shared_full

    def wrong(self, d: str) -> bool:
        shared = len(self.names) > 1
        if self.time_it:
            return shared and d == self.wrong_together
        ctas = Directives.from_json(d).comm_ctas
        return (shared and ctas == self.wrong_checked_together) or ctas == self.wrong_checked

    def __call__(self, ctx):
        import time
        time.sleep(0.05)
        from cuco.runtime.records import ProgramRecord, RankResult
        ctas = [Directives.from_json(d).comm_ctas for d in self.directives]
        if self.full and len(ctas) > 1 and self.fail_shared_full in ctas:
            raise RuntimeError("stand-in: the shared job failed")
        out = {"host_nccl": ProgramRecord(rel_l2_error=1e-3),
               "host_nccl_default": ProgramRecord(rel_l2_error=1e-3)}
        for name, d in zip(self.names, self.directives):
            wrong = self.wrong(d)
            out[name] = ProgramRecord(correct=not wrong, rel_l2_error=1e-3, bad_elements=7 * wrong,
                                      calls_verified=12)
        if self.time_it:
            for i, name in enumerate(out):
                out[name].median_ms = 2.0 if name.startswith("host") else 1.0 + 0.1 * i
            out["compute_only"] = ProgramRecord(verified=False, median_ms=0.9)
            out["comm_only"] = ProgramRecord(verified=False, median_ms=0.4)
        return RankResult(ctx.rank, out)


def test_a_batch_times_its_checked_candidates_together_and_a_wrong_one_alone_only_beside_others(tmp_path):
    """evaluate_many times up to ``timing_batch`` candidates that passed their checks in one
    job. The only candidate wrong there among right neighbours keeps that verdict (alone it
    would have had one try too); two wrong in one job may owe it to each other, so each is
    timed again alone and that verdict counts. CPU worker processes run stand-ins for the
    GPU jobs; the builds are real nvcc runs."""
    import sys
    import cloudpickle
    from cuco.runtime import WorkerGroup
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    jobs: list[tuple[int, bool]] = []
    shy = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=1 << 20)

    class StandInEvaluator(Evaluator):
        def warm_up(self):
            self.warm, self._respawns = True, self.group.respawns

        def case(self, problem, spec, *, seed, time_it):
            specs = spec if isinstance(spec, list) else [spec]
            jobs.append((len(specs), time_it))
            return _StandInJob(specs, time_it, shy.to_json())

    with WorkerGroup(1, gpu=False) as group:
        db = CandidateDB(tmp_path / "c.db")
        ev = StandInEvaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=1), group=group, db=db, timing_batch=4,
                              compiler=Compiler(arch="sm_90a", cache_dir=tmp_path / "k"))
        results = ev.evaluate_many([D, shy, D, D])
        timing = [n for n, timed in jobs if timed]
        assert timing == [4], jobs  # all four together; shy, alone wrong there, not again
        assert [r.status for r in results] == ["ok", "wrong", "ok", "ok"], [r.error for r in results]
        assert results[1].stage_reached == "timing" and results[1].score == 0.0
        assert [r.extra["timed_with"] for r in results] == [4, 4, 4, 4]
        assert all(r.speedup and r.speedup > 1 and "timing" in r.extra["stage_s"]
                   for r in results if r.status == "ok")
        assert len(db.evaluations()) == 4  # each verdict stored once
        jobs.clear()
        results = ev.evaluate_many([D, shy, shy, D])
    timing = [n for n, timed in jobs if timed]
    assert timing == [4, 1, 1], jobs  # two wrong together: each timed again alone
    assert [r.status for r in results] == ["ok"] * 4, [r.error for r in results]
    assert [r.extra["timed_with"] for r in results] == [4, 1, 1, 4]


def _batch_of_stand_ins(tmp_path, monkeypatch, cands, **stand_in):
    """``evaluate_many(cands)`` with every build done before the GPUs ask (one group), CPU
    workers running stand-in jobs (``stand_in``: :class:`_StandInJob`'s check-stage knobs); the builds
    are real nvcc runs. Returns the jobs, as (stage, candidates), and the verdicts."""
    import sys
    import cloudpickle
    from cuco.evaluate import evaluator as evaluator_module
    from cuco.evaluate.batching import in_build_batches
    from cuco.runtime import WorkerGroup
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    def all_built_first(pending, most):
        for futures in pending:
            for f in futures or ():
                f.result()
        yield from in_build_batches(pending, most)
    monkeypatch.setattr(evaluator_module, "in_build_batches", all_built_first)
    jobs: list[tuple[str, int]] = []

    class StandInEvaluator(Evaluator):
        def warm_up(self):
            self.warm, self._respawns = True, self.group.respawns

        def case(self, problem, spec, *, seed, time_it):
            specs = spec if isinstance(spec, list) else [spec]
            full = problem == self.problem and not time_it
            jobs.append(("timing" if time_it else "full" if full else "small", len(specs)))
            return _StandInJob(specs, time_it, "", full=full, **stand_in)

    with WorkerGroup(1, gpu=False) as group:
        ev = StandInEvaluator(GemmAllReduce(m=1024, n=1024, k=2048, world_size=1), group=group,
                              db=CandidateDB(tmp_path / "c.db"), timing_batch=8, check_batch=8,
                              compiler=Compiler(arch="sm_90a", cache_dir=tmp_path / "k"))
        results = ev.evaluate_many(cands)
    assert len(ev.db.evaluations()) == len(cands)  # each verdict stored once
    return jobs, results


SHY = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=1 << 20)
BAD = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=4, chunk_bytes=1 << 20)


def test_a_batch_checks_what_is_built_together_and_wrong_ones_alone_only_beside_others(tmp_path, monkeypatch):
    """Candidates built by the time the GPUs are free share each check stage's job. In the
    small job two are wrong, so either may owe it to the other: both are checked again alone,
    and ``shy`` (wrong only beside others) passes there while ``bad`` fails. In the full job
    ``shy`` is the only one wrong among right neighbours: that is its verdict, with no second
    try (alone it would have had one). Each candidate's stage seconds are its share of the
    jobs it was in, and its own jobs."""
    jobs, results = _batch_of_stand_ins(tmp_path, monkeypatch, [D, SHY, D, BAD, D],
                                        wrong_checked_together=SHY.comm_ctas, wrong_checked=BAD.comm_ctas)
    assert jobs == [("small", 5), ("small", 1), ("small", 1), ("full", 4), ("timing", 3)], jobs
    assert [(r.status, r.stage_reached) for r in results] == [
        ("ok", "scored"), ("wrong", "full"), ("ok", "scored"), ("wrong", "small"), ("ok", "scored")]
    s_ok, s_shy = results[0].extra["stage_s"], results[1].extra["stage_s"]
    assert 0 < s_ok["small"] < s_shy["small"]  # shy's job alone too
    assert s_ok["full"] == pytest.approx(s_shy["full"], abs=2e-3)  # one share each, no job alone
    assert all(r.extra["timed_with"] == 3 for r in results if r.status == "ok")


def test_every_candidate_of_a_failed_shared_check_job_is_checked_alone(tmp_path, monkeypatch):
    """A shared job that fails (here an exception in the worker) says nothing of whose it was:
    each of its candidates is checked again alone, and that verdict is its own."""
    jobs, results = _batch_of_stand_ins(tmp_path, monkeypatch, [D, SHY, D], fail_shared_full=SHY.comm_ctas)
    assert jobs == [("small", 3), ("full", 3), ("full", 1), ("full", 1), ("full", 1), ("timing", 3)], jobs
    assert [r.status for r in results] == ["ok"] * 3, [r.error for r in results]


def test_only_a_real_worlds_timing_job_measures_the_floor():
    """The physical floor bounds a scored time: a check-only job and an emulated world's job
    (whose times mean nothing) measure no peaks, which at W = 4 on one GPU all-gathered
    256 MiB per rank over sockets in every job after a respawn; a real timing job does."""
    from cuco.evaluate.jobs import Case
    from cuco.runtime.worker import WorkerContext, WorkerOptions

    def ctx(emulated: bool) -> WorkerContext:
        c = WorkerContext(rank=0, world_size=2, device=0,
                          options=WorkerOptions(gpu=False, nccl=False, emulated=emulated))
        c.scratch["peaks"] = {"gemm_tflops": 500.0, "hbm_gbs": 3000.0, "link_gbs": 300.0}  # as measured
        return c

    wl = GemmAllReduce(m=4096, n=4096, k=4096, world_size=2)
    assert Case(wl, time=True).floor_ms(ctx(emulated=False)) > 0
    assert Case(wl, time=False).floor_ms(ctx(emulated=False)) == 0.0
    assert Case(wl, time=True).floor_ms(ctx(emulated=True)) == 0.0


def test_prebuild_builds_on_all_cores_and_evaluate_then_finds_the_builds(ev):
    """Evaluator.prebuild: every candidate's kernels built without a GPU (a wrong edit says
    why, aligned with its candidate); a later evaluate compiles nothing (its compile_s is 0:
    the cache held both builds)."""
    from cuco.evaluate import Candidate
    src, _ = ev.template(ev.problem, D)
    body = evolve.blocks(src)["chunk_allreduce"]
    broken = evolve.splice(src, {"chunk_allreduce": body + "    this_is_no_cuda;\n"})
    forbidden = evolve.splice(src, {"chunk_allreduce": body + "    printf(0);\n"})
    why = ev.prebuild([Candidate(D), Candidate(D, broken), Candidate(D, forbidden)])
    assert why[0] is None
    assert why[1] is not None and "this_is_no_cuda" in why[1]
    assert why[2] is not None and "printf" in why[2]
    r = ev.evaluate(D)  # no worker group: stops after the compile stage, which found both builds
    assert r.stage_reached == "compile" and "no worker group" in (r.error or ""), r.error
    assert r.extra["compile_s"] == 0.0


def test_timing_iters_that_leave_no_timed_call_are_refused_with_the_fix():
    """Every timing job checks N_CHECKED calls of each program; fewer iterations than that
    failed on every rank only after the correctness job had run (test_tp_gpu's too_wide)."""
    from cuco.errors import InputError
    from cuco.evaluate import Evaluator
    from cuco.evaluate.jobs import N_CHECKED
    from cuco.workloads import GemmAllReduce

    wl = GemmAllReduce(m=512, n=1024, k=2048, world_size=2)
    with pytest.raises(InputError) as e:
        Evaluator(wl, timing_iters=N_CHECKED)
    assert f"timing_iters={N_CHECKED} leaves no timed call" in str(e.value)
    assert str(e.value).endswith(f"use timing_iters={4 * N_CHECKED}")
    assert Evaluator(wl, timing_iters=N_CHECKED + 1).timing_iters == N_CHECKED + 1


def test_an_evaluator_takes_a_problem_as_the_examples_say_and_refuses_anything_else():
    """examples/coordinate_descent.py says to swap in ``Evaluator(problem, ...)``: a problem
    stands for its workload; anything else is refused in one line, not an AttributeError."""
    import cuco
    from cuco.errors import InputError
    from cuco.evaluate import Evaluator
    from cuco.workloads import GemmAllReduce
    ev = Evaluator(cuco.make_problem("gemm_allreduce", "1024x1024x2048", world_size=2))
    assert isinstance(ev.workload, GemmAllReduce) and ev.workload.world_size == 2
    with pytest.raises(InputError, match="takes a workload or a problem, not str"):
        Evaluator("gemm_allreduce")
