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


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


def _require_db(db: str) -> None:
    if "://" not in db and not Path(db).exists():
        console.print(f"[red]no candidate database at {db}[/]; pass --db PATH or set CUCO_DB")
        raise typer.Exit(1)


@kernels_app.command("check")
def kernels_check(arch: str = typer.Option("sm_90a", help="target when there is no GPU")) -> None:
    """Render and compile every kernel template and host shim (no GPU needed)."""
    from cuco.kernels.catalog import compile_everything

    report = compile_everything(arch)
    table = Table(title=f"kernels compiled for {arch}")
    table.add_column("kernel")
    table.add_column("result", overflow="fold")
    for name, status in report.items():
        table.add_row(name, "[green]ok[/]" if status == "ok" else f"[red]{escape(status)}[/]")
    console.print(table)
    if any(v != "ok" for v in report.values()):
        raise typer.Exit(1)


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
