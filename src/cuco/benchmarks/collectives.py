"""Collectives benchmark: cuco's LSA / NVSHMEM kernels against host NCCL.

Every call is verified by the evaluator's verification job, timed ones too
(fresh input sets, each call's output poisoned, every element against an fp32
NCCL reference); variants are timed interleaved in one run, max over ranks.
Also measures the worker group itself: RPC launch rate, respawn after a
planted deadlock, and recovery from an illegal address.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cuco import results
from cuco.runtime.records import ProgramResult
from cuco.kernels import Compiler
from cuco.kernels.collectives import all_sources, lsa_collectives, nvshmem_collectives
from cuco.kernels.render import render

SIZES = ("64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB", "256MiB")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*", text)
    if not m:
        raise ValueError(f"size {text!r} is not like 64KiB, 16MiB or 4096")
    return int(m.group(1)) * UNITS[m.group(2) or "B"]


def check_sizes(text: str) -> tuple[str, ...]:
    """``--sizes`` (``64KiB,1MiB,...``) as its sizes, or an :class:`InputError` naming the
    first one that is not a size (checked before anything is compiled)."""
    from cuco.errors import InputError

    sizes = tuple(s.strip() for s in text.split(",") if s.strip())
    for s in sizes:
        try:
            if parse_size(s) < 1:
                raise ValueError(s)
        except ValueError:
            raise InputError(f"size {s!r} is not a size like 64KiB, 16MiB or 4096 (bytes; units B, "
                             "KiB, MiB, GiB)", param="sizes", fix=",".join(SIZES)) from None
    if not sizes:
        raise InputError("no sizes given", param="sizes", fix=",".join(SIZES))
    return sizes


def size_label(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return f"{n}B"


def bus_factor(op: str, w: int) -> float:
    """nccl-tests' bus-bandwidth factors: bytes on the wire per byte of the op's size."""
    return {"allreduce": 2 * (w - 1) / w, "allgather": (w - 1), "reducescatter": (w - 1) / w}[op]


@dataclass
class CollectivesBench:
    world_size: int = 2
    sizes: tuple[str, ...] = SIZES
    ops: tuple[str, ...] = ("allreduce", "allgather", "reducescatter")
    iters: int = 50
    warmup: int = 10
    ctas: tuple[int, ...] = (8, 16, 32, 64, 128)
    out_dir: Path = results.RESULTS_DIR
    name: str = "collectives"
    console: Console = field(default_factory=Console)

    def compile_all(self, arch: str) -> dict[str, Any]:
        """Compile every collective kernel and shim (no GPU needed)."""
        comp = Compiler(arch=arch)
        srcs = all_sources()
        out = comp.compile_many([(s.name, s.source, s.needs) for s in srcs])
        report = {}
        for s, r in zip(srcs, out):
            report[s.name] = "ok" if hasattr(r, "path") else f"error: {r}"
        return report

    def run(self) -> Path:
        from cuco.runtime import WorkerGroup
        from cuco.evaluate.collective_job import CollectiveCase
        from cuco.runtime.records import merge_ranks

        comp = Compiler()
        lsa = comp.compile(lsa_collectives("bf16").source, needs=("nccl",), name="lsa_collectives_bf16")
        nvs = comp.compile(nvshmem_collectives("bf16").source, needs=("nvshmem",),
                           name="nvshmem_collectives_bf16")
        probes = comp.compile(render("probes.cu.j2"), needs=(), name="probes")
        rows: list[dict[str, Any]] = []
        runtime: dict[str, Any] = {}
        max_bytes = max(parse_size(s) for s in self.sizes) * self.world_size
        heap = str(max(1 << 30, 4 * max_bytes))
        group = WorkerGroup(self.world_size, nvshmem=True, arch=comp.arch,
                            env={"NVSHMEM_SYMMETRIC_SIZE": heap})
        t0 = time.perf_counter()
        group.start()
        runtime["start_s"] = round(time.perf_counter() - t0, 3)
        device = results.device_label(group.infos)
        self.console.print(f"[bold]{device}[/], NCCL {group.infos[0].get('nccl_version')}, "
                           f"group started in {runtime['start_s']} s")
        try:
            for op in self.ops:
                for label in self.sizes:
                    nbytes = parse_size(label)
                    case = CollectiveCase(op, nbytes, ctas=self.ctas, iters=self.iters,
                                          warmup=self.warmup, lsa_cubin=str(lsa.path),
                                          nvshmem_cubin=str(nvs.path), seed=len(rows) + 1)
                    res = group.run(case, timeout=300)
                    if not res.ok:
                        self.console.print(f"[red]{op}/{label}: {res.status}[/]\n{res.error_text()}")
                        rows.append({"case": f"{op}/{label}", "variant": "*", "status": res.status,
                                     "error": res.error_text()[-2000:], "correct": False})
                        continue
                    rows.extend(self._rows(op, label, nbytes, merge_ranks(res.results)))
            runtime.update(self._runtime_checks(group, str(probes.path)))
        finally:
            group.close()
        self._mark_best(rows)
        path = results.write(self.name, rows, device=device, world_size=self.world_size, emulated=False,
                             out_dir=self.out_dir, extra={"runtime": runtime,
                                                          "summary": self._summary(rows)})
        self._print(rows, runtime)
        self.console.print(f"wrote {path}")
        return path

    def _rows(self, op: str, label: str, nbytes: int, merged: dict[str, ProgramResult]) -> list[dict]:
        base = merged["host_nccl"]
        out = []
        f = bus_factor(op, self.world_size)
        for name, m in merged.items():
            variant, _, ctas = name.partition("@")
            row = {"case": f"{op}/{label}", "variant": variant, "ctas": int(ctas) if ctas else None,
                   "ms": round(m.ms, 5), "rank_ms": [round(x, 5) for x in m.rank_ms],
                   "baseline": "host_nccl", "baseline_ms": round(base.ms, 5),
                   "speedup": round(base.ms / m.ms, 4), "bound_ms": None, "overlap_eff": None,
                   "busbw_GBs": round(f * nbytes / (m.ms * 1e-3) / 1e9, 2),
                   "correct": m.correct, "bad_elements": m.bad_elements,
                   "rel_l2_error": m.rel_l2_error, "bytes": nbytes}
            out.append(row)
        return out

    @staticmethod
    def _mark_best(rows: list[dict]) -> None:
        """Flag, per case and variant family, the CTA count that was fastest (and correct)."""
        best: dict[tuple[str, str], dict] = {}
        for r in rows:
            if r.get("variant") in (None, "*", "host_nccl") or not r.get("correct"):
                continue
            key = (r["case"], r["variant"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
        for r in rows:
            r["best_ctas"] = r is best.get((r["case"], r.get("variant")))

    def _summary(self, rows: list[dict]) -> dict[str, Any]:
        """Best correct variant per case, and its speedup over host NCCL."""
        out: dict[str, Any] = {}
        for r in rows:
            if not r.get("best_ctas"):
                continue
            cur = out.get(r["case"])
            if cur is None or r["ms"] < cur["ms"]:
                out[r["case"]] = {"variant": f"{r['variant']}@{r['ctas']}", "ms": r["ms"],
                                  "baseline_ms": r["baseline_ms"], "speedup": r["speedup"]}
        return out

    def _runtime_checks(self, group, probes: str) -> dict[str, Any]:
        from cuco.runtime.probes import LaunchProbe
        out: dict[str, Any] = {}
        group.run(LaunchProbe(probes), timeout=60).unwrap()
        n = 300
        t0 = time.perf_counter()
        for _ in range(n):
            group.run(LaunchProbe(probes), timeout=30).unwrap()
        out["rpc_launches_per_s"] = round(n / (time.perf_counter() - t0), 1)
        hang = group.run(LaunchProbe(probes, "spin_forever"), timeout=5)
        out["hang_status"], out["hang_respawn_s"] = hang.status, round(hang.respawn_s or -1, 3)
        out["after_hang_ok"] = group.run(LaunchProbe(probes), timeout=60).ok
        crash = group.run(LaunchProbe(probes, "illegal_address"), timeout=30)
        out["crash_status"], out["crash_respawn_s"] = crash.status, round(crash.respawn_s or -1, 3)
        out["after_crash_ok"] = group.run(LaunchProbe(probes), timeout=60).ok
        return out

    def _print(self, rows: list[dict], runtime: dict) -> None:
        t = Table(title="collectives: best CTA count per variant (ms, max over ranks)")
        for col in ("case", "variant", "ctas", "ms", "host_nccl", "speedup", "busbw GB/s", "ok"):
            t.add_column(col)
        for r in rows:
            if r.get("best_ctas") or r.get("variant") == "*":
                t.add_row(r["case"], str(r["variant"]), str(r.get("ctas")), f"{r.get('ms', 0):.4f}",
                          f"{r.get('baseline_ms', 0):.4f}", f"{r.get('speedup', 0):.2f}",
                          f"{r.get('busbw_GBs', 0):.0f}", "yes" if r.get("correct") else "NO")
        self.console.print(t)
        self.console.print(f"runtime: {runtime}")
