"""The ``cuco`` command (typer + rich)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="cuco: fused compute + communication GPU kernels, searched and verified.",
                  no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Inspect a candidate database.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that write bench/results/<name>.json.", no_args_is_help=True)
kernels_app = typer.Typer(help="Kernel templates.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
app.add_typer(kernels_app, name="kernels")
console = Console()

DB_OPTION = typer.Option(os.environ.get("CUCO_DB", "cuco.db"), "--db",
                         help="database file or SQLAlchemy URL (env CUCO_DB)")


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
                      "checking and timing them needs NVIDIA GPUs (2+ with NVLink for "
                      "communication).[/]")


@db_app.command("ls")
def db_ls(db: str = DB_OPTION) -> None:
    """Runs and candidate counts."""
    from cuco.db import CandidateDB

    _require_db(db)
    with CandidateDB(db) as store:
        runs = store.runs()
        table = Table(title=f"{store.url} (schema v{store.schema_version})")
        for col in ("run", "name", "workload", "status", "candidates", "best speedup"):
            table.add_column(col)
        for r in runs:
            best = store.best(r.workload, run_id=r.id)
            table.add_row(str(r.id), r.name, r.workload, r.status,
                          str(store.count_candidates(r.id)),
                          f"{best[1].speedup:.3f}" if best else "-")
        loose = store.count_candidates() - sum(store.count_candidates(r.id) for r in runs)
        console.print(table)
        console.print(f"{len(runs)} run(s); {loose} candidate(s) outside any run")


@db_app.command("show")
def db_show(candidate_id: int, db: str = DB_OPTION,
            source: bool = typer.Option(False, "--source", help="print the kernel source")) -> None:
    """One candidate: directives, lineage and evaluations."""
    from cuco.db import CandidateDB

    _require_db(db)
    with CandidateDB(db) as store:
        try:
            cand = store.candidate(candidate_id)
        except KeyError as exc:
            console.print(f"[red]{exc.args[0]}[/]")
            raise typer.Exit(1) from None
        console.print(f"[bold]candidate {cand.id}[/] workload={cand.workload} origin={cand.origin} "
                      f"run={cand.run_id} island={cand.island} generation={cand.generation}")
        console.print(f"parents: {cand.parents or '-'}  lineage: "
                      + " <- ".join(str(c.id) for c in store.lineage(cand.id)))
        if cand.directives:
            console.print("directives: " + json.dumps(cand.directives))
        table = Table(title="evaluations")
        for col in ("id", "stage", "status", "ms", "speedup", "overlap", "max err", "error"):
            table.add_column(col, overflow="fold")
        for e in store.evaluations(cand.id):
            table.add_row(str(e.id), e.stage_reached, e.status, _fmt(e.time_ms), _fmt(e.speedup),
                          _fmt(e.overlap_eff), _fmt(e.max_error), (e.error or "")[:200])
        console.print(table)
        if source and cand.source:
            console.print(cand.source, markup=False, highlight=False)


@db_app.command("migrate")
def db_migrate(source: str = typer.Argument(..., help="database to copy from (file or URL)"),
               target: str = typer.Argument(..., help="empty database to copy into (URL)")) -> None:
    """Copy a candidate database, ids kept (e.g. SQLite -> postgresql+psycopg://...)."""
    from cuco.db import CandidateDB
    from cuco.errors import DatabaseError

    _require_db(source)
    try:
        counts = CandidateDB(source).copy_to(CandidateDB(target))
    except DatabaseError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print("copied " + ", ".join(f"{n} {t}" for t, n in counts.items()))


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


def _require_db(db: str) -> None:
    if "://" not in db and not Path(db).exists():
        console.print(f"[red]no candidate database at {db}[/]; pass --db PATH or set CUCO_DB")
        raise typer.Exit(1)


@kernels_app.command("check")
def kernels_check(arch: str = typer.Option("sm_90a", help="target when there is no GPU")) -> None:
    """Render and compile every kernel template and host shim (no GPU needed)."""
    from cuco.workloads.catalog import compile_everything

    report = compile_everything(arch)
    table = Table(title=f"kernels compiled for {arch}")
    table.add_column("kernel")
    table.add_column("result", overflow="fold")
    for name, status in report.items():
        table.add_row(name, "[green]ok[/]" if status == "ok" else f"[red]{escape(status)}[/]")
    console.print(table)
    if any(v != "ok" for v in report.values()):
        raise typer.Exit(1)


@app.command()
def search(
    workload: str = typer.Option("gemm_allreduce", help="gemm_allreduce | gemm_reducescatter | allgather_gemm"),
    shape: str = typer.Option("8192x8192x8192", help="global MxKxN"),
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
    budget: int = typer.Option(100, help="evaluations"),
    islands: int = typer.Option(4),
    seed: int = typer.Option(0),
    proposer: str = typer.Option("offline", help="offline | tpe"),
    dry_run: bool = typer.Option(False, "--dry-run", help="score an analytic model (no GPU)"),
    resume: Optional[int] = typer.Option(None, help="continue this run id from the database"),
    llm: Optional[str] = typer.Option(None, help="openai:MODEL | anthropic:MODEL | compat:URL|MODEL"),
    cluster: Optional[str] = typer.Option(None, help="Ray address (ray://host:10001), or 'local'"),
    hosts: int = typer.Option(2, help="cluster hosts (one actor each)"),
    placements: str = typer.Option("side_stream,epilogue,dedicated_ctas",
                                   help="placements to search (comma-separated)"),
    db: str = DB_OPTION,
) -> None:
    """Evolutionary search of fused kernels; Ctrl-C stops cleanly, --resume continues."""
    from rich.live import Live

    from cuco.agents.api import search as run_search
    from cuco.errors import CucoError
    from cuco.runtime import visible_gpus

    m, k, n = _shape(shape)
    if not dry_run and cluster is None and visible_gpus() < world_size:
        console.print(f"[red]{visible_gpus()} GPU(s) visible but the search needs {world_size}[/]; "
                      "run on a GPU machine, or add --dry-run to search an analytic model")
        raise typer.Exit(1)
    state: dict = {}
    live = Live(Table(), console=console, refresh_per_second=4)

    def show(summary: dict) -> None:
        state.update(summary)
        t = Table(title=f"{workload} {shape} w={world_size}: generation {summary['generation']} "
                        f"({summary['phase']}), {summary['evaluations']}/{budget} evaluations, "
                        f"{60 * summary['evaluations'] / max(summary['elapsed_s'], 1e-9):.0f}/min")
        for col in ("island", "members", "best speedup", "mean", "correct"):
            t.add_column(col)
        for isl in summary["islands"]:
            t.add_row(str(isl["island"]), str(isl["size"]), f"{isl['best']:.3f}",
                      f"{isl['mean']:.3f}", str(isl["ok"]))
        if summary["failed"]:
            t.caption = "failures: " + ", ".join(f"{k} x{v}" for k, v in summary["failed"].items())
        live.update(t)

    try:
        with live:
            result = run_search(workload, m, n, k, world_size, db=db, budget=budget,
                                islands=islands, seed=seed, proposer=proposer, dry_run=dry_run,
                                resume=resume, on_progress=show, llm=llm,
                                cluster=cluster, hosts=hosts,
                                placements=_placements(placements))
    except KeyboardInterrupt:
        console.print("[yellow]stopped; resume with[/] cuco search --resume <run id> "
                      "(see `cuco db ls`)")
        raise typer.Exit(130) from None
    except CucoError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    best = result.best
    console.print(f"run {result.run_id}: {result.evaluations} evaluations, stopped by "
                  f"{result.stopped}; phase switch at generation {result.phase_switch_generation}")
    if best:
        console.print(f"best: candidate {best.candidate_id} {best.directives.full_name} "
                      f"speedup {best.score:.3f}" + (" (analytic model)" if dry_run else ""))


def _shape(shape: str) -> tuple[int, int, int]:
    """``MxKxN`` -> ``(m, k, n)``, or exit 2 saying what the option wants."""
    try:
        m, k, n = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        console.print(f"[red]--shape {shape!r} is not MxKxN (e.g. 8192x8192x8192)[/]")
        raise typer.Exit(2) from None
    return m, k, n


def _placements(text: str) -> tuple[str, ...]:
    """``--placements a,b`` -> a tuple, or exit 2 naming the placements there are."""
    from cuco.agents.api import PLACEMENTS
    picked = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in picked if p not in PLACEMENTS]
    if bad or not picked:
        console.print(f"[red]--placements {text!r}: choose among {', '.join(PLACEMENTS)}[/]")
        raise typer.Exit(2)
    return picked


@app.command()
def fastpath(
    workload: str = typer.Option("gemm_allreduce", help="the communication pattern of the program"),
    shape: str = typer.Option("8192x8192x8192", help="global MxKxN"),
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
    host_program: Optional[Path] = typer.Option(None, help="CUDA/C++ of the host-driven program "
                                                "(the LLM route reads it)"),
    llm: Optional[str] = typer.Option(None, help="openai:MODEL | anthropic:MODEL | compat:URL|MODEL"),
    rounds: int = typer.Option(6, help="attempts before giving up"),
    db: str = DB_OPTION,
) -> None:
    """First correct device-initiated kernel: template route, or --llm with --host-program."""
    from cuco.agents.api import fastpath as run_fastpath
    from cuco.errors import CucoError
    from cuco.runtime import visible_gpus

    m, k, n = _shape(shape)
    if llm and host_program is None:
        console.print("[red]--llm needs --host-program FILE (the program to port)[/]")
        raise typer.Exit(2)
    if visible_gpus() < world_size:
        console.print(f"[red]{visible_gpus()} GPU(s) visible but the fast path needs {world_size}[/] "
                      "(it proves its kernel correct on them)")
        raise typer.Exit(1)
    try:
        res = run_fastpath(workload, m, n, k, world_size, db=db, llm=llm, max_rounds=rounds,
                           host_program=host_program.read_text() if host_program else None)
    except (CucoError, ValueError) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    for what, status in res.tried:
        console.print(f"  {what}: {status}")
    if res.result is None:
        console.print(f"[red]no correct kernel in {res.rounds} rounds[/]")
        raise typer.Exit(1)
    console.print(f"candidate {res.candidate_id} ({res.directives.full_name}) passed in "
                  f"{res.rounds} round(s): speedup {res.result.speedup:.3f}")


@app.command()
def report(db: str = typer.Argument(..., help="candidate database file or SQLAlchemy URL"),
           output: Path = typer.Option(Path("report.html"), "-o", "--output"),
           run: Optional[int] = typer.Option(None, help="only this run")) -> None:
    """Write a self-contained HTML report (plots inline, no network)."""
    from cuco.report import write_report

    _require_db(db)
    from cuco.db import CandidateDB
    with CandidateDB(db) as store:
        path = write_report(store, output, run)
    console.print(f"wrote {path}")


@app.command("export")
def export_cmd(candidate_id: int, output: Path = typer.Option(..., "-o", "--output"),
               arch: Optional[str] = typer.Option(None, help="target arch (default: this GPU's)"),
               db: str = DB_OPTION) -> None:
    """Pack a scored candidate as an artifact directory (cubin, source, manifest)."""
    from cuco.db import CandidateDB
    from cuco.errors import CucoError
    from cuco.export import export

    _require_db(db)
    try:
        art = export(CandidateDB(db), candidate_id, output, arch=arch)
    except (CucoError, KeyError) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    console.print(f"wrote {art.path}: {art.manifest['variant']} for {art.manifest['arch']}, "
                  f"speedup {art.speedup}")


@bench_app.command("collectives")
def bench_collectives(
    world_size: int = typer.Option(2, help="GPUs (ranks)"),
    sizes: str = typer.Option("64KiB,256KiB,1MiB,4MiB,16MiB,64MiB,256MiB"),
    iters: int = typer.Option(50, help="timed samples per variant"),
    out_dir: Path = typer.Option(Path("bench/results")),
) -> None:
    """LSA / NVSHMEM collectives vs host NCCL. Without GPUs: a compile-only pass."""
    from cuco.benchmarks.collectives import CollectivesBench
    from cuco.runtime import visible_gpus

    bench = CollectivesBench(world_size=world_size, sizes=tuple(sizes.split(",")), iters=iters,
                             out_dir=out_dir, console=console)
    n = visible_gpus()
    if n < world_size:
        kernels_check("sm_90a")
        console.print(f"[yellow]{n} GPU(s) visible: timing the collectives needs {world_size} "
                      "GPUs with NVLink. Only the compile-only pass ran.[/]")
        return
    bench.run()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
