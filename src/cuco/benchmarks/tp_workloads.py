"""Tensor-parallel workloads benchmark: fused variants against the strongest host program.

For each (workload, shape), in one job and one schedule: the strongest host program
(``host_nccl``: the fastest of cuBLAS / cuBLASLt / torch GEMMs, then the faster of NCCL on
plain or registered buffers, chosen per shape in the workers), the host program before
#21 (``host_nccl_default``), PyTorch's fused op (``torch_fused``, where torch has one and
runs), and every fused variant of a directive grid — every call checked against an fp32
reference — with the best GEMM alone, the best collective alone and torch's GEMM alone
timed beside them. ``bound = max(t_gemm, t_comm)`` of the best pieces;
``speedup = t_host / t`` with t_host the faster of the two host programs (:meth:`Workload.strongest_host`);
``overlap_eff = bound / t``. Each case's keys
(:func:`case_keys`) go into every row and the summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cuco import results
from cuco.runtime.records import ProgramResult
from cuco.benchmarks.variants import compile_variants, run_cases
from cuco.design import Directives, Placement, GemmProblem
from cuco.design.patterns import TP_NAMES
from cuco.design.placement_rules import PLACEMENTS
from cuco.design.tiles import chunk_sizes
from cuco.kernels.tp import PROFILE, in_kernel, render_tp
from cuco.runtime.peaks import below_floor

SHAPES = ((8192, 8192, 8192), (4096, 8192, 28672), (2048, 4096, 4096))  # (M, K, N) as in DEVICE.md
FAMILIES = TP_NAMES
#: Programs of a case that are not cuco's: baselines, peers, and pieces timed alone.
NOT_CUCO = ("host_nccl", "host_nccl_default", "torch_fused", "compute_only", "comm_only",
            "torch_gemm", "*")


def case_keys(merged: dict[str, ProgramResult]) -> dict[str, Any]:
    """The per-case keys of the rows and the summary, from one job's merged programs: the
    strongest host program (its time and what it is made of), the old one, torch's GEMM
    alone and torch's fused op (``None`` with ``torch_fused_why`` where it did not run)."""
    def ms(name: str) -> float | None:
        t = merged[name].ms if name in merged else None
        return round(t, 5) if t is not None else None

    notes = merged["host_nccl"].notes
    fused = merged.get("torch_fused")
    skipped = notes.get("peers_skipped", {})
    return {"strong_host_ms": ms("host_nccl"), "host_gemm": notes.get("gemm"),
            "host_collective": notes.get("collective"), "host_gemm_ms": notes.get("gemm_ms"),
            "host_collective_ms": notes.get("collective_ms"),
            "host_nccl_default_ms": ms("host_nccl_default"), "torch_gemm_ms": ms("torch_gemm"),
            "torch_fused_ms": ms("torch_fused") if fused is not None and fused.correct else None,
            "torch_fused_correct": fused.correct if fused is not None else None,
            "torch_fused_why": skipped.get("torch_fused") if fused is None else
            (None if fused.correct else f"wrong output: {fused}")}


#: In-kernel points whose GEMM alone is timed beside them (``profile.gemm_only.*`` rows): the
#: consumers' own epilogue in row-by-row order, the epilogue handed to comm warps in
#: row-by-row and grouped (8 m-tiles) order, and the pingpong mainloop (grouped, comm warps).
PROFILED = (in_kernel("epilogue"), in_kernel("epilogue", comm_warps=3),
            in_kernel("epilogue", comm_warps=3, raster_group=8),
            in_kernel("epilogue", tile_n=128, stages=6, comm_warps=3, raster_group=8, schedule="pingpong"))


def grid(problem: GemmProblem, placements: tuple[str, ...] = PLACEMENTS, quick: bool = False) -> list[Directives]:
    """The directive grid of one case; ``quick``: one issuer per placement (what a short
    GPU session can compile and run for all nine pairs)."""
    out = []
    if "side_stream" in placements:
        for chunk in chunk_sizes(problem, (4, 8, 16)):  # about 4, 8 and 16 chunks per rank
            # the side-stream points that won in earlier sweeps of all 3 issuers x 16/32/64 CTAs
            pts = (("cta", 64),) if quick else (("cta", 32), ("cta", 64), ("warp", 64), ("thread", 64))
            for issuer, ctas in pts:
                out.append(Directives(backend="lsa", placement="side_stream", sync_scope="chunk",
                                      issuer=issuer, chunk_bytes=chunk, comm_ctas=ctas))
            if not quick:
                out.append(Directives(backend="nvshmem", placement="side_stream", sync_scope="chunk",
                                      issuer="cta", chunk_bytes=chunk, comm_ctas=32))
    esz = problem.dtype_bytes
    if "epilogue" in placements:
        # (backend, issuer, tile_n, stages, raster_group, comm_warps, schedule)
        coop, pp = "cooperative", "pingpong"
        pts = [("nvshmem", "cta", 256, 3, 1, 0, coop), ("nvshmem", "cta", 256, 3, 1, 3, coop),
               ("nvshmem", "cta", 256, 3, 8, 3, coop), ("lsa", "cta", 256, 3, 8, 3, coop),
               ("lsa", "cta", 128, 4, 8, 3, coop), ("nvshmem", "cta", 128, 6, 8, 3, pp),
               ("lsa", "cta", 128, 6, 8, 3, pp)]
        if not quick:
            pts += [("nvshmem", "cta", 256, 3, 16, 3, coop), ("lsa", "cta", 256, 3, 1, 0, coop),
                    ("lsa", "warp", 256, 3, 8, 3, coop), ("lsa", "thread", 256, 3, 8, 3, coop),
                    ("nvshmem", "cta", 256, 3, 4, 3, coop), ("nvshmem", "cta", 256, 3, 8, 1, coop),
                    ("lsa", "cta", 128, 4, 1, 0, coop), ("nvshmem", "cta", 128, 6, 16, 3, pp),
                    ("lsa", "cta", 128, 6, 8, 0, pp), ("lsa", "warp", 128, 6, 1, 3, pp)]
        for backend, issuer, tile_n, stages, group, warps, schedule in pts:
            out.append(in_kernel("epilogue", backend, issuer, tile_n=tile_n, stages=stages,
                                 dtype_bytes=esz, raster_group=group, comm_warps=warps,
                                 schedule=schedule))
    if "dedicated_ctas" in placements:
        pts = [("lsa", 16, 8, 3)] if quick else [("lsa", 16, 8, 3), ("lsa", 8, 8, 3), ("lsa", 16, 1, 0),
                                                 ("nvshmem", 16, 8, 3)]
        for backend, ctas, group, warps in pts:
            out.append(in_kernel("dedicated_ctas", backend, comm_ctas=ctas, dtype_bytes=esz,
                                 raster_group=group, comm_warps=warps))
    valid = []
    for d in out:
        try:
            render_tp(problem, d)
        except Exception:  # noqa: BLE001 - invalid for this shape: not part of its grid
            continue
        valid.append(d)
    return valid


@dataclass
class TPBench:
    world_size: int = 2
    shapes: tuple[tuple[int, int, int], ...] = SHAPES
    families: tuple[str, ...] = FAMILIES
    iters: int = 30
    warmup: int = 5
    out_dir: Path = results.RESULTS_DIR
    name: str = "tp_workloads"
    console: Console = field(default_factory=Console)
    peers: bool = True
    placements: tuple[str, ...] = PLACEMENTS
    quick: bool = False
    #: go on from this bench's result file: its finished cases are kept, not run again
    resume: bool = False
    done: frozenset[str] = frozenset()  # cases a previous run finished (set by run)

    def problems(self) -> list[GemmProblem]:
        return [p for (m, k, n) in self.shapes for f in self.families
                if (p := GemmProblem(workload=f, m=m, n=n, k=k, world_size=self.world_size)).label
                not in self.done]

    def finished(self) -> tuple[list[dict], str | None]:
        """The rows and device of the cases a previous run of this bench finished, when
        ``resume`` (a device session's time limit may cut a long spread short); a case that
        failed is run again. A file from another world size is refused."""
        if not self.resume:
            return [], None
        rows, device = results.resume_rows(self.name, out_dir=self.out_dir, world_size=self.world_size)
        failed = {r["case"] for r in rows if r.get("variant") == "*"}
        return [r for r in rows if r["case"] not in failed], device

    def compile_all(self, arch: str | None = None) -> dict[str, list]:
        """Render and compile every variant of every case (parallel, cached)."""
        points = [(p.label, d, render_tp(p, d)[0]) for p in self.problems() for d in grid(p, self.placements, self.quick)]
        if any(Placement(p).in_kernel for p in self.placements):  # profile: the fused kernel's GEMM, no communication
            points += [(p.label, d, render_tp(p, d, gemm_only=True)[0])
                       for p in self.problems() for d in PROFILED]
        return compile_variants(points, self.console, arch)

    def run_here(self) -> int:
        """:meth:`run` where ``world_size`` GPUs are visible; elsewhere compile every variant
        (a compile check of the whole grid) and say why nothing was timed. Exit status 0."""
        from cuco.runtime import visible_gpus
        if visible_gpus() < self.world_size:
            specs = self.compile_all("sm_90a")
            print(f"compiled {sum(len(v) for v in specs.values())} variants for {len(specs)} cases")
            print(f"{visible_gpus()} GPU(s) visible: the benchmark needs {self.world_size} GPUs; "
                  "only the compile-only pass ran.")
            return 0
        self.run()
        return 0

    def run(self) -> Path:
        from cuco.evaluate.jobs import Case
        from cuco.workloads import for_problem

        before, before_device = self.finished()
        self.done = frozenset(r["case"] for r in before)
        if before:
            self.console.print(f"resuming: {len(self.done)} case(s) already in {self.name}.json")
        t0 = time.perf_counter()
        specs = self.compile_all()
        compile_s = time.perf_counter() - t0

        def same_machine(device: str) -> None:
            results.same_device(self.name, before_device, device)

        def checkpoint(rows: list[dict], device: str) -> None:
            """A run cut short still leaves every finished case on disk."""
            same_machine(device)
            rows = before + rows
            results.write(self.name, rows, device=device, world_size=self.world_size, emulated=False,
                          out_dir=self.out_dir, extra={"compile_s": round(compile_s, 1),
                                                       "partial": True, "summary": self._summary(rows)})

        rows, device = run_cases(
            [(p.label, Case(for_problem(p), variants=specs.get(p.label, []), iters=self.iters,
                            warmup=self.warmup, peers=self.peers),
              lambda merged, p=p: self._rows(p, merged)) for p in self.problems()],
            world_size=self.world_size, heap_bytes=2 << 30, timeout_s=580, console=self.console,
            checkpoint=checkpoint)
        same_machine(device)
        rows = before + rows
        summary = self._summary(rows)
        path = results.write(self.name, rows, device=device, world_size=self.world_size, emulated=False,
                             out_dir=self.out_dir,
                             extra={"compile_s": round(compile_s, 1), "summary": summary})
        self._print(summary)
        self.console.print(f"wrote {path}")
        return path

    @staticmethod
    def _rows(p: GemmProblem, merged: dict[str, ProgramResult]) -> list[dict[str, Any]]:
        from cuco.workloads import for_problem
        baseline = for_problem(p).strongest_host(merged)
        host = merged[baseline].ms
        t_comp, t_comm = merged["compute_only"].ms, merged["comm_only"].ms
        bound = max(t_comp, t_comm)
        keys = case_keys(merged)
        fused = keys["torch_fused_ms"]
        out = []
        for name, m in merged.items():
            backend = name.split(".")[0]
            row = {"case": p.label, "variant": name, "ms": round(m.ms, 5),
                   "rank_ms": [round(x, 5) for x in m.rank_ms],
                   "baseline": baseline, "baseline_ms": round(host, 5),
                   "speedup": round(host / m.ms, 4), "bound_ms": round(bound, 5),
                   "overlap_eff": round(bound / m.ms, 4),
                   "gemm_ms": round(t_comp, 5), "comm_ms": round(t_comm, 5),
                   **m.verdict(), "backend": backend,
                   **keys,
                   "peers": {"torch_fused_ms": fused, "torch_gemm_ms": keys["torch_gemm_ms"],
                             "why": keys["torch_fused_why"],
                             "cuco_over_torch_fused": round(fused / m.ms, 4) if fused else None},
                   "floor_ms": m.floor_ms if m.verified else None,
                   # faster than the physical floor: it did less than the workload asks
                   "suspect": below_floor(m)}
            if name.startswith(PROFILE):  # not the workload's output: a time, not a candidate
                row.update(role="profile", correct=None, suspect=False)
            out.append(row)
        return out

    @staticmethod
    def _summary(rows: list[dict]) -> dict[str, Any]:
        best: dict[str, dict] = {}
        profile: dict[str, dict[str, float]] = {}
        for r in rows:
            if r["variant"].startswith(PROFILE):
                profile.setdefault(r["case"], {})[r["variant"].removeprefix(PROFILE)] = r["ms"]
            if r["variant"] in NOT_CUCO or not r.get("correct") or r.get("suspect"):
                continue
            if r["case"] not in best or r["ms"] < best[r["case"]]["ms"]:
                best[r["case"]] = r
        return {case: {"variant": r["variant"], "ms": r["ms"], "host_ms": r["baseline_ms"],
                       "bound_ms": r["bound_ms"], "speedup": r["speedup"],
                       "overlap_eff": r["overlap_eff"],
                       **{key: r.get(key) for key in ("strong_host_ms", "host_gemm", "host_collective",
                                                      "host_nccl_default_ms", "torch_gemm_ms",
                                                      "torch_fused_ms", "torch_fused_why")},
                       "cuco_over_torch_fused": (r.get("peers") or {}).get("cuco_over_torch_fused"),
                       "vendor_gemm_ms": r.get("gemm_ms"),
                       # the fastest in-kernel GEMM without communication, and each one timed
                       "in_kernel_gemm_ms": min(profile[case].values()) if case in profile else None,
                       "in_kernel_gemm": profile.get(case, {})}
                for case, r in best.items()}

    def _print(self, summary: dict[str, Any]) -> None:
        t = Table(title="tensor-parallel workloads: best fused variant (ms, max over ranks)")
        for col in ("case", "best variant", "ms", "strong host", "host GEMM + collective", "bound",
                    "speedup", "overlap", "torch fused"):
            t.add_column(col)
        for case, s in summary.items():
            fused = s.get("torch_fused_ms")
            t.add_row(case, s["variant"], f"{s['ms']:.3f}", f"{s['host_ms']:.3f}",
                      f"{s.get('host_gemm')} + {s.get('host_collective')}",
                      f"{s['bound_ms']:.3f}", f"{s['speedup']:.2f}", f"{s['overlap_eff']:.2f}",
                      f"{fused:.3f}" if fused else "-")
        self.console.print(t)
