"""The ``cuco`` command (typer + rich)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cuco.design.dimensions import Placement
from cuco.design.patterns import TP_NAMES
from cuco.design.placement_rules import PLACEMENTS
from cuco.design.pipeline_ops import PIPELINE_NAMES
from cuco.design.problem import format_shape

app = typer.Typer(help="cuco: fused compute + communication GPU kernels, searched and verified.",
                  no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Inspect a candidate database.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that write bench/results/<name>.json.", no_args_is_help=True)
kernels_app = typer.Typer(help="Kernel templates.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
app.add_typer(kernels_app, name="kernels")
console = Console()
#: errors go to stderr, one line each (a pipe of a command's output keeps its results only)
err_console = Console(stderr=True, soft_wrap=True)

DB_OPTION = typer.Option(os.environ.get("CUCO_DB", "cuco.db"), "--db",
                         help="database file or SQLAlchemy URL (env CUCO_DB)")

# How the commands spell the Python arguments an error names (``CucoError.param``).
FLAGS = {"workload": "--workload", "world_size": "--world-size", "budget": "--budget",
         "islands": "--islands", "proposer": "--proposer", "llm": "--llm", "hosts": "--hosts",
         "placements": "--placements", "arch": "--arch", "output": "-o", "max_rounds": "--rounds",
         "db": "--db", "plugin": "--plugin", "cluster": "--cluster",
         "table": "--table", "sizes": "--sizes", "iters": "--iters"}
#: The metavar of an on/off flag: it takes no value, and typer would show ``<bool>``.
FLAG = ""
_context: dict = {}  # what the running command parsed (its shape), for spelling fixes


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", envvar="CUCO_DEBUG", metavar=FLAG,
                                        help="show the Python traceback of an error (env CUCO_DEBUG=1)"),
             plugin: list[Path] = typer.Option(
                 [], "--plugin", envvar="CUCO_PLUGINS", metavar="PATH", show_default=False,
                 help="a .py file (or module) of your own ops to load first: its workloads are "
                 "known by name to every command (repeatable; env CUCO_PLUGINS, paths "
                 f"separated by '{os.pathsep}')")) -> None:
    _context["debug"] = debug
    if plugin:
        from cuco.workloads.base import load_plugins
        load_plugins(plugin)


def _spell(exc) -> str:
    """An error's message with its fix written as this command's flag."""
    from cuco.errors import CucoError, DirectiveError

    if isinstance(exc, DirectiveError):
        return "invalid directives: " + "; ".join(exc.problems)
    if not isinstance(exc, CucoError) or exc.param is None or exc.fix is None:
        return str(exc)
    if "shape" in _context and exc.param in _context["shape"]:
        cls = _context["problem_class"]
        fixed = {**_context["shape"], exc.param: exc.fix}  # the whole --shape, the field fixed
        whole = cls.X_SHAPE and set(fixed) == set(cls.SHAPE)  # MxKxN, else in the user's order
        text = (format_shape(cls, fixed) if whole
                else ",".join(f"{k}={v}" for k, v in fixed.items()))
        return exc.render("--shape").replace(f"--shape {exc.fix}", f"--shape {text}")
    if exc.param in _context.get("positional", {}):  # e.g. cuco tune PATTERN: no --pattern flag
        return exc.render(_context["positional"][exc.param])
    return exc.render(FLAGS.get(exc.param, "--" + exc.param.replace("_", "-")))


def _refuse(text: str, code: int) -> NoReturn:
    """Exit ``code`` with one red ``error:`` line on stderr (``text``: rich markup, its
    values escaped by the caller)."""
    err_console.print(f"[red]error:[/] {text}")
    raise typer.Exit(code)


def _fail(exc: BaseException) -> int:
    """One red line for an error; its exit status (2: fix the command, 1: the machine/data)."""
    from cuco.errors import CucoError, exit_code

    if isinstance(exc, CucoError):
        code = exit_code(exc)
    elif isinstance(exc, OSError):
        code = 1
    else:
        err_console.print(f"[red]internal error: {escape(type(exc).__name__)}: {escape(str(exc))}[/]; "
                      "rerun with --debug for the traceback and report it")
        return 1
    text = " ".join(_spell(exc).split())  # one line
    err_console.print(f"[red]error:[/] {escape(text)}", soft_wrap=True)
    return code


@app.command()
def doctor() -> None:
    """What this machine has for cuco, and the command that fixes each missing piece."""
    from cuco.doctor import run_checks

    checks = run_checks()
    table = Table(title="cuco doctor")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "warn": "yellow", "missing": "red"}
    for c in checks:
        table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", escape(c.detail), escape(c.fix))
    console.print(table)
    missing = [c for c in checks if c.status == "missing" and c.required]
    if missing:
        console.print(f"[red]{len(missing)} required piece(s) missing[/]: "
                      + ", ".join(c.name for c in missing))
        raise typer.Exit(1)
    if not any(c.name == "GPUs" and c.status == "ok" for c in checks):
        console.print("[yellow]No GPU here: cuco can render and compile kernels, but running, "
                      "checking and timing them needs NVIDIA GPUs: one checks every multi-rank "
                      "kernel in an emulated world, 2+ with NVLink time communication.[/]")


@db_app.command("ls")
def db_ls(db: str = DB_OPTION) -> None:
    """Runs and candidate counts."""
    from cuco.db import CandidateDB

    _require_db(db)
    with CandidateDB(db) as store:
        runs = store.runs()
        table = Table(title=f"{store.url} (schema v{store.schema_version})")
        for col in ("run", "name", "workload", "status", "candidates", "best speedup", "evidence"):
            table.add_column(col)
        models = 0
        for r in runs:
            best = store.best(r.workload, run_id=r.id)
            models += bool(best and best[1].is_model)
            table.add_row(str(r.id), r.name, r.workload, r.status,
                          str(store.count_candidates(r.id)),
                          escape(best[1].speedup_label()) if best else "-",
                          best[1].evidence if best else "-")
        if models:
            table.caption = ("evidence 'model': a dry run's analytic-model prediction, "
                             "nothing was run or checked")
        loose = store.count_candidates() - sum(store.count_candidates(r.id) for r in runs)
        console.print(table)
        console.print(f"{len(runs)} run(s); {loose} candidate(s) outside any run")
        unfinished = [r for r in runs if r.status in ("running", "interrupted")]
        if unfinished:  # a search killed (kill -9, a crash, a lost machine) still says running
            last = unfinished[-1]
            cfg = last.config or {}
            console.print(f"unfinished: run {', '.join(str(r.id) for r in unfinished)}; one whose "
                          "process is gone goes on from what it recorded with: "
                          + escape(resume_command(last.id, db=db, dry_run=bool(cfg.get("dry_run")),
                                                  llm=cfg.get("llm"))), soft_wrap=True)


@db_app.command("show")
def db_show(candidate_id: int, db: str = DB_OPTION,
            source: bool = typer.Option(False, "--source", help="print the kernel source")) -> None:
    """One candidate: directives, lineage and evaluations."""
    from cuco.db import CandidateDB

    _require_db(db)
    with CandidateDB(db) as store:
        cand = store.candidate(candidate_id)
        console.print(f"[bold]candidate {cand.id}[/] workload={cand.workload} origin={cand.origin} "
                      f"run={cand.run_id} island={cand.island} generation={cand.generation}")
        console.print(f"parents: {cand.parents or '-'}  lineage: "
                      + " <- ".join(str(c.id) for c in store.lineage(cand.id)))
        if cand.directives:
            console.print("directives: " + json.dumps(cand.directives))
        table = Table(title="evaluations")
        for col in ("id", "evidence", "stage", "status", "ms", "speedup", "overlap", "max err",
                    "machine", "error"):
            table.add_column(col, overflow="fold")
        evs = store.evaluations(cand.id)
        for e in evs:
            label = "" if e.evidence == "measured" else f" ({e.evidence})"
            table.add_row(str(e.id), e.evidence, e.stage_reached, e.status,
                          _fmt(e.time_ms) + escape(label if e.time_ms is not None else ""),
                          _fmt(e.speedup) + escape(label if e.speedup is not None else ""),
                          _fmt(e.overlap_eff), _fmt(e.max_error), escape(e.machine or "-"),
                          escape((e.error or "")[:200]))
        if any(e.is_model for e in evs):
            table.caption = ("evidence 'model': a dry run's analytic-model prediction, "
                             "nothing was run or checked")
        console.print(table)
        if source and cand.source:
            console.print(cand.source, markup=False, highlight=False)


@db_app.command("migrate")
def db_migrate(source: str = typer.Argument(..., help="database to copy from (file or URL)"),
               target: str = typer.Argument(..., help="empty database to copy into (URL)")) -> None:
    """Copy a candidate database, ids kept (e.g. SQLite -> postgresql+psycopg://...)."""
    from cuco.db import CandidateDB
    from cuco.errors import DatabaseError, exit_code

    _require_db(source, "give the database to copy from as the first argument: "
                "cuco db migrate SOURCE TARGET")
    try:
        counts = CandidateDB(source).copy_to(CandidateDB(target))
    except DatabaseError as exc:
        _refuse(escape(str(exc)), exit_code(exc))
    console.print("copied " + ", ".join(f"{n} {t}" for t, n in counts.items()))


def _folder_exists(path: Path, flag: str) -> None:
    """Exit 2 naming ``flag`` where ``path``'s folder does not exist (before anything runs)."""
    folder = path.parent
    if not folder.is_dir():
        _refuse(f"{flag} {escape(str(path))}: the directory "
                f"{escape(str(folder))} does not exist; create it (mkdir -p "
                f"{escape(str(folder))}) or write {path.name} elsewhere", 2)


def _writable(path: Path, flag: str) -> None:
    """Exit 2 naming ``flag`` where ``path`` cannot be written: it, or the nearest folder
    above it that exists, is read-only (before anything is built or timed)."""
    at = path
    while not at.exists() and at != at.parent:
        at = at.parent
    if at.exists() and not os.access(at, os.W_OK):
        _refuse(f"{flag} {escape(str(path))}: {escape(str(at))} is read-only; "
                f"give {flag} a path you can write", 2)


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


def _require_db(db: str, how: str = "pass --db PATH or set CUCO_DB") -> None:
    """Exit 1 where ``--db`` names a file that does not exist (opening it would make an empty one)."""
    from cuco.db.candidate_db import sqlite_file
    path = sqlite_file(db)
    if path is not None and not path.exists():
        _refuse(f"no candidate database at {escape(db)}; {how}", 1)


def _db_folder_exists(db: str) -> None:
    """Exit 2 where ``--db`` names a file in a folder that does not exist (before anything runs)."""
    from cuco.db.candidate_db import check_writable, sqlite_file
    path = sqlite_file(db)
    if path is not None:
        _folder_exists(path, "--db")
        check_writable(path)


#: The architectures every kernel of the catalog builds for (Hopper: wgmma, TMA).
CATALOG_ARCHS = ("sm_90a",)


@kernels_app.command("check")
def kernels_check(arch: str = typer.Option("sm_90a", help="target architecture (the kernels "
                                           "build for " + ", ".join(CATALOG_ARCHS) + ")")) -> None:
    """Render and compile every kernel template and host shim (no GPU needed)."""
    _show_compiled(arch)


def _show_compiled(arch: str, sources=None) -> None:
    """Compile the catalog (or ``sources``) and show a row per kernel; exit 1 if one fails."""
    report = _compile_catalog(arch, sources)
    table = Table(title=f"kernels compiled for {arch}")
    table.add_column("kernel")
    table.add_column("result", overflow="fold")
    for name, status in report.items():
        table.add_row(name, "[green]ok[/]" if status == "ok" else f"[red]{escape(status)}[/]")
    console.print(table)
    if any(v != "ok" for v in report.values()):
        raise typer.Exit(1)


def _compile_catalog(arch: str, sources=None) -> dict[str, str]:
    """``compile_everything`` on every core with a progress bar (minutes on a laptop)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cuco.kernels import Compiler
    from cuco.workloads.catalog import catalog_size, compile_everything

    Compiler(arch=arch)  # a bad --arch is refused before anything is rendered
    if arch not in CATALOG_ARCHS:
        from cuco.errors import ArchError
        raise ArchError(f"arch {arch} cannot build cuco's kernels: the in-kernel placements use "
                        "Hopper's wgmma and TMA (CUTLASS SM90), which only "
                        f"{', '.join(CATALOG_ARCHS)} has", param="arch", fix=CATALOG_ARCHS[0])
    cores = os.cpu_count() or 1
    with Progress(TextColumn("[bold]compiling kernels for {task.fields[arch]}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                  console=console, transient=False) as bar:
        total = catalog_size(sources)
        task = bar.add_task("compile", total=total, arch=f"{arch} on {cores} core(s)", last="")
        done = [0]
        t0 = time.perf_counter()
        if not console.is_terminal:  # a log: what runs, before the first build ends (minutes)
            console.print(f"compiling {total} kernels for {arch} on {cores} core(s): a line as each "
                          "build ends", soft_wrap=True)

        def on_done(name: str, ok: bool) -> None:
            bar.update(task, advance=1, last=("" if ok else "[red]failed: [/]") + name.split(".")[0])
            done[0] += 1
            if not console.is_terminal:  # a log (CI) shows no bar: a line per build instead
                console.print(f"compiled {done[0]}/{total} in {time.perf_counter() - t0:.0f} s: "
                              f"{escape(name)} {'ok' if ok else '[red]failed[/]'}", soft_wrap=True)
        return compile_everything(arch, sources=sources, on_done=on_done)


WORKLOAD_HELP = " | ".join((*TP_NAMES, *PIPELINE_NAMES)) + " | a --plugin's own"
SHAPE_HELP = ("GEMM workloads: global MxKxN (default 8192x8192x8192); any workload: "
              "field=value,... e.g. moe: tokens=128,hidden=7168,ffn=2048,experts=256,topk=8 "
              "(default: the workload's defaults)")


RESUMED = "; a resumed run keeps its own)"


@app.command()
def search(
    workload: Optional[str] = typer.Option(None, help=WORKLOAD_HELP + " (default gemm_allreduce"
                                           + RESUMED, show_default=False),
    shape: Optional[str] = typer.Option(None, help=SHAPE_HELP),
    world_size: Optional[int] = typer.Option(None, help="GPUs (ranks) (default 2" + RESUMED,
                                             show_default=False),
    budget: Optional[int] = typer.Option(None, help="evaluations (default 100; a resumed "
                                         "run keeps its own, a larger one extends it)", show_default=False),
    islands: Optional[int] = typer.Option(None, help="populations searched side by side, the "
                                          "best migrating between them (default 4" + RESUMED,
                                          show_default=False),
    seed: Optional[int] = typer.Option(None, help="random seed: the same seed and settings give "
                                       "the same search (default 0" + RESUMED,
                                       show_default=False),
    proposer: Optional[str] = typer.Option(None, help="offline (mutation and crossover) | tpe "
                                           "(model-based) (default offline" + RESUMED,
                                           show_default=False),
    dry_run: Optional[bool] = typer.Option(None, "--dry-run/--no-dry-run", show_default=False,
                                           metavar=FLAG,
                                           help="score an analytic model, no GPU (default off"
                                           + RESUMED),
    resume: Optional[int] = typer.Option(None, help="continue this run id of --db with the "
                                         "settings it was started with"),
    llm: Optional[str] = typer.Option(None, help="openai:MODEL | anthropic:MODEL | compat:URL|MODEL"),
    cluster: Optional[str] = typer.Option(None, help="Ray address (ray://host:10001), or 'local'"),
    hosts: int = typer.Option(2, help="cluster hosts (one actor each)"),
    placements: Optional[str] = typer.Option(None, help="placements to search, comma-separated "
                                             f"(default {','.join(PLACEMENTS)}"
                                             + RESUMED, show_default=False),
    emulate: bool = typer.Option(False, "--emulate", metavar=FLAG,
                                 help="every rank on one GPU under MPS (an emulated world): "
                                 "kernels are checked, never timed; verdicts carry no speedup"),
    db: str = DB_OPTION,
) -> None:
    """Evolutionary search of fused kernels; Ctrl-C stops cleanly, --resume continues."""
    from cuco.agents.api import check_cluster, search_settings
    from cuco.runtime import visible_gpus

    check_cluster(cluster)
    _db_folder_exists(db)
    picked = _placements(placements) if placements is not None else None
    if resume is not None:
        _require_db(db, "--resume continues a run of an existing database: pass its --db")
        from cuco.errors import UnknownId
        if workload is not None:
            from cuco.design import check_workload
            check_workload(workload)
        try:
            fields = _shape_fields(workload, shape, resume, db)
            settings = search_settings(workload, fields, world_size, db=db, resume=resume,
                                       budget=budget, islands=islands, seed=seed,
                                       proposer=proposer, dry_run=dry_run, llm=llm,
                                       placements=picked, hosts=hosts)
        except UnknownId as exc:
            _refuse(f"{escape(str(exc))}; pass --resume one of those run "
                    "ids (and the same --db)", 2)
    else:
        problem = _problem(workload or "gemm_allreduce", shape, 2 if world_size is None else world_size)
        settings = search_settings(problem, db=db, budget=budget, islands=islands, seed=seed,
                                   proposer=proposer, dry_run=dry_run, llm=llm,
                                   placements=picked or PLACEMENTS, hosts=hosts)
    problem = settings.problem
    if emulate and settings.dry_run:  # one checks kernels on a GPU, the other runs none
        _refuse("--emulate checks kernels on one GPU and --dry-run runs none; "
                "drop one of them", 2)
    if emulate:
        _emulate(problem.world_size)
    elif not settings.dry_run and cluster is None and visible_gpus() < problem.world_size:
        _refuse(f"{visible_gpus()} GPU(s) visible but the search needs "
                f"{problem.world_size}; run on a GPU machine, or add --dry-run to search an "
                "analytic model, or --emulate to check kernels on one GPU"
                + ("" if resume is None else f" (run {resume} was measured on GPUs: resume it on one)"), 1)
    _run_search(problem, db=db, budget=settings.budget, islands=settings.islands,
                seed=settings.seed, proposer=settings.proposer, dry_run=settings.dry_run,
                resume=resume, llm=llm, cluster=cluster, hosts=hosts,
                placements=settings.placements)


def _shape_fields(workload: Optional[str], shape: Optional[str], resume: int, db: str):
    """``--shape`` of a resumed run as fields of the run's own workload (None: not given)."""
    if shape is None:
        return None
    from cuco.db import CandidateDB
    from cuco.design import parse_shape, problem_class

    with CandidateDB(db) as store:
        stored = store.run(resume).workload
    fields = parse_shape(workload or stored, shape)
    _context.update(shape=fields, problem_class=problem_class(workload or stored))
    return fields


def resume_command(run_id: int, *, db: str, dry_run: bool, llm: Optional[str] = None) -> str:
    """The exact command that continues run ``run_id`` (what Ctrl-C prints)."""
    import shlex
    return " ".join(["cuco search --resume", str(run_id), "--db", shlex.quote(db)]
                    + (["--dry-run"] if dry_run else []) + (["--llm", shlex.quote(llm)] if llm else []))


def _rate(summary: dict) -> float:
    """Evaluations a minute of this process (a resumed run's earlier ones are not its work)."""
    return 60 * summary.get("judged", summary["evaluations"]) / max(summary["elapsed_s"], 1e-9)


def _resuming(db: str, resume: Optional[int]) -> str:
    """What a resumed run starts from, for its first line ('' for a new run)."""
    if resume is None:
        return ""
    from cuco.db import CandidateDB
    with CandidateDB(db) as store:
        recorded = store.count_candidates(resume)
    return f"; resuming run {resume} from its {recorded} recorded candidate(s)"


def _run_search(problem, *, db: str, budget: int, dry_run: bool, resume: Optional[int] = None,
                **kw):
    """A search with its live table (a line per generation where the output is not a
    terminal); returns (result, best (candidate, evaluation) or None). Dry runs are
    labelled as the analytic model everywhere they show a number."""
    from rich.live import Live

    from cuco.agents import SearchInterrupted
    from cuco.llm.base import LLMUnreachable
    from cuco.agents.api import search as run_search
    from cuco.db import CandidateDB

    label = f"{problem.workload} {problem.shape_text} w={problem.world_size}"
    dry = "DRY RUN, analytic model (nothing measured or checked): " if dry_run else ""
    headline = dry + f"{label}, {budget} evaluations" + _resuming(db, resume)
    checked = "scored by model" if dry_run else "correct"
    live = Live(Table(), console=console, refresh_per_second=4)
    piped = not console.is_terminal
    last: list[dict] = []

    def show(summary: dict) -> None:
        if piped:  # a log, not a redrawn table: one line per generation, the table at the end
            rate = _rate(summary)
            best = (f"best {summary['best']:.3f}" + (" (model)" if dry_run else "")
                    if any(isl["ok"] for isl in summary["islands"]) else "no correct candidate yet")
            fails = sum(summary["failed"].values())
            console.print(f"generation {summary['generation']} ({summary['phase']}): "
                          f"{summary['evaluations']}/{budget} evaluations, {best}, {rate:.0f}/min"
                          + (f", {fails} failed" if fails else ""), soft_wrap=True)
            last[:] = [summary]
        else:
            live.update(table(summary))

    def table(summary: dict) -> Table:
        t = Table(title=dry + f"{label}: generation {summary['generation']} "
                  f"({summary['phase']}), {summary['evaluations']}/{budget} evaluations, "
                  f"{_rate(summary):.0f}/min")
        for col in ("island", "members", "best speedup" + (" (model)" if dry_run else ""), "mean", checked):
            t.add_column(col)
        for isl in summary["islands"]:
            scored = isl["ok"] > 0  # an island with nothing correct has no best to show
            t.add_row(str(isl["island"]), str(isl["size"]), f"{isl['best']:.3f}" if scored else "-",
                      f"{isl['mean']:.3f}" if scored else "-", str(isl["ok"]))
        spent = (f"this generation: builds {summary.get('compile_s', 0):.0f} CPU-s, GPU jobs "
                 f"{summary.get('gpu_s', 0):.0f} s, GPUs waiting on builds "
                 f"{summary.get('build_wait_s', 0):.0f} s")
        fails = ("failures: " + ", ".join(f"{k} x{v}" for k, v in summary["failed"].items())
                 if summary["failed"] else "")
        t.caption = "\n".join(x for x in ("" if dry_run else spent, fails) if x)
        return t

    if piped:
        console.print(headline, soft_wrap=True)
    else:  # until the first generation is judged (minutes on GPUs): what runs, not a blank
        live.update(Text(headline + ("" if resume is not None else
                                     "; seeding the islands (generation 0)...")))
    try:
        if piped:
            result = run_search(problem, db=db, budget=budget, dry_run=dry_run, resume=resume,
                                on_progress=show, **kw)
        else:
            with live:
                result = run_search(problem, db=db, budget=budget, dry_run=dry_run,
                                    resume=resume, on_progress=show, **kw)
    except SearchInterrupted as exc:
        _context["interrupt_said"] = True
        console.print("[yellow]stopped; everything recorded is kept. Resume with:[/] "
                      + escape(resume_command(exc.run_id, db=db, dry_run=dry_run,
                                              llm=kw.get("llm"))), soft_wrap=True)
        raise typer.Exit(130) from None
    except LLMUnreachable as exc:  # the first proposal showed no LLM can answer: say so now
        _refuse(f"{escape(str(exc))}; everything recorded is kept, resume with: "
                + escape(resume_command(exc.run_id, db=db, dry_run=dry_run, llm=kw.get("llm"))), 1)
    if last:
        console.print(table(last[0]))
    with CandidateDB(db) as store:
        best = store.best(problem.workload, run_id=result.run_id)
    console.print()
    switch = (f"phase switch at generation {result.phase_switch_generation}"
              if result.phase_switch_generation is not None else "no phase switch (the budget "
              "ran out while exploring)" if result.stopped == "budget" else "no phase switch")
    console.print(f"run {result.run_id}: {result.evaluations} evaluations, stopped by "
                  f"{result.stopped}; {switch}")
    if best:
        cand, ev = best
        from cuco.design import Directives
        console.print(f"best: candidate {cand.id} {Directives(**cand.directives).full_name} "
                      + best_speedup_text(ev))
    return result, best


#: What a best verdict's speedup rests on, as the search's last line says it.
_EVIDENCE_TEXT = {"measured": "measured", "model": "analytic model, not measured",
                  "emulated": "emulated world: checked, not timed"}


def best_speedup_text(ev) -> str:
    """``speedup 1.234 (measured)``: the verdict's own evidence names the number, never the
    command's flags (an emulated world's verdict has no speedup at all)."""
    number = "-" if ev.speedup is None else f"{ev.speedup:.3f}"
    return f"speedup {number} ({_EVIDENCE_TEXT[ev.evidence]})"


def _problem(workload: str, shape: Optional[str], world_size: int):
    """The typed problem of ``--workload`` at ``--shape`` (the GEMM default 8192^3, or the
    workload's own defaults); a bad one is an InputError naming ``--shape`` and the fix."""
    from cuco.agents.api import resolve_problem
    from cuco.design import GemmProblem, check_workload, parse_shape, problem_class

    check_workload(workload)
    if shape is None:
        shape = "8192x8192x8192" if problem_class(workload) is GemmProblem else ""
    fields = parse_shape(workload, shape)
    _context.update(shape=fields, problem_class=problem_class(workload))
    return resolve_problem(workload, fields, world_size)


def _placements(text: str) -> tuple[str, ...]:
    """``--placements a,b`` -> a tuple, or exit 2 naming the placements there are."""
    picked = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in picked if p not in PLACEMENTS]
    if bad or not picked:
        _refuse(f"--placements {text!r}: choose among {', '.join(PLACEMENTS)}", 2)
    return picked


@app.command()
def demo(
    out: Optional[Path] = typer.Option(None, "--out", help="folder for the database, report and "
                                       "artifact (default: a new temporary folder)"),
    budget: Optional[int] = typer.Option(None, help="evaluations (default 16 on GPUs, 48 in a "
                                         "dry run)", show_default=False),
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
) -> None:
    """The main job: search GEMM+AllReduce 8192^3, write a report, pack and compile the winner.

    On a machine with WORLD_SIZE Hopper GPUs the search is real (every candidate compiled,
    checked and timed; minutes). Without them it is a clearly labelled dry run of the
    analytic model, and the winner is compiled for sm_90a to prove it builds (under two
    minutes on 2 cores). Exits 0 either way.
    """
    import tempfile

    from cuco.agents.api import check_search
    from cuco.design import check_count
    from cuco.export import export
    from cuco.report import write_report
    from cuco.runtime import visible_gpus

    gpus = visible_gpus()
    check_count("world_size", world_size, "GPUs (ranks)", 2)
    real = gpus >= world_size
    budget = (16 if real else 48) if budget is None else budget
    problem = check_search(_problem("gemm_allreduce", None, world_size), budget=budget, islands=2)
    folder = out or Path(tempfile.mkdtemp(prefix="cuco-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = str(folder / "cuco.db")
    if real:
        console.print(f"[bold]{gpus} GPU(s): a real search[/] of gemm_allreduce 8192x8192x8192 on "
                      f"{world_size} of them, {budget} evaluations (each compiled, checked, timed)")
    else:
        console.print(f"[bold yellow]DRY RUN[/]: {gpus} GPU(s) visible, {world_size} needed to "
                      "measure. Searching the analytic model instead: its speedups are predictions, "
                      "not measurements, and no kernel is run or checked. The winner is then compiled "
                      "for Hopper (sm_90a) to show that it builds.", soft_wrap=True)
    result, best = _run_search(problem, db=db, budget=budget, dry_run=not real, islands=2)
    with console.status("writing the report..."):
        report_path = write_report(db, folder / "report.html", result.run_id)
    console.print(f"report: {report_path}")
    if best is None:
        console.print("[yellow]no correct candidate to export[/]")
        return
    arch = None if real else "sm_90a"
    from cuco.db import CandidateDB
    with console.status(f"compiling the winner (candidate {best[0].id}) for "
                        f"{arch or 'this GPU'} with nvcc (about a minute)..."):
        art = export(CandidateDB(db), best[0].id, folder / "artifact", arch=arch)
    console.print(f"artifact: {art.path} ({art.manifest['variant']}, {art.manifest['arch']}, "
                  f"speedup {art.speedup_text()})")
    if not real and gpus >= 1:
        _check_in_emulated_world(db, best[0], problem, result.run_id)
    if not real:
        console.print("[yellow]dry run done: numbers above are the analytic model's. On a machine "
                      f"with {world_size} Hopper GPU{'s' if world_size > 1 else ''}, `cuco demo` "
                      "measures them.[/]", soft_wrap=True)


def _check_in_emulated_world(db: str, cand, problem, run_id: int) -> None:
    """One GPU: the dry run's winner, run for real with every rank on that GPU (an emulated
    world) and checked by the evaluator; checked, not timed. Says why where it cannot."""
    from cuco.db import CandidateDB
    from cuco.design import Directives
    from cuco.errors import CucoError
    from cuco.evaluate import evaluator_for
    from cuco.evaluate.evaluator import Candidate
    from cuco.runtime import WorkerGroup
    console.print(f"checking the winner on this GPU in an emulated world of {problem.world_size} "
                  "ranks (every rank on the one GPU under MPS)...")
    try:
        with WorkerGroup(problem.world_size, emulate=True, nvshmem=True) as group:
            ev = evaluator_for(problem, group=group, db=CandidateDB(db), run_id=run_id, timing_iters=8)
            r = ev.evaluate(Candidate(Directives(**cand.directives), candidate_id=cand.id))
    except CucoError as exc:
        console.print(f"[yellow]not checked: {escape(str(exc))}[/]", soft_wrap=True)
        return
    if r.status == "ok":
        console.print(f"[green]the winner is correct[/] in an emulated {problem.world_size}-rank "
                      f"world ({r.extra.get('calls_verified')} calls verified): checked, [bold]not "
                      "timed[/] (the ranks share one GPU, so its time says nothing)", soft_wrap=True)
    else:
        console.print(f"[red]the winner failed its checks[/] in an emulated world: {r.status} at "
                      f"{r.stage_reached}: {escape((r.error or '')[:300])}", soft_wrap=True)


def _emulate(world_size: int, instead: str = "add --dry-run to search an analytic model "
             "instead") -> None:
    """Every worker group of this command puts its ranks on one GPU (``CUCO_EMULATE``), or
    exit 1 saying why it cannot (``instead``: what to do without a GPU)."""
    from cuco.runtime import visible_gpus
    from cuco.runtime.emulated import ENV_VAR, check_world
    check_world(world_size)  # a world one GPU cannot hold is refused first, GPU or not
    if visible_gpus() < 1:
        _refuse(f"--emulate still needs one GPU, and none is visible; {instead}", 1)
    os.environ[ENV_VAR] = str(world_size)
    console.print(f"emulated world: {world_size} ranks on one GPU; kernels are checked, "
                  "not timed (no speedups)")


@app.command()
def fastpath(
    workload: str = typer.Option("gemm_allreduce", help=WORKLOAD_HELP),
    shape: Optional[str] = typer.Option(None, help=SHAPE_HELP),
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
    host_program: Optional[Path] = typer.Option(None, exists=True, dir_okay=False,
                                                help="CUDA/C++ of the host-driven program "
                                                "(the LLM route reads it)"),
    llm: Optional[str] = typer.Option(None, help="openai:MODEL | anthropic:MODEL | compat:URL|MODEL"),
    rounds: int = typer.Option(6, help="attempts before giving up"),
    emulate: bool = typer.Option(False, "--emulate", metavar=FLAG,
                                 help="every rank on one GPU under MPS (an emulated world): "
                                 "kernels are checked, never timed; verdicts carry no speedup"),
    db: str = DB_OPTION,
) -> None:
    """First correct device-initiated kernel: template route, or --llm with --host-program."""
    from cuco.agents.api import check_search
    from cuco.agents.api import fastpath as run_fastpath
    from cuco.design import check_count
    from cuco.runtime import visible_gpus

    problem = check_search(_problem(workload, shape, world_size), llm=llm,
                           placements=(Placement.SIDE_STREAM.value,))
    check_count("max_rounds", rounds, "rounds", 6)
    _db_folder_exists(db)
    if llm and host_program is None:
        _refuse("--llm needs --host-program FILE (the program to port)", 2)
    if emulate:
        _emulate(world_size, instead="the fast path proves its kernel correct on a GPU: run it "
                 "on a GPU machine, or `cuco search --dry-run` to search an analytic model")
    elif visible_gpus() < world_size:
        hint = ("--emulate puts every rank on one GPU" if visible_gpus() else
                "on a machine without GPUs, `cuco search --dry-run` searches an analytic model")
        _refuse(f"{visible_gpus()} GPU(s) visible but the fast path needs {world_size} "
                f"(it proves its kernel correct on them; {hint})", 1)
    res = run_fastpath(problem, db=db, llm=llm, max_rounds=rounds,
                       host_program=host_program.read_text() if host_program else None)
    for what, status in res.tried:
        console.print(f"  {what}: {status}")
    if res.result is None:
        console.print(f"[red]no correct kernel in {res.rounds} rounds[/]")
        raise typer.Exit(1)
    speed = ("checked in an emulated world, not timed" if res.result.speedup is None
             else f"speedup {res.result.speedup:.3f}")
    console.print(f"candidate {res.candidate_id} ({res.directives.full_name}) passed in "
                  f"{res.rounds} round(s): {speed}")


@app.command()
def report(db: str = typer.Argument(..., help="candidate database file or SQLAlchemy URL"),
           output: Path = typer.Option(Path("report.html"), "-o", "--output",
                                       help="HTML file to write (its folder must exist)"),
           run: Optional[int] = typer.Option(None, help="only this run")) -> None:
    """Write a self-contained HTML report (plots inline, no network)."""
    from cuco.report import write_report

    _require_db(db, "give the database path as the first argument: cuco report PATH -o report.html")
    if not output.parent.is_dir():  # before the database is opened
        write_report(db, output, run)  # refuses with the fix
    _writable(output, "-o")
    from cuco.db import CandidateDB
    with CandidateDB(db) as store:
        if run is not None:
            store.run(run)  # an unknown --run is refused here, with the way to list them
        with console.status("rendering the report (plots)..."):
            path = write_report(store, output, run)
        runs = [store.run(run)] if run is not None else store.runs()
        failed_only = not any(store.best(r.workload, run_id=r.id) for r in runs)
    console.print(f"wrote {path}" + ("; no candidate of " + ("this run" if run is not None else
                                                            "any run") + " is correct: the page "
                                     "shows where they failed" if failed_only else ""))


@app.command("export")
def export_cmd(candidate_id: int, output: Path = typer.Option(..., "-o", "--output",
                                                             help="artifact folder to write"),
               arch: Optional[str] = typer.Option(None, help="target arch (default: this GPU's)"),
               db: str = DB_OPTION) -> None:
    """Pack a scored candidate as an artifact directory (kernel.cubin or kernel.so, source, manifest)."""
    from cuco.db import CandidateDB
    from cuco.export import export
    from cuco.kernels import Compiler

    if arch is not None:
        Compiler(arch=arch)  # a bad --arch is refused before the database is opened
    _require_db(db)
    _writable(output, "-o")
    with console.status(f"exporting candidate {candidate_id}: compiling its kernel with nvcc "
                        "(about a minute for the one-kernel CUTLASS placements)..."):
        art = export(CandidateDB(db), candidate_id, output, arch=arch)
    console.print(f"wrote {art.path}: {art.manifest['variant']} for {art.manifest['arch']}, "
                  f"speedup {art.speedup_text()}")


@app.command("tune")
def tune_cmd(
    pattern: str = typer.Argument(..., help="gemm_allreduce, gemm_reducescatter or allgather_gemm"),
    n: int = typer.Option(..., "--n", help="the layer's N (global output columns)"),
    k: int = typer.Option(..., "--k", help="the layer's K (global inner dimension)"),
    table: Path = typer.Option(..., "--table", help="the table file to write (or add the layer to)"),
    m: list[int] = typer.Option([], "--m", help="a bucket of M (tokens) besides the default "
                                "powers of two 16..16384; repeat it"),
    only: bool = typer.Option(False, "--only", help="time only the --m buckets, not the defaults"),
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32"),
    world_size: int = typer.Option(2, "--world-size", help="GPUs (ranks) of the layer"),
    placements: str = typer.Option(",".join(PLACEMENTS),
                                   help="placements of the cuco candidates"),
    dry_run: bool = typer.Option(False, "--dry-run", help="no GPU: the analytic model's times "
                                 "(the table is marked model)"),
    arch: Optional[str] = typer.Option(None, help="target arch of exported kernels (default: this GPU's)"),
    fresh: bool = typer.Option(False, "--fresh", help="measure every bucket again (by default the "
                               "buckets this layer already has in --table from this commit are kept, "
                               "so a run cut short goes on where it stopped)"),
) -> None:
    """Time a layer at every M bucket (cuco's candidates, torch's fused op, the host
    program) and write its dispatch table: the op then runs the fastest correct per bucket.
    The table is written after each bucket; run again, it goes on where it stopped."""
    import shlex
    import sys

    from cuco.dispatch import DEFAULT_BUCKETS, Layer, buckets
    from cuco.dispatch_tune import GpuMeasure, ModelMeasure, tune_table
    from cuco.runtime import visible_gpus

    _context["positional"] = {"pattern": "cuco tune"}
    layer = Layer(pattern, n, k, dtype, world_size)
    _folder_exists(table, "--table")
    _writable(table, "--table")
    ms = buckets(m, default=() if only else DEFAULT_BUCKETS)
    if not ms:
        _refuse("--only with no --m: name the buckets to time", 2)
    picked = _placements(placements)
    command = "cuco " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    group = None
    if dry_run:
        measure = ModelMeasure()
    else:
        have = visible_gpus()
        if have < world_size:
            _refuse(f"timing {layer.key} needs {world_size} GPUs, {have} "
                    "visible; run on the machine the table is for, or pass --dry-run for "
                    "the analytic model's table (marked model)", 1)
        from cuco.runtime import WorkerGroup
        group = WorkerGroup(world_size).start()
        measure = GpuMeasure(group, arch=arch)
    try:
        with console.status(f"tuning {layer.key} at {len(ms)} buckets ({measure.source})..."):
            tuned = tune_table(layer, ms, measure=measure, table_path=table, placements=picked,
                               command=command, arch=arch, fresh=fresh, progress=console.print)
    finally:
        if group is not None:
            group.close()
    for bucket, why in sorted(tuned.skipped.items()):
        console.print(f"[yellow]M={bucket} skipped: {escape(why)}[/]")
    for line in tuned.table.summary():
        console.print(escape(line))
    console.print(f"wrote {table}"
                  + (" (model: predictions, not measurements)" if measure.source != "measured" else ""))


@bench_app.command("collectives")
def bench_collectives(
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
    sizes: str = typer.Option("64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB"),
    iters: int = typer.Option(50, help="timed samples per variant"),
    out_dir: Path = typer.Option(Path("bench/results")),
) -> None:
    """LSA / NVSHMEM collectives vs host NCCL. Without GPUs: a compile-only pass."""
    from cuco.benchmarks.collectives import CollectivesBench, check_sizes
    from cuco.design import check_count
    from cuco.runtime import visible_gpus

    check_count("world_size", world_size, "GPUs (ranks)", 2)
    check_count("iters", iters, "timed samples", 50)
    picked = check_sizes(sizes)
    bench = CollectivesBench(world_size=world_size, sizes=picked, iters=iters,
                             out_dir=out_dir, console=console)
    n = visible_gpus()
    if n < world_size:
        from cuco.kernels.collectives import all_sources
        _show_compiled(CATALOG_ARCHS[0], all_sources())  # the collectives' kernels, not the catalog
        console.print(f"[yellow]{n} GPU(s) visible: timing the collectives needs {world_size} "
                      "GPUs with NVLink. Only the compile-only pass ran.[/]")
        return
    from cuco import results
    results.require_commit()  # before the timing, which a refused file would lose
    bench.run()


def main() -> None:
    """The ``cuco`` command: a CucoError (or an OS error) is one line, never a traceback,
    unless ``--debug`` / ``CUCO_DEBUG=1``."""
    import sys
    debug = "--debug" in sys.argv[1:] or os.environ.get("CUCO_DEBUG", "") not in ("", "0")
    try:
        code = app(prog_name="cuco", standalone_mode=False)
    except typer.TyperException as exc:  # typer's (click's) own parse errors
        if type(exc).__name__ == "NoArgsIsHelpError":  # `cuco db`: its help, as before
            exc.show()
        elif debug:
            raise
        else:  # a flag typer cannot parse: one line, not a panel
            err_console.print(f"[red]error:[/] {escape(_usage_line(exc))}", soft_wrap=True)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    except SystemExit:
        raise
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    except BaseException as exc:  # noqa: BLE001 - the last line of defence for a CLI user
        if debug:
            raise
        raise SystemExit(_fail(exc)) from None
    if code == 130 and not _context.get("interrupt_said"):  # typer ends a Ctrl-C silently
        console.print("[yellow]interrupted (Ctrl-C): stopped before it finished[/]")
    raise SystemExit(code if isinstance(code, int) else 0)


def _usage_line(exc) -> str:
    """A parse error of typer's (click's) as one line naming the command's help."""
    import re
    text = " ".join(exc.format_message().split()).rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return text
    extra = re.match(r"Got unexpected extra argument\S* \((\S+)\)$", text)
    takes_db = any("--db" in getattr(p, "opts", ()) for p in ctx.command.params)
    looks_like_db = extra and (extra.group(1).endswith((".db", ".sqlite", ".sqlite3"))
                               or "://" in extra.group(1) or Path(extra.group(1)).is_file())
    if looks_like_db and takes_db:  # `cuco db ls c.db`: the database is named by --db there
        return text + f"; name a database with --db: {ctx.command_path} --db {extra.group(1)}"
    return text + f"; see `{ctx.command_path} --help`"


if __name__ == "__main__":
    main()
