"""Wrong input never gives a plausible number: every mistake of issue #25 is refused with
one line that names the fix, the right exit status, and no traceback (real subprocesses,
real SQLite files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cuco import CandidateDB, Directives


def cuco(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    full = dict(os.environ, COLUMNS="200", **(env or {}))
    full.pop("CUCO_DEBUG", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "cuco.cli", *args], capture_output=True,
                          text=True, env=full, timeout=300, cwd=cwd)


def refused(r: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """``r`` exited with ``code``, printed every needle, and no traceback."""
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert "Traceback" not in out and "File \"" not in out, out
    for n in needles:
        assert n in out, f"{n!r} not in:\n{out}"
    return out


@pytest.fixture
def corrupt(tmp_path):
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not a database\n" * 200)
    return path


@pytest.fixture
def scored(tmp_path):
    """A database with one run and one candidate the analytic model scored."""
    path = tmp_path / "scored.db"
    with CandidateDB(path) as db:
        from cuco.design import GemmProblem
        problem = GemmProblem(workload="gemm_allreduce", m=2048, n=4096, k=4096, world_size=2)
        run = db.create_run("t", "gemm_allreduce", problem=problem.model_dump())
        cid = db.add_candidate("gemm_allreduce", run_id=run, directives=Directives(
            backend="lsa", placement="side_stream", sync_scope="chunk", issuer="warp",
            chunk_bytes=1 << 20, comm_ctas=8))
        db.add_evaluation(cid, stage_reached="timing", status="ok", speedup=1.4, time_ms=1.0,
                          machine="analytic-model", extra={"model": True})
    return path, cid


# ---- wrong input gave a result and exit 0 ------------------------------------------------
def test_misspelt_workload_is_refused_with_the_close_match(tmp_path):
    db = tmp_path / "c.db"
    out = refused(cuco("search", "--workload", "gemm_alreduce", "--dry-run", "--db", str(db)), 2,
                  "unknown workload 'gemm_alreduce'", "did you mean --workload gemm_allreduce?")
    assert "speedup" not in out and len(out.strip().splitlines()) == 1
    assert not db.exists()  # refused before any database is opened


def test_unknown_workload_in_python_problem_and_search(tmp_path):
    from cuco import GemmProblem, search
    from cuco.errors import InputError
    with pytest.raises(InputError, match="unknown workload 'bogus'"):
        GemmProblem(workload="bogus", m=8192, n=8192, k=8192, world_size=2)
    with pytest.raises(InputError, match="did you mean workload='allgather_gemm'"):
        search("allgather_gem", "8192x8192x8192", db=tmp_path / "c.db", dry_run=True, budget=4)
    assert not (tmp_path / "c.db").exists()


@pytest.mark.parametrize("value", ["-5", "0"])
def test_budget_below_one(tmp_path, value):
    refused(cuco("search", "--dry-run", "--budget", value, "--db", str(tmp_path / "c.db")), 2,
            f"budget {value} is not a number of evaluations", "use --budget 100")
    assert not (tmp_path / "c.db").exists()


def test_unknown_proposer(tmp_path):
    refused(cuco("search", "--dry-run", "--proposer", "bogus", "--db", str(tmp_path / "c.db")), 2,
            "unknown proposer 'bogus'", "offline, tpe", "--proposer offline")
    refused(cuco("search", "--dry-run", "--proposer", "tpee", "--db", str(tmp_path / "c.db")), 2,
            "did you mean --proposer tpe?")


def test_zero_islands(tmp_path):
    refused(cuco("search", "--dry-run", "--islands", "0", "--db", str(tmp_path / "c.db")), 2,
            "islands 0 is not a number of islands", "--islands 4")


def test_unknown_llm_spec(tmp_path):
    refused(cuco("search", "--dry-run", "--llm", "gpt4", "--db", str(tmp_path / "c.db")), 2,
            "unknown LLM provider in 'gpt4'", "--llm openai:")


# ---- tracebacks where a message belongs ----------------------------------------------------
@pytest.mark.parametrize("cmd", [["db", "ls", "--db"], ["db", "show", "1", "--db"], ["report"]])
def test_corrupt_database(corrupt, tmp_path, cmd):
    args = [*cmd, str(corrupt)] + (["-o", str(tmp_path / "r.html")] if cmd == ["report"] else [])
    refused(cuco(*args), 1, "file is not a database", "not a cuco database")


def test_a_database_path_that_is_a_directory_names_a_file_in_it(tmp_path):
    refused(cuco("db", "ls", "--db", str(tmp_path)), 1, "it is a directory",
            f"give a database file in it ({tmp_path / 'cuco.db'})")


def test_a_sqlite_url_to_no_file_is_no_database_and_makes_none(tmp_path):
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    refused(cuco("db", "ls", "--db", url), 1, "no candidate database at", "pass --db PATH")
    assert not (tmp_path / "typo.db").exists()



@pytest.fixture
def read_only_folder(tmp_path):
    """A folder holding a database, that this process cannot write (mode 555, or for root,
    which mode bits do not stop, the immutable attribute)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    with CandidateDB(folder / "s.db") as db:
        db.create_run("kept", "gemm_allreduce")
    folder.chmod(0o555)
    immutable = os.access(folder, os.W_OK) and subprocess.run(
        ["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("no way to make a folder read-only to this process")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_database_in_a_read_only_folder_is_one_line_naming_the_folder(read_only_folder):
    """It said the database was 'not a cuco database or damaged' (exit 1)."""
    db = read_only_folder / "s.db"
    before = db.read_bytes()
    for args in (["db", "ls", "--db", str(db)], ["report", str(db), "-o", str(db.parent.parent / "r.html")],
                 ["search", "--dry-run", "--budget", "4", "--db", str(read_only_folder / "new.db")]):
        out = refused(cuco(*args), 2, f"the folder {read_only_folder} is read-only",
                      "choose a database in a folder you can write")
        assert len(out.strip().splitlines()) == 1 and "damaged" not in out, out
    assert db.read_bytes() == before and sorted(p.name for p in read_only_folder.iterdir()) == ["s.db"]


def test_writing_into_a_read_only_folder_names_the_flag_before_any_work(read_only_folder, tmp_path):
    """export's -o gave an OS error naming no flag, after its kernel was compiled; report's
    -o and tune's --table the same after their work."""
    db = tmp_path / "w.db"
    with CandidateDB(db) as store:
        store.create_run("kept", "gemm_allreduce")
    for args, flag, target in (
            (["export", "1", "-o", str(read_only_folder / "art"), "--db", str(db)], "-o", "art"),
            (["report", str(db), "-o", str(read_only_folder / "r.html")], "-o", "r.html"),
            (["tune", "gemm_allreduce", "--n", "4096", "--k", "4096", "--dry-run", "--m", "64", "--only",
              "--table", str(read_only_folder / "t.json")], "--table", "t.json")):
        out = refused(cuco(*args), 2, f"{flag} {read_only_folder / target}: {read_only_folder} is read-only",
                      f"give {flag} a path you can write")
        assert len(out.strip().splitlines()) == 1, out
    assert sorted(p.name for p in read_only_folder.iterdir()) == ["s.db"]


@pytest.mark.parametrize("args, needle", [
    (["search", "--dry-run", "--budget", "abc"],
     "Invalid value for '--budget': Input should be a valid integer"),
    (["db", "ls", "c.db"], "Got unexpected extra argument(s) (c.db); name a database with --db: cuco db ls --db c.db"),
    (["tune", "gemm_allreduce", "--n", "4096", "--table", "t.json"],
     "Missing option '--k'; see `cuco tune --help`"),
    (["search", "--budgett", "5"], "No such option: --budgett"),
])
def test_a_flag_typer_cannot_parse_is_one_line(tmp_path, args, needle):
    """Typer's own parse errors were a boxed panel of several lines."""
    out = refused(cuco(*args, cwd=tmp_path), 2, needle)
    assert len(out.strip().splitlines()) == 1 and "╭" not in out, out
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_of_any_command_says_it_was_interrupted(tmp_path):
    """Typer turned Ctrl-C outside a search into exit 130 with nothing printed."""
    plugin = tmp_path / "slow.py"
    plugin.write_text("import time\ntime.sleep(60)\n")  # a long step: loading the user's ops
    env = dict(os.environ, COLUMNS="200")
    env.pop("CUCO_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, "
         "signal.default_int_handler); from cuco.cli import main; sys.argv[1:] = "
         f"['--plugin', {str(plugin)!r}, 'db', 'ls']; main()"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert out.strip() == "interrupted (Ctrl-C): stopped before it finished", out

def test_debug_keeps_the_traceback(corrupt):
    r = cuco("db", "ls", "--db", str(corrupt), env={"CUCO_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stdout + r.stderr
    r = cuco("--debug", "db", "ls", "--db", str(corrupt))
    assert r.returncode != 0 and "DatabaseError" in r.stdout + r.stderr


def test_world_size_zero_and_zero_dimension(tmp_path):
    refused(cuco("search", "--dry-run", "--world-size", "0", "--db", str(tmp_path / "c.db")), 2,
            "world_size 0 is not a number of GPUs", "--world-size 2")
    refused(cuco("search", "--dry-run", "--shape", "0x8192x8192", "--db", str(tmp_path / "c.db")), 2,
            "M=0 is not a matrix dimension", "--shape 8192x8192x8192")


def test_resume_of_an_unknown_run(tmp_path):
    db = tmp_path / "c.db"
    CandidateDB(db).close()
    refused(cuco("search", "--dry-run", "--resume", "77", "--db", str(db)), 2,
            "no run 77", "cuco db ls", "--resume")


def test_report_into_a_missing_directory(scored, tmp_path):
    db, _ = scored
    refused(cuco("report", str(db), "-o", str(tmp_path / "missing_dir" / "r.html")), 2,
            "missing_dir does not exist", "-o report.html")


def test_report_unknown_run(scored, tmp_path):
    db, _ = scored
    refused(cuco("report", str(db), "--run", "9", "-o", str(tmp_path / "r.html")), 2, "no run 9")


# ---- unclear messages ------------------------------------------------------------------------
def test_shape_whose_rows_are_not_16_byte_units_names_the_dimension(tmp_path):
    out = refused(cuco("search", "--dry-run", "--shape", "3000x8192x8191", "--db", str(tmp_path / "c.db")),
                  2, "N=8191 makes rows of 16382 bytes", "multiple of 8", "--shape 3000x8192x8192")
    assert "widen its choices" not in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "c.db").exists()


def test_shape_the_world_size_does_not_divide(tmp_path):
    refused(cuco("search", "--dry-run", "--shape", "8192x8191x8192", "--db", str(tmp_path / "c.db")), 2,
            "K=8191 is split over 2 ranks", "--shape 8192x8192x8192")
    refused(cuco("search", "--dry-run", "--workload", "gemm_reducescatter", "--shape", "3001x8192x8192",
                 "--db", str(tmp_path / "c.db")), 2,
            "M=3001 rows are scattered/gathered over 2 ranks", "--shape 3000x8192x8192")


def test_report_of_a_missing_database_names_its_argument(tmp_path):
    out = refused(cuco("report", str(tmp_path / "missing.db")), 1,
                  "no candidate database", "cuco report PATH")
    assert "--db" not in out


def test_export_unknown_id_is_not_a_repr(scored, tmp_path):
    db, _ = scored
    out = refused(cuco("export", "99999", "-o", str(tmp_path / "art"), "--db", str(db)), 2,
                  "no candidate 99999")
    assert "'no candidate" not in out and '"no candidate' not in out


def test_export_without_a_gpu_names_the_arch_flag(scored, tmp_path):
    db, cid = scored
    out = refused(cuco("export", str(cid), "-o", str(tmp_path / "art"), "--db", str(db),
                       env={"CUDA_VISIBLE_DEVICES": "", "CUCO_ARCH": ""}), 1, "--arch sm_90a")
    assert "arch='sm_90a'" not in out


def test_export_bad_arch(scored, tmp_path):
    db, cid = scored
    refused(cuco("export", str(cid), "-o", str(tmp_path / "art"), "--db", str(db), "--arch", "hopper"),
            2, "'hopper' is not of the form sm_90a", "--arch sm_90a")


def test_database_in_a_missing_directory(tmp_path):
    out = refused(cuco("search", "--dry-run", "--budget", "2", "--db", str(tmp_path / "no" / "c.db")), 2,
                  f"the directory {tmp_path / 'no'} does not exist", "mkdir -p")
    assert "sqlalche.me" not in out and "DRY RUN" not in out  # refused before anything ran


def test_unknown_candidate_in_db_show(scored):
    db, _ = scored
    refused(cuco("db", "show", "42", "--db", str(db)), 2, "no candidate 42")


# ---- model numbers read as model numbers ------------------------------------------------------
def test_dry_run_is_labelled_as_the_model(tmp_path):
    r = cuco("search", "--dry-run", "--budget", "6", "--islands", "2", "--shape", "2048x4096x4096",
             "--placements", "side_stream", "--db", str(tmp_path / "c.db"))
    out = refused(r, 0, "DRY RUN, analytic model", "scored by model", "(analytic model, not measured)")
    assert "correct" not in out
    page = tmp_path / "r.html"
    refused(cuco("report", str(tmp_path / "c.db"), "-o", str(page)), 0, "wrote")
    html = page.read_text()
    assert "analytic model (dry run)" in html and "(model)" in html


def test_ties_break_the_same_way_everywhere(tmp_path):
    from cuco.export import best_callable
    d = dict(placement="side_stream", sync_scope="chunk", chunk_bytes=1 << 20, comm_ctas=8)
    with CandidateDB(tmp_path / "t.db") as db:
        run = db.create_run("t", "gemm_allreduce")
        a = db.add_candidate("gemm_allreduce", run_id=run, directives=Directives(issuer="warp", **d))
        b = db.add_candidate("gemm_allreduce", run_id=run, directives=Directives(issuer="cta", **d))
        db.add_evaluation(b, stage_reached="timing", status="ok", speedup=1.25)  # judged first
        db.add_evaluation(a, stage_reached="timing", status="ok", speedup=1.25)
        assert db.best("gemm_allreduce", run_id=run)[0].id == a
        assert best_callable(db, run) == a
    r = cuco("db", "ls", "--db", str(tmp_path / "t.db"))
    assert r.returncode == 0 and "1.250" in r.stdout


def test_exported_speedup_says_model_or_measured(tmp_path):
    from cuco.export import Artifact
    model = Artifact(tmp_path, {"evaluation": {"speedup": 1.4937261, "model": True}})
    real = Artifact(tmp_path, {"evaluation": {"speedup": 1.46, "model": False}})
    assert model.speedup_text() == "1.494x (model)"
    assert real.speedup_text() == "1.460x (measured)"
    assert json.dumps(model.manifest)  # plain data


# ---- issue #40: errors that name the fix ------------------------------------------------------
@pytest.mark.parametrize("kw, field, fix, needle", [
    ({"backend": "nccl_typo"}, "backend", "lsa",
     "backend='nccl_typo' is not one of lsa, gin, nvshmem; use backend='lsa'"),
    ({"placement": "epilog"}, "placement", "epilogue", "did you mean placement='epilogue'?"),
    ({"chunk_bytes": -1}, "chunk_bytes", 1 << 20,
     "chunk_bytes=-1 must be a power of two between 4K and 256M"),
    ({"stages": 1}, "stages", 4, "stages=1 must be >= 2; use stages=4"),
    ({"stages": "abc"}, "stages", 4, "stages='abc' is not a whole number; use stages=4"),
])
def test_directive_field_errors_are_cuco_errors_naming_the_fix(kw, field, fix, needle):
    from cuco import CucoError, DirectiveError
    with pytest.raises(CucoError) as info:
        Directives(**kw)
    err = info.value
    assert isinstance(err, DirectiveError) and (err.param, err.fix) == (field, fix)
    assert needle in str(err) and "pydantic" not in str(err) and "http" not in str(err)


@pytest.mark.parametrize("workload, shape, needle", [
    ("kv_transfer", "layers=32,tokens=0",
     "kv_transfer: tokens=0 must be > 0; use --shape layers=32,tokens=4096"),
    ("cp_attention", "seq=abc,heads=16", "cp_attention: seq='abc' is not a whole number; "
     "use --shape seq=32768,heads=16"),
    ("kv_transfer", "layrs=32,tokens=1024", "'layrs=32' is not one of kv_transfer's fields "
     "(layers, tokens, hidden, kv_dim, heads, head_dim, ffn) as key=value; did you mean "
     "--shape layers=32,tokens=1024?"),
    ("moe", "routing=skewd,tokens=64", "moe: routing='skewd' is not one of skewed, one_expert, "
     "empty_experts; did you mean --shape routing=skewed,tokens=64?"),
])
def test_shape_errors_name_the_field_and_keep_the_users_other_fields(tmp_path, workload, shape,
                                                                      needle):
    out = refused(cuco("search", "--dry-run", "--workload", workload, "--shape", shape,
                       "--db", str(tmp_path / "c.db")), 2, needle)
    assert len(out.strip().splitlines()) == 1 and "Input should" not in out
    assert not (tmp_path / "c.db").exists()


def test_make_problem_field_errors_are_shape_errors():
    from cuco import ShapeError, make_problem
    with pytest.raises(ShapeError, match=r"moe: tokens=0 must be > 0; use tokens=128") as info:
        make_problem("moe", "tokens=0")
    assert (info.value.param, info.value.fix) == ("tokens", 128)
    with pytest.raises(ShapeError, match="seq='abc' is not a whole number"):
        make_problem("cp_attention", {"seq": "abc"})


def test_kernels_check_refuses_an_arch_the_kernels_cannot_target():
    t0 = time.perf_counter()
    out = refused(cuco("kernels", "check", "--arch", "sm_80"), 2,
                  "arch sm_80 cannot build cuco's kernels", "only sm_90a has", "use --arch sm_90a")
    assert "compiling" not in out and time.perf_counter() - t0 < 60


def test_help_shows_flags_defaults_and_text_for_every_option():
    search = cuco("search", "--help").stdout
    assert "<bool>" not in search.split("--help")[0]  # --dry-run takes no value
    assert "--dry-run" in search and "--no-dry-run" in search
    for option, words in (("--islands", "populations searched side by side"),
                          ("--seed", "random seed"), ("--budget", "a larger one extends it")):
        row = next(ln for ln in search.splitlines() if option in ln)
        assert words in row or words in search, option
    demo = cuco("demo", "--help").stdout
    assert "[default: 0]" not in demo and "16 on GPUs, 48 in a" in demo
    report = cuco("report", "--help").stdout
    assert "HTML file to write" in report


def test_empty_islands_show_no_best_and_no_phase_switch_reads_as_words(tmp_path):
    r = cuco("search", "--dry-run", "--budget", "3", "--islands", "4", "--db", str(tmp_path / "c.db"))
    out = refused(r, 0, "run 1: 3 evaluations")
    rows = [ln for ln in out.splitlines() if ln.strip().startswith("│ 3 ")]
    assert rows and "0.000" not in rows[0] and "-" in rows[0], out
    assert "generation None" not in out


# ---- a newcomer's wrong invocations: one line naming the fix, nothing started -----------------
def test_design_space_choice_errors_are_in_cuco_words():
    code = ("from cuco import DesignSpace, make_problem\n"
            "DesignSpace(make_problem('gemm_allreduce', '8192x8192x8192'), backend=['nccl'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "DirectiveError" in r.stderr, r.stderr
    assert "backend='nccl' is not one of lsa, gin, nvshmem; use backend='lsa'" in r.stderr
    assert "pydantic" not in r.stderr and "validation error" not in r.stderr


def test_cluster_that_is_not_a_ray_address(tmp_path):
    out = refused(cuco("search", "--dry-run", "--cluster", "bogus", "--budget", "2",
                       "--db", str(tmp_path / "c.db")), 2,
                  "cluster 'bogus' is not a Ray address", "ray://HOST:10001", "use --cluster local")
    assert "internal error" not in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "c.db").exists()  # refused before the database or Ray


@pytest.mark.parametrize("body, needles", [
    ("x = 1\nraise RuntimeError('boom')\n", ("RuntimeError: boom", "(line 2 of ")),
    ("x = (\n", ("SyntaxError", "line 1")),
])
def test_plugin_whose_code_fails_names_the_plugin_not_cuco(tmp_path, body, needles):
    plugin = tmp_path / "my_ops.py"
    plugin.write_text(body)
    out = refused(cuco("--plugin", str(plugin), "db", "ls", "--db", str(tmp_path / "c.db")), 2,
                  f"plugin {plugin} failed to load", *needles, "fix the plugin")
    assert "internal error" not in out and "report it" not in out
    r = cuco("--debug", "--plugin", str(plugin), "db", "ls", "--db", str(tmp_path / "c.db"))
    assert r.returncode != 0 and needles[0].split(":")[0] in r.stdout + r.stderr


def test_tune_misspelt_pattern_names_the_command_not_a_flag(tmp_path):
    out = refused(cuco("tune", "gemm_allreduc", "--n", "4096", "--k", "4096", "--table",
                       str(tmp_path / "t.json"), "--dry-run"), 2,
                  "did you mean cuco tune gemm_allreduce?")
    assert "--pattern" not in out


def test_tune_table_in_a_missing_directory(tmp_path):
    table = tmp_path / "no" / "t.json"
    out = refused(cuco("tune", "gemm_allreduce", "--n", "4096", "--k", "4096", "--table", str(table),
                       "--dry-run"), 2, f"--table {table}", "does not exist", "mkdir -p")
    assert "database" not in out and not (tmp_path / "no").exists()


def test_tune_of_a_refused_shape_leaves_no_database_behind(tmp_path):
    refused(cuco("tune", "gemm_allreduce", "--n", "4096", "--k", "8190", "--table", str(tmp_path / "t.json"),
                 "--dry-run"), 2, "K=8190", "use --k 8192")
    assert list(tmp_path.iterdir()) == []



def test_tune_onto_a_damaged_table_file_is_one_line_before_any_timing(tmp_path):
    table = tmp_path / "t.json"
    table.write_text('{"layers": [')
    out = refused(cuco("tune", "gemm_allreduce", "--n", "4096", "--k", "4096", "--table", str(table),
                       "--dry-run", "--placements", "side_stream"), 2,
                  f"{table} is not JSON", "move this file away or choose another --table file")
    assert len(out.strip().splitlines()) == 1 and "tune it again" not in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]

def test_db_migrate_of_a_missing_source_names_its_argument(tmp_path):
    out = refused(cuco("db", "migrate", str(tmp_path / "missing.db"), f"sqlite:///{tmp_path}/m.db"), 1,
                  "no candidate database", "cuco db migrate SOURCE TARGET")
    assert "--db" not in out


@pytest.mark.parametrize("args, needle", [
    (["--sizes", "12XB"], "size '12XB' is not a size like 64KiB"),
    (["--world-size", "0"], "world_size 0 is not a number of GPUs (ranks)"),
    (["--iters", "0"], "use --iters 50"),
])
def test_bench_collectives_refuses_bad_arguments_before_compiling(args, needle):
    t0 = time.perf_counter()
    out = refused(cuco("bench", "collectives", *args), 2, needle)
    assert "compiling" not in out and len(out.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 60


def test_fastpath_without_a_gpu_or_its_host_program(tmp_path):
    out = refused(cuco("fastpath", "--emulate", "--db", str(tmp_path / "c.db"),
                       env={"CUDA_VISIBLE_DEVICES": ""}), 1, "--emulate still needs one GPU",
                  "cuco search --dry-run")
    assert "add --dry-run" not in out  # fastpath has no --dry-run
    refused(cuco("fastpath", "--host-program", str(tmp_path / "missing.cu"), "--llm", "openai:m",
                 "--db", str(tmp_path / "c.db")), 2, "--host-program", "does not exist")


def test_a_suggested_flag_value_can_be_pasted_into_a_shell(tmp_path):
    """The fix an error spells is a value a shell takes as one word: compat:URL|MODEL quoted
    (its bar unquoted would pipe), a plain shape left as it is; and it comes on stderr."""
    from cuco.errors import InputError
    assert InputError("x", param="llm", fix="compat:http://h:1|m").render("--llm") == "x; use --llm 'compat:http://h:1|m'"
    assert InputError("x", param="shape", fix="1024x512x248").render("--shape") == "x; use --shape 1024x512x248"
    r = cuco("search", "--shape", "12x", "--dry-run", "--db", str(tmp_path / "c.db"))
    refused(r, 2, "error:", "MxKxN")
    assert "MxKxN" in r.stderr and "MxKxN" not in r.stdout


def test_an_llm_nobody_answers_stops_the_search_at_once_with_the_reason(tmp_path):
    """A wrong endpoint (here a closed local port, through the real OpenAI SDK) used to be
    rejected proposal by proposal for the whole budget (minutes, exit 0, the reason only in the
    database): now the first failure ends the run with the SDK's reason and the resume command,
    and the run is kept, resumable."""
    pytest.importorskip("openai")
    db = tmp_path / "llm.db"
    t0 = time.monotonic()
    r = cuco("search", "--llm", "compat:http://127.0.0.1:1|m", "--dry-run", "--budget", "40", "--db", str(db))
    assert time.monotonic() - t0 < 90
    refused(r, 1, "error:", "APIConnectionError", "check the endpoint", "--resume 1",
            "'compat:http://127.0.0.1:1|m'")
    with CandidateDB(str(db)) as store:
        assert store.run(1).status == "interrupted"


def test_a_database_of_something_else_is_refused_and_left_as_it_was(tmp_path):
    """`cuco db ls --db other.db` on another program's SQLite file used to add cuco's tables
    to it; now every command refuses it in one line and the file keeps only its own table."""
    import sqlite3
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("create table foo (x)")
    for args in (("db", "ls"), ("search", "--dry-run", "--budget", "4")):
        r = cuco(*args, "--db", str(path))
        refused(r, 1, "holds tables of something else (foo) and no cuco data", "at a new file")
    with sqlite3.connect(path) as conn:
        assert [n for (n,) in conn.execute("select name from sqlite_master")] == ["foo"]


def test_api_refusals_name_the_fix_in_python_terms():
    """A problem without a shape names one to use; the fast path's LLM route asks for the
    host program in the API's words, not the CLI's."""
    import cuco
    from cuco.errors import InputError, ShapeError
    with pytest.raises(ShapeError, match=r"gemm_allreduce needs a shape \(m, k, n\); use shape='8192x8192x8192'"):
        cuco.make_problem("gemm_allreduce")
    with pytest.raises(InputError, match="pass it as host_program=") as err:
        cuco.fastpath("gemm_allreduce", "1024x1024x2048", llm="openai:gpt-4o", db=":memory:")
    assert "--llm" not in str(err.value)


def test_a_shape_too_small_for_any_chunk_says_so(tmp_path):
    """8x8x8: every closest point moved a chunk larger than a rank's output, and the refusal
    asked for a chunk size the CLI has no flag for; now it says the shape is too small."""
    r = cuco("search", "--shape", "8x8x8", "--dry-run", "--db", str(tmp_path / "c.db"))
    refused(r, 2, "is too small for a fused kernel: each rank produces 128 bytes", "use --shape 8192x8192x8192")
    assert ":;" not in r.stderr and not (tmp_path / "c.db").exists()


def test_a_database_url_no_driver_reads_names_what_to_give(tmp_path):
    r = cuco("db", "ls", "--db", "notaurl://x")
    refused(r, 1, "cannot open candidate database 'notaurl://x'", "give a file path", "sqlite:///cuco.db")
