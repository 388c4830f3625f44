"""Agents on the CPU with the analytic evaluator: islands, migration, the phase
switch, determinism, resume after kill -9, plug-in proposers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cuco import CandidateDB, GemmProblem
from cuco.agents import (
    Budget, EvolutionAgent, FastPathAgent, OfflineProposer, Proposal, SinglePhase, TPEProposer,
    TwoPhaseSchedule,
)
from cuco.agents.api import gpu_space
from cuco.evaluate.analytic import AnalyticEvaluator

P = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)


def agent(db, **kw) -> EvolutionAgent:
    kw.setdefault("space", gpu_space(P))
    return EvolutionAgent(AnalyticEvaluator(P), db, **kw)


def test_multi_island_run_with_migration_and_phase_switch(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    res = agent(db, islands=3, population=4, children=2, migrate_every=2, budget=60).run()
    assert res.evaluations == 60 and res.stopped == "budget"
    cands = db.candidates(run_id=res.run_id)
    assert len(cands) == 60 and {c.island for c in cands} == {0, 1, 2}
    assert all(len(db.evaluations(c.id)) == 1 for c in cands)  # each judged once
    assert db.events(res.run_id, "migration")
    switch = db.events(res.run_id, "phase_switch")
    assert len(switch) == 1 and switch[0]["generation"] == res.phase_switch_generation
    gens = db.events(res.run_id, "generation")
    assert [g["data"]["phase"] for g in gens][-1] == "exploitation"
    best_per_gen = [g["data"]["best"] for g in gens]
    assert best_per_gen == sorted(best_per_gen)  # elitism: the best never gets lost
    assert res.best.score == max(e.speedup or 0 for e in db.evaluations())
    assert cands[0].origin == "fastpath" and any(c.parents for c in cands)


def test_same_seed_same_search(tmp_path):
    runs = []
    for i in range(2):
        db = CandidateDB(tmp_path / f"{i}.db")
        res = agent(db, seed=7, budget=30).run()
        runs.append([c.directives for c in db.candidates(run_id=res.run_id)])
    assert runs[0] == runs[1]
    other = agent(CandidateDB(tmp_path / "x.db"), seed=8, budget=30).run()
    assert [c.directives for c in CandidateDB(tmp_path / "x.db").candidates(run_id=other.run_id)] != runs[0]


def test_offline_search_reaches_the_grid_best_within_a_seventh_of_the_grid(tmp_path):
    """200 evaluations of the 1524 points (100 of 552 before the 192- and 64-wide tiles and
    the 2x1 clusters doubled the in-kernel mainloops; 1092 before the two swapped mainloops
    fitted to the shape; 1308 before their clusters along N)."""
    space = gpu_space(P)
    ev = AnalyticEvaluator(P)
    grid_best = max(ev.evaluate(d).score for d in space.enumerate())
    assert space.size <= 7 * 220
    res = agent(CandidateDB(tmp_path / "c.db"), budget=200, seed=1).run()
    assert res.best.score == pytest.approx(grid_best)


def test_two_phase_and_single_phase_both_run(tmp_path):
    a = agent(CandidateDB(tmp_path / "a.db"), schedule=TwoPhaseSchedule(0.3), budget=40).run()
    b = agent(CandidateDB(tmp_path / "b.db"), schedule=SinglePhase(), budget=40).run()
    assert a.phase_switch_generation is not None and b.phase_switch_generation is None


def test_tpe_proposer_and_fast_path(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    space = gpu_space(P)
    res = agent(db, proposer=TPEProposer(space, seed=0), budget=30).run()
    assert res.evaluations == 30 and any(c.origin == "tpe" for c in db.candidates())
    fp = FastPathAgent(AnalyticEvaluator(P), db, space).run()
    assert fp.rounds == 1 and fp.result.status == "ok"
    assert db.candidate(fp.candidate_id).origin == "fastpath"


class HillClimber:
    """A user's proposer: random restarts, else one step from the best parent."""

    name = "hill"

    def __init__(self, space):
        self.space = space

    def propose(self, parents, phase, rng):
        if rng.random() < 0.2:
            return Proposal(self.space.sample(rng), (), "hill", note="restart")
        return Proposal(self.space.mutate(parents[0].directives, rng, 0.1),
                        (parents[0].candidate_id,), "hill")

    def observe(self, ind):
        pass


def test_plug_in_proposer_and_selection(tmp_path):
    db = CandidateDB(tmp_path / "c.db")
    space = gpu_space(P)
    picks = []

    def first(pop, rng):
        picks.append(len(pop))
        return pop[0]

    res = agent(db, proposer=HillClimber(space), selection=first, budget=25).run()
    assert res.evaluations == 25 and picks
    assert {c.origin for c in db.candidates()} >= {"fastpath", "hill"}


def test_broken_evaluator_does_not_stop_the_search(tmp_path):
    class Flaky(AnalyticEvaluator):
        def evaluate(self, cand):
            if cand.directives.issuer.value == "thread":
                raise RuntimeError("evaluator bug")
            return super().evaluate(cand)

    db = CandidateDB(tmp_path / "c.db")
    res = EvolutionAgent(Flaky(P), db, space=gpu_space(P), budget=30).run()
    assert res.evaluations == 30
    errs = [e for e in db.evaluations() if e.status == "error"]
    assert errs and all("evaluator bug" in e.error for e in errs)


def test_kill_9_then_resume_loses_nothing(tmp_path):
    path = tmp_path / "c.db"
    cmd = [sys.executable, "-c",
           "import sys; from cuco.agents.api import search; from cuco.evaluate.analytic import "
           "AnalyticEvaluator; from cuco import GemmProblem; "
           "p = GemmProblem(workload='gemm_allreduce', m=8192, n=8192, k=8192, world_size=2); "
           f"search(p, db={str(path)!r}, budget=60, "
           "evaluator=AnalyticEvaluator(p, delay_s=0.05), resume=(int(sys.argv[1]) if len(sys.argv) > 1 else None))"]
    proc = subprocess.Popen(cmd)
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.3)
        if path.exists() and CandidateDB(path).count_candidates() >= 15:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    db = CandidateDB(path)
    assert db.integrity_check() == "ok"
    before = {c.id for c in db.candidates()}
    assert 15 <= len(before) < 60
    run_id = db.runs()[0].id
    subprocess.run(cmd + [str(run_id)], check=True, timeout=120)
    after = db.candidates(run_id=run_id)
    assert before <= {c.id for c in after}  # nothing lost
    assert len(after) == 60
    assert all(db.evaluations(c.id) for c in after)  # everything judged, the orphan too
    assert db.run(run_id).status == "done"


def test_cli_search_dry_run_and_missing_gpu_message(tmp_path):
    env = dict(os.environ, COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--dry-run", "--budget", "20",
                        "--islands", "2", "--db", str(tmp_path / "c.db")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "20 evaluations" in r.stdout and "analytic model" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--budget", "5", "--db",
                        str(tmp_path / "d.db"), "--world-size", "64"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 1 and "--dry-run" in r.stderr  # errors go to stderr
    env_nokey = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--dry-run", "--llm",
                        "openai:gpt-4o", "--db", str(tmp_path / "e.db")], capture_output=True,
                       text=True, env=env_nokey, timeout=120)
    assert r.returncode == 1 and "export OPENAI_API_KEY" in r.stderr
    assert not (tmp_path / "e.db").exists()  # refused before the database was made
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "search", "--shape", "8192x8192",
                        "--dry-run"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "MxKxN" in r.stderr


HOST_PROGRAM = """
// row-parallel linear layer: partial GEMM, then a sum over ranks launched from the host
cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k_local, &one, w, CUDA_R_16BF, n,
             x, CUDA_R_16BF, k_local, &zero, y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
ncclAllReduce(y, y, (size_t)m * n, ncclBfloat16, ncclSum, comm, stream);
"""


def test_fastpath_llm_route_feeds_failures_back_until_a_kernel_passes(tmp_path):
    from cuco.agents.fastpath import EMPTY_BLOCK, FastPathAgent
    from cuco.evaluate import Evaluator
    from cuco.evaluate.analytic import AnalyticEvaluator
    from cuco.kernels import Compiler, evolve
    from cuco.llm.recorded import RecordedClient
    from cuco.workloads import GemmAllReduce

    class CompileThenModel(Evaluator):
        """CI has no GPU: the real static and compile stages, then the analytic model."""

        def _evaluate(self, cand, prepared, pending=None):
            r = super()._evaluate(cand, prepared, pending)
            if r.status == "error" and "no worker group" in (r.error or ""):
                return AnalyticEvaluator(self.problem).evaluate(cand.directives)
            return r

    db = CandidateDB(tmp_path / "c.db")
    ev = CompileThenModel(GemmAllReduce(m=1024, n=1024, k=2048, world_size=2),
                          compiler=Compiler(arch="sm_90a", cache_dir=tmp_path / "k"))
    from cuco.agents.api import gpu_space
    agent = FastPathAgent(ev, db, space=gpu_space(ev.problem, ("side_stream",)))  # as cuco.fastpath
    d = agent.space.default()
    right = evolve.blocks(ev.template(ev.problem, d)[0])

    def reply(bodies):
        return "".join(f"{evolve.markers(n)[0]}\n{b}{evolve.markers(n)[1]}\n" for n, b in bodies.items())

    broken = {n: b + "    undefined_thing(0);\n" for n, b in right.items()}
    client = RecordedClient(["It all-reduces the partial GEMM output.",  # no blocks at all
                             reply(broken),  # does not compile
                             reply(right)])
    run = db.create_run("fastpath-llm", "gemm_allreduce")
    res = agent.run_llm(client, HOST_PROGRAM, directives=d, run_id=run)
    assert res.rounds == 3 and res.result.status == "ok"
    assert [s for _, s in res.tried] == ["rejected", "compile_error", "ok"]
    prompts = [r["user"] for r in client.requests]
    assert "ncclAllReduce" in prompts[0] and EMPTY_BLOCK in prompts[0]
    # the scaffold and the answer's format show each block as the scope it is
    assert all(m in prompts[0] for n in right for m in evolve.markers(n))
    assert "no EVOLVE-BLOCK" in prompts[1]
    assert "`compile`" in prompts[2] and "undefined_thing" in prompts[2]
    cands = db.candidates(run_id=run)
    assert [c.origin for c in cands] == ["fastpath-llm", "fastpath-llm"]
    assert cands[-1].source is not None and "undefined_thing" not in cands[-1].source
    calls = {r["status"]: r["calls"] for r in db.llm_summary(run)}
    assert calls == {"rejected": 1, "ok": 2}


def test_the_meta_summary_names_each_change_once():
    """Two candidates that improved by the same change make one line, not the same twice
    (examples/custom_proposer.py printed "-6.4% from comm_ctas=16" two times)."""
    from types import SimpleNamespace
    from cuco.agents.evolution import EvolutionAgent
    same = "-6.4% from comm_ctas=16"
    hist = [{"generation": 3, "phase": "exploit", "best": 1.25, "improved": [same, same, "-2% from issuer=warp"],
             "worsened": ["+1% from x", "+1% from x"], "failed": {}}]
    text = EvolutionAgent.meta_summary(SimpleNamespace(history=hist))
    assert text.count(same) == 1 and "issuer=warp" in text and text.count("+1% from x") == 1
