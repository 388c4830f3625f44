"""Benchmark of the pipeline workloads (KV transfer, MoE, context-parallel attention).

For each workload config: the host-driven program, the compute alone, the
communication alone, any extra baselines the workload names (e.g. the host program
overlapped by hand) and every fused variant of its directive grid — all checked
against the fp32 reference, then timed interleaved in one job.
``bound = max(t_compute, t_comm)``, ``speedup = t_host / t``, ``overlap_eff = bound / t``;
KV-transfer and CP-attention rows add ``hidden_fraction = 1 - max(0, t - t_compute) / t_comm``;
every row has ``comm_share = t_comm / t_host`` (the communication's share of the host program).
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
from cuco.workloads.pipeline import BASELINES, PipelineWorkload

#: NVSHMEM symmetric heap for the largest arena (MoE prefill: ~1.5 GB).
HEAP_BYTES = 4 << 30


@dataclass
class PipelineBench:
    name: str
    workloads: list[PipelineWorkload]
    world_size: int = 2
    iters: int = 20
    warmup: int = 3
    out_dir: Path = results.RESULTS_DIR
    console: Console = field(default_factory=Console)
    timeout_s: float = 580.0

    def compile_all(self, arch: str | None = None) -> dict[str, list]:
        specs = compile_variants([(wl.label, d, wl.render(d))
                                  for wl in self.workloads for d in wl.grid()], self.console, arch)
        return {wl.label: specs.get(wl.label, []) for wl in self.workloads}

    def run(self) -> Path:
        from cuco.evaluate.jobs import Case

        t0 = time.perf_counter()
        specs = self.compile_all()
        compile_s = time.perf_counter() - t0

        def write(rows: list[dict], device: str, summary: dict, partial: bool) -> Path:
            return results.write(self.name, rows, device=device, world_size=self.world_size, emulated=False,
                                 out_dir=self.out_dir,
                                 extra={"compile_s": round(compile_s, 1), "partial": partial,
                                        "summary": summary,
                                        "configs": {wl.label: wl.problem.model_dump()
                                                    for wl in self.workloads}})
        rows, device = run_cases(
            [(wl.label, Case(wl, specs[wl.label], iters=self.iters, warmup=self.warmup),
              lambda merged, wl=wl: self.rows(wl, merged)) for wl in self.workloads],
            world_size=self.world_size, heap_bytes=HEAP_BYTES, timeout_s=self.timeout_s,
            console=self.console,  # a run cut short keeps its finished cases:
            checkpoint=lambda rows, device: write(rows, device, self.summary(rows), True))
        summary = self.summary(rows)
        path = write(rows, device, summary, False)
        self.print(summary)
        self.console.print(f"wrote {path}")
        return path

    @staticmethod
    def rows(wl: PipelineWorkload, merged: dict[str, ProgramResult]) -> list[dict[str, Any]]:
        baseline = wl.strongest_host(merged)
        host = merged[baseline].ms
        t_comp, t_comm = merged["compute_only"].ms, merged["comm_only"].ms
        bound = max(t_comp, t_comm)
        out = []
        for name, m in merged.items():
            row = {"case": wl.label, "variant": name, "ms": round(m.ms, 5),
                   "rank_ms": [round(x, 5) for x in m.rank_ms],
                   "baseline": baseline, "baseline_ms": round(host, 5),
                   "speedup": round(host / m.ms, 4), "bound_ms": round(bound, 5),
                   "overlap_eff": round(bound / m.ms, 4),
                   "compute_ms": round(t_comp, 5), "comm_ms": round(t_comm, 5),
                   **m.verdict(), "backend": name.split(".")[0],
                   "suspect": name not in BASELINES and m.ms < 0.98 * bound}
            row["comm_share"] = round(t_comm / host, 4)  # of the host program
            if wl.hides_transfer:
                row["hidden_fraction"] = round(1 - max(0.0, m.ms - t_comp) / t_comm, 4)
            out.append(row)
        return out

    @staticmethod
    def summary(rows: list[dict]) -> dict[str, Any]:
        best: dict[str, dict] = {}
        extra: dict[str, dict] = {}
        for r in rows:
            if r["variant"] in (*BASELINES, "*"):
                continue
            if not r.get("correct") or r.get("suspect"):
                continue
            if not r["variant"].startswith(("lsa.", "nvshmem.")):
                extra.setdefault(r["case"], {})[r["variant"]] = r["ms"]
                continue
            if r["case"] not in best or r["ms"] < best[r["case"]]["ms"]:
                best[r["case"]] = r
        out = {}
        for case, r in best.items():
            out[case] = {k: r.get(k) for k in ("variant", "ms", "baseline", "baseline_ms", "bound_ms",
                                               "speedup", "overlap_eff", "hidden_fraction",
                                               "comm_share") if k in r}
            out[case]["other_baselines_ms"] = extra.get(case, {})
        return out

    def print(self, summary: dict[str, Any]) -> None:
        t = Table(title=f"{self.name}: best fused variant (ms, max over ranks)")
        for col in ("case", "best variant", "ms", "host", "bound", "speedup", "overlap", "hidden"):
            t.add_column(col)
        for case, s in summary.items():
            hf = s.get("hidden_fraction")
            t.add_row(case, s["variant"], f"{s['ms']:.3f}", f"{s['baseline_ms']:.3f}",
                      f"{s['bound_ms']:.3f}", f"{s['speedup']:.2f}", f"{s['overlap_eff']:.2f}",
                      "" if hf is None else f"{hf:.2f}")
        self.console.print(t)
