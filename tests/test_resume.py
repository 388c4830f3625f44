"""``--resume`` is the run's own (issue #40): the stored workload, shape, world size,
proposer, islands and budget are used; a contradicting flag is refused naming the stored
value and leaves the database as it was; a larger budget extends the run; Ctrl-C prints the
exact command that resumes. Real SQLite files, real ``cuco`` subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cuco import CandidateDB
from cuco.errors import InputError

MOE = "tokens=64,hidden=512,ffn=256,experts=8,topk=2"


def cuco(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    env.pop("CUCO_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def snapshot(path) -> tuple:
    """Everything a refused resume must leave as it was."""
    with CandidateDB(path) as db:
        return ([(r.id, r.status, r.config) for r in db.runs()],
                [c.id for c in db.candidates()], [e.id for e in db.evaluations()])


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    """A finished dry run: MoE, TPE, 2 islands, seed 3, budget 16."""
    path = tmp_path_factory.mktemp("resume") / "moe.db"
    r = cuco("search", "--dry-run", "--workload", "moe", "--shape", MOE, "--proposer", "tpe",
             "--islands", "2", "--seed", "3", "--budget", "16", "--db", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    return path


@pytest.fixture
def moe_db(moe_run, tmp_path):
    """A private copy of the finished run (tests that extend it must not share it)."""
    copy = tmp_path / "moe.db"
    copy.write_bytes(moe_run.read_bytes())
    return copy


@pytest.mark.parametrize("flags, needle", [
    (["--workload", "gemm_allreduce"], "run 1 was started with workload moe, not gemm_allreduce; "
     "a resumed run keeps the settings it was started with (leave the value out, or start a new "
     "run without resuming); use --workload moe"),
    (["--shape", "tokens=128"], "run 1 was started with shape tokens=64,hidden=512,ffn=256,"
     "experts=8,topk=2,routing=skewed, not tokens=128"),
    (["--world-size", "4"], "run 1 was started with world size 2, not 4"),
    (["--proposer", "offline"], "run 1 was started with proposer tpe, not offline; "),
    (["--islands", "4"], "run 1 was started with islands 2, not 4"),
    (["--seed", "0"], "run 1 was started with seed 3, not 0"),
    (["--budget", "8"], "run 1 was started with a budget of 16 evaluations (16 recorded); "
     "resuming can extend a budget, not shrink it; use --budget 16"),
    (["--no-dry-run"], "run 1 was a dry run (the analytic model); resume it as one"),
])
def test_a_flag_that_contradicts_the_run_is_refused_and_nothing_changes(moe_db, flags, needle):
    before = snapshot(moe_db)
    r = cuco("search", "--resume", "1", "--db", str(moe_db), *flags)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert needle in out and "Traceback" not in out
    assert snapshot(moe_db) == before


def test_plain_resume_keeps_the_run_and_a_larger_budget_extends_it(moe_db):
    r = cuco("search", "--resume", "1", "--db", str(moe_db))  # no --dry-run, --workload, ...
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run 1: 16 evaluations" in r.stdout and "moe" in r.stdout
    r = cuco("search", "--resume", "1", "--db", str(moe_db), "--budget", "30")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run 1: 30 evaluations, stopped by budget" in r.stdout
    with CandidateDB(moe_db) as db:
        run = db.run(1)
        cands = db.candidates(run_id=1)
        assert len(db.runs()) == 1 and run.status == "done" and run.workload == "moe"
        assert run.config["budget"]["evaluations"] == 30  # a later plain resume keeps 30
        assert run.config["proposer"] == "tpe" and run.config["islands"] == 2
        assert len(cands) == 30 and all(c.workload == "moe" for c in cands)
        assert {c.origin for c in cands if c.generation} == {"tpe"}
        assert all(db.evaluations(c.id) for c in cands)
    r = cuco("search", "--resume", "1", "--db", str(moe_db))
    assert "run 1: 30 evaluations" in r.stdout  # the stored budget is now 30


def test_python_search_resume_takes_the_stored_settings(moe_db):
    from cuco import search
    res = search(db=str(moe_db), resume=1, budget=20)
    assert res.evaluations == 20
    with pytest.raises(InputError, match="use workload='moe'"):
        search("cp_attention", db=str(moe_db), resume=1)
    with CandidateDB(moe_db) as db:
        assert db.count_candidates(1) == 20


def test_ctrl_c_prints_the_exact_command_that_resumes(tmp_path):
    """SIGINT mid-run: exit 130, the run kept as interrupted, and the printed command resumes
    it to its stored budget. The run is long (400 evaluations of 50 ms: 20 s) so that the
    signal lands inside it on a loaded machine, where the first 10 are seen late."""
    db = tmp_path / "c.db"
    proc = subprocess.Popen(
        [sys.executable, "-c",
         # a child of a test worker may inherit SIGINT ignored (Python then installs no
         # KeyboardInterrupt handler): restore Python's own, as a terminal's process has it
         "import signal, sys, typer; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from cuco import cli, GemmProblem; "
         "from cuco.evaluate.analytic import AnalyticEvaluator; "
         "p = GemmProblem(workload='gemm_allreduce', m=8192, n=8192, k=8192, world_size=2)\n"
         "try:\n"
         f"    cli._run_search(p, db={str(db)!r}, budget=400, dry_run=True, islands=2, "
         "evaluator=AnalyticEvaluator(p, delay_s=0.05))\n"
         "except typer.Exit as e:\n    sys.exit(e.exit_code)"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, COLUMNS="300"))
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.2)
        if db.exists() and CandidateDB(db).count_candidates() >= 10:
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert f"Resume with: cuco search --resume 1 --db {db} --dry-run" in out, out
    with CandidateDB(db) as store:
        assert store.run(1).status == "interrupted"
        assert store.run(1).config["budget"]["evaluations"] == 400
    r = cuco("search", "--resume", "1", "--db", str(db), "--dry-run")
    assert r.returncode == 0 and "run 1: 400 evaluations" in r.stdout, r.stdout + r.stderr


def test_tpe_proposal_cost_is_flat(tmp_path):
    """The second half of a TPE run's generations cost no more than the first (Optuna's
    sampler grew with the history: 100 evaluations took minutes)."""
    from cuco import GemmProblem
    from cuco.agents import EvolutionAgent, TPEProposer
    from cuco.agents.api import gpu_space
    from cuco.evaluate.analytic import AnalyticEvaluator
    p = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
    space = gpu_space(p)
    agent = EvolutionAgent(AnalyticEvaluator(p), CandidateDB(tmp_path / "t.db"), space=space,
                           proposer=TPEProposer(space, seed=0), budget=300)
    t0 = time.perf_counter()
    res = agent.run()
    assert res.evaluations == 300 and time.perf_counter() - t0 < 60
    ends = [h["elapsed_s"] for h in res.history]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    half = len(gaps) // 2
    first, second = sum(gaps[:half]) / half, sum(gaps[half:]) / (len(gaps) - half)
    assert second < 3 * first + 0.05, (first, second)


def test_piped_output_shows_a_line_per_generation(tmp_path):
    r = cuco("search", "--dry-run", "--proposer", "tpe", "--budget", "40", "--islands", "2",
             "--db", str(tmp_path / "c.db"))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("generation ")]
    assert lines[0].startswith("generation 0 (seed): 12/40 evaluations, best ")
    assert len(lines) >= 5 and "40/40 evaluations" in lines[-1]
    assert "phase switch at generation None" not in r.stdout


def _slow_search(db, *, budget: int, resume: int | None = None) -> list[str]:
    """``cuco search --dry-run`` into a log, 50 ms an evaluation (so a rate is bounded: at
    most 1200 a minute), ``resume`` continuing a run; its output lines."""
    code = ("import sys, typer; from cuco import cli, GemmProblem; "
            "from cuco.evaluate.analytic import AnalyticEvaluator; "
            "p = GemmProblem(workload='gemm_allreduce', m=8192, n=8192, k=8192, world_size=2)\n"
            "try:\n"
            f"    cli._run_search(p, db={str(db)!r}, budget={budget}, dry_run=True, islands=2, "
            f"resume={resume!r}, evaluator=AnalyticEvaluator(p, delay_s=0.05))\n"
            "except typer.Exit as e:\n    sys.exit(e.exit_code)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="300"), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_a_resumed_run_says_where_it_starts_and_rates_only_its_own_work(tmp_path):
    """The rate once counted the evaluations the database already held as done in the
    resumed process's first seconds (330000/min after a kill -9); the first line said
    nothing of the resume."""
    db = tmp_path / "r.db"
    _slow_search(db, budget=24)
    lines = _slow_search(db, budget=40, resume=1)
    assert lines[0].endswith("40 evaluations; resuming run 1 from its 24 recorded candidate(s)"), lines
    gens = [ln for ln in lines if ln.startswith("generation ")]
    assert gens and "/40 evaluations" in gens[-1], lines
    rates = [int(ln.rsplit(", ", 1)[-1].split("/min")[0]) for ln in gens]
    assert max(rates) <= 1200, gens  # 50 ms an evaluation: no more than 1200 a minute


def test_a_terminal_shows_what_runs_before_the_first_generation_is_judged(tmp_path):
    """On a terminal the live view was blank until generation 0 (24 candidates, minutes on
    GPUs) was judged; it now names the search and says the islands are being seeded."""
    import pty

    db = tmp_path / "t.db"
    code = ("from cuco import cli, GemmProblem; "
            "from cuco.evaluate.analytic import AnalyticEvaluator; "
            "p = GemmProblem(workload='gemm_allreduce', m=8192, n=8192, k=8192, world_size=2)\n"
            f"cli._run_search(p, db={str(db)!r}, budget=12, dry_run=True, islands=2, "
            "evaluator=AnalyticEvaluator(p, delay_s=0.05))")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=follower, stdout=follower,
                            stderr=follower, env=dict(os.environ, COLUMNS="300", TERM="xterm"))
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    seeding = text.find("seeding the islands (generation 0)")
    assert seeding >= 0, text
    assert seeding < text.find("generation 0 (seed)"), text


def test_kill_9_of_the_command_then_db_ls_names_the_resume_that_loses_nothing(tmp_path):
    """``cuco search`` killed with SIGKILL prints nothing; ``cuco db ls`` showed the run as
    ``running`` and no way on. It now prints the command that resumes it, which keeps every
    recorded candidate, judges each once and goes on to the budget."""
    db = tmp_path / "k.db"
    proc = subprocess.Popen([sys.executable, "-m", "cuco.cli", "search", "--dry-run", "--budget",
                             "300", "--islands", "2", "--db", str(db)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
        if db.exists() and CandidateDB(db).count_candidates() >= 40:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with CandidateDB(db) as store:
        assert store.integrity_check() == "ok"
        before = {c.id for c in store.candidates()}
    assert 40 <= len(before) < 300
    listed = cuco("db", "ls", "--db", str(db))
    command = f"cuco search --resume 1 --db {db} --dry-run"
    assert command in listed.stdout, listed.stdout
    r = cuco(*command.split()[1:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming run 1 from its {len(before)} recorded candidate(s)" in r.stdout, r.stdout
    with CandidateDB(db) as store:
        after = store.candidates(run_id=1)
        assert before <= {c.id for c in after} and len(after) == 300  # nothing lost, none over
        assert all(len(store.evaluations(c.id)) == 1 for c in after)  # each judged once
        assert store.run(1).status == "done"
    assert "unfinished" not in cuco("db", "ls", "--db", str(db)).stdout
