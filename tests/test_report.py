"""The HTML report from a database with real (recorded-LLM, analytic-evaluator) runs,
opened in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuco import CandidateDB, GemmProblem
from cuco.agents import EvolutionAgent
from cuco.agents.api import gpu_space
from cuco.agents.llm_proposer import LLMProposer
from cuco.evaluate.analytic import AnalyticEvaluator
from cuco.kernels.tp import render_tp
from cuco.llm import RecordedClient
from cuco.report import write_report

P = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
LINE = "const uint4 v = reduce_peers(a, p_off, byte);"
GOOD = (f"<<<<<<< SEARCH\n      {LINE}\n=======\n      {LINE}  // tuned\n>>>>>>> REPLACE")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    db = CandidateDB(tmp / "c.db")
    space = gpu_space(P)
    EvolutionAgent(AnalyticEvaluator(P), db, space=space, islands=3, population=4, budget=30,
                   seed=4, migrate_every=2).run()
    llm = EvolutionAgent(AnalyticEvaluator(P), db, space=space, islands=2, population=3,
                         budget=12, seed=5, name="llm-demo")
    llm.proposer = LLMProposer(RecordedClient([{"text": GOOD, "model": "gpt-4o", "prompt_tokens": 3000,
                                                "completion_tokens": 200}, "no edit here"]),
                               space, lambda d: render_tp(P, d)[0].source)
    llm.run()
    return write_report(db, tmp / "report.html")


def test_report_has_every_section(report):
    text = report.read_text()
    for marker in ("id=best", "id=fitness-1", "id=failures-1", "id=fitness-2", "id=diff-1",
                   "Lineage of the best", "rejected", "gpt-4o", "exploitation"):
        assert marker in text, marker
    assert text.count("<svg") == 4
    # nothing is fetched: no scripts, stylesheets, images or fonts from elsewhere
    for fetch in ("<script", "<link", 'src="http', "src='http", "url(http", '<img src="http'):
        assert fetch not in text, fetch


def test_cli_report(tmp_path, report):
    db = report.parent / "c.db"
    out = tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-m", "cuco.cli", "report", str(db), "-o", str(out),
                        "--run", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "id=fitness-2" in out.read_text() and "id=fitness-1" not in out.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    url = report.resolve().as_uri()
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'u1'}",
                          "--enable-logging=stderr", "--v=0", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 4
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'u2'}",
                    "--window-size=1200,2400", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("CUCO_ARTIFACTS"):
        shutil.copy(shot, Path(os.environ["CUCO_ARTIFACTS"]) / "report.png")


def _cuco(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="300")
    env.pop("CUCO_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_every_number_of_a_dry_runs_best_row_says_model(tmp_path):
    """The best table labelled a dry run's speedup as the model's but printed its time and
    overlap as plain numbers, as if measured."""
    db = CandidateDB(tmp_path / "c.db")
    EvolutionAgent(AnalyticEvaluator(P), db, space=gpu_space(P), islands=2, budget=8).run()
    text = write_report(db, tmp_path / "r.html").read_text()
    best = text[text.index("<table id=best>"):]
    best = best[:best.index("</table>")]
    row = best[best.index("</tr>") + 5:]  # the first run's row, after the header
    cells = row.split("<td")[5:]  # speedup, vs PyTorch, overlap, ms
    assert len(cells) == 4, row
    assert all("(model)" in c for c in cells), row


def test_report_of_a_database_with_no_run_is_one_line_and_no_page(tmp_path):
    """An empty database gave a page of empty tables and exit 0."""
    CandidateDB(tmp_path / "empty.db").close()
    out = tmp_path / "r.html"
    r = _cuco("report", str(tmp_path / "empty.db"), "-o", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "holds no search run: nothing to report" in lines[0], lines
    assert "cuco search --dry-run --db" in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_report_of_only_failed_candidates_says_so(tmp_path):
    path = tmp_path / "failed.db"
    with CandidateDB(path) as db:
        run = db.create_run("t", P.workload, problem=P.model_dump())
        cid = db.add_candidate(P.workload, run_id=run, directives=gpu_space(P).default())
        db.add_evaluation(cid, stage_reached="compile", status="compile_error", error="nvcc: x")
    out = tmp_path / "r.html"
    r = _cuco("report", str(path), "-o", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no candidate of any run is correct: the page shows where they failed" in r.stdout
    assert "no correct candidate" in out.read_text() and "id=failures-1" in out.read_text()
