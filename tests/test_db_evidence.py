"""Measured, emulated and model results are told apart everywhere a speedup is shown.

A dry run's analytic-model verdicts (stored by the real AnalyticEvaluator) and a measured
verdict (stored through ``store_result``, as cuco.Evaluator stores one after its timing
stage) share one database; ``cuco db ls/show`` (a real subprocess), ``best()``, the HTML
report and export's choice of a winner must keep them apart.
"""

from __future__ import annotations

import os
import subprocess
import sys

from cuco import CandidateDB, Directives, make_problem
from cuco.evaluate.analytic import AnalyticEvaluator
from cuco.evaluate.evaluator import Candidate, EvalResult, store_result
from cuco.export import best_callable
from cuco.report import write_report


def cuco(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def row(out: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{out}")


def a_dry_run_and_a_measured_run(path):
    problem = make_problem("gemm_allreduce", "8192x8192x8192", world_size=2)
    db = CandidateDB(path)
    d_model = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
                         comm_ctas=16).check(problem)
    d_measured = Directives(backend="lsa", placement="side_stream", sync_scope="chunk",
                            issuer="cta", comm_ctas=8).check(problem)
    dry = db.create_run("dry", problem.workload, problem=problem.model_dump(), config={"dry_run": True})
    model_id = db.add_candidate(problem.workload, directives=d_model, run_id=dry, origin="offline")
    model = AnalyticEvaluator(problem, db).evaluate(Candidate(d_model, candidate_id=model_id))
    assert model.status == "ok" and model.speedup
    real = db.create_run("real", problem.workload, problem=problem.model_dump())
    measured_id = db.add_candidate(problem.workload, directives=d_measured, run_id=real,
                                   origin="offline")
    speedup = round(model.speedup / 2, 4)  # lower than the model's guess, on purpose
    store_result(db, problem.workload, Candidate(d_measured, candidate_id=measured_id),
                 EvalResult("ok", "scored", max_error=0.002, rank_times_ms=[0.9, 0.91],
                            time_ms=0.91, baseline_ms=0.91 * speedup, bound_ms=0.8,
                            speedup=speedup, overlap_eff=0.88,
                            extra={"versions": {"nccl": "2.28.9"}, "seconds": 3.1}),
                 run_id=real)
    return db, problem, (dry, model_id, model.speedup), (real, measured_id, speedup)


def test_db_ls_and_show_label_the_model_and_best_prefers_the_measurement(tmp_path):
    path = tmp_path / "c.db"
    db, problem, (dry, model_id, model_speedup), (real, measured_id, speedup) = \
        a_dry_run_and_a_measured_run(path)
    ev_model, = db.evaluations(model_id)
    assert (ev_model.evidence, ev_model.machine, ev_model.stage_reached) == ("model", "analytic-model", "model")
    assert db.evaluations(measured_id)[0].evidence == "measured"
    cand, ev = db.best(problem.workload)  # both runs: the model's higher number loses
    assert cand.id == measured_id and ev.speedup == speedup < model_speedup
    assert db.best(problem.workload, run_id=dry)[1].is_model  # a dry run alone still has a best
    assert best_callable(db, dry) == model_id and best_callable(db, real) == measured_id
    db.close()

    r = cuco("db", "ls", "--db", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    dry_row, real_row = row(r.stdout, str(dry)), row(r.stdout, str(real))
    assert dry_row[-2:] == [f"{model_speedup:.3f} (model)", "model"], dry_row
    assert real_row[-2:] == [f"{speedup:.3f}", "measured"], real_row
    assert "analytic-model prediction" in r.stdout

    r = cuco("db", "show", str(model_id), "--db", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    cells = row(r.stdout, str(ev_model.id))
    assert cells[1] == "model" and cells[5].endswith("(model)") and "analytic-model" in cells
    r = cuco("db", "show", str(measured_id), "--db", str(path))
    cells = row(r.stdout, str(ev.id))
    assert cells[1] == "measured" and cells[5] == f"{speedup:.4g}"
    assert "(model)" not in r.stdout


def test_the_report_labels_the_models_numbers(tmp_path):
    db, problem, (dry, model_id, model_speedup), (real, _, speedup) = \
        a_dry_run_and_a_measured_run(tmp_path / "c.db")
    page = write_report(db, tmp_path / "r.html").read_text()
    assert f"<td class=model>{model_speedup:.3f} (model)</td>" in page
    assert f"<td class=measured>{speedup:.3f}</td>" in page
    assert f"Run {dry}: dry (running) — analytic model (dry run)" in page
    assert f"Run {real}: real (running)</h2>" in page
