"""Where a candidate's build time goes, stage by stage, for each kind of candidate
-> bench/results/compile_stages.json (issue #39: a build in seconds needs to know which
stage to cut).

    python bench/compile_stages.py                  # every kind, 2 repeats, cold cache each
    python bench/compile_stages.py --kinds in_kernel,side_stream --repeats 3
    python bench/compile_stages.py --repeats 3 --before /tmp/before/compile_stages.json

``--before`` names this script's file from an earlier commit (run from a checkout of it with
``--out-dir``): its commit and each kind's per-stage medians are kept under ``before``,
so one file shows the split before and after a change.

Each candidate is built through :class:`cuco.kernels.Compiler` exactly as the evaluator
builds it, from an empty cache, with nvcc's own per-phase timer (``--time``, passed as an
extra flag). Stages: ``render`` (the template, in Python), ``preprocess`` (the host
compiler's preprocessing of the device side), ``cicc`` (the device front end, NVVM's
optimizer and PTX), ``ptxas`` (PTX to SASS), ``link`` (the rest of the build's wall time:
NVSHMEM's device link, a launcher's cubin embedded and linked with its host part, process
starts), and for a CUTLASS launcher ``host_part`` (its configuration's host code, built once
per configuration and cached: every candidate of a configuration but the first skips it). ``load`` (the module load on a GPU) is not measured
here. The ``candidate_s`` of a row is what one more candidate of a known configuration
costs: everything but ``host_part``.

Separate compilation (issue #39; the default for the in-kernel kinds, ``--whole-program``
measures the one-unit build instead): the configuration's parts, each once per configuration
and cached, are ``host_part``, ``layout`` (the probe of the mainloop types' sizes, to PTX) and
``frozen`` (the kernel and its CUTLASS mainloop to LTO-IR); a candidate's own stages are
``preprocess`` and ``cicc`` of its unit (to LTO-IR), ``device_link`` (nvJitLink: the whole
kernel optimised and assembled, in a process of its own) and ``link`` (the rest: the cubin
embedded and linked with the host part, process starts).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from cuco import results
from cuco.design import Directives, GemmProblem
from cuco.errors import run_script
from cuco.kernels import Compiler, KernelSource
from cuco.kernels.compiler import source_file_name
from cuco.kernels.launcher_source import frozen_text, is_launcher, launcher_host_part, layout_defines
from cuco.kernels.tp import in_kernel, render_tp

BIG = dict(m=8192, n=8192, k=8192, world_size=2)
#: nvcc's phase names -> this file's stages.
PHASES = {"gcc (preprocessing 1)": "preprocess", "gcc (preprocessing 4)": "preprocess",
          "cicc": "cicc", "ptxas": "ptxas", "fatbinary": "fatbinary"}


def _tp(placement: str, backend: str = "lsa", **kw) -> Callable[[], KernelSource]:
    problem = GemmProblem(workload="gemm_allreduce", **BIG)
    if placement == "side_stream":
        d = Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer="cta",
                       chunk_bytes=4 << 20, comm_ctas=64)
    else:
        d = in_kernel(placement, backend=backend, **kw)
    return lambda: render_tp(problem, d)[0]


def _pipeline(op: str) -> Callable[[], KernelSource]:
    def render() -> KernelSource:
        from cuco.workloads.catalog import pipeline_sources
        return next(s for s in pipeline_sources() if s.name.startswith(op))
    return render


KINDS: dict[str, Callable[[], KernelSource]] = {
    "in_kernel": _tp("epilogue", tile_n=256, stages=3, raster_group=8, comm_warps=3),
    "in_kernel_dedicated": _tp("dedicated_ctas", tile_n=256, stages=3, comm_ctas=8),
    "side_stream": _tp("side_stream"),
    "side_stream_nvshmem": _tp("side_stream", backend="nvshmem"),
    "moe_grouped_gemm": _pipeline("moe_grouped_gemm"),
    "cp_attention": _pipeline("cp_attention.S"),
}


def phase_seconds(csv_path: Path, source_name: str) -> dict[str, float]:
    """Seconds per stage of the nvcc runs over ``source_name`` that ``csv_path`` recorded
    (and over the PTX made from it: a launcher's device pass stops at PTX, then ptxas)."""
    out: dict[str, float] = defaultdict(float)
    if not csv_path.exists():
        return {}
    with csv_path.open() as f:
        for row in csv.reader(f):
            row = [c.strip() for c in row]
            if len(row) < 8 or row[0] == "source file name" or row[7] != "ms":
                continue
            stage = PHASES.get(row[1])
            if stage is not None and Path(row[0]).name in (source_name, Path(source_name).with_suffix(".ptx").name):
                out[stage] += float(row[6]) / 1e3
    return dict(out)


#: Stages built once per configuration (cached), not by each candidate.
PER_CONFIG = ("host_part", "layout", "frozen")


class TimedCompiler(Compiler):
    """A compiler that adds up the seconds of its nvJitLink runs (``device_link``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.device_link = 0.0

    def _run(self, cmd: list[str]) -> str:
        t0 = time.perf_counter()
        try:
            return super()._run(cmd)
        finally:
            if "cuco.kernels.jitlink" in cmd:
                self.device_link += time.perf_counter() - t0


def build_once(name: str, render: Callable[[], KernelSource], tmp: Path, whole_program: bool = False) -> dict[str, float]:
    """One cold build of kind ``name``: seconds per stage."""
    t0 = time.perf_counter()
    src = render()
    stages = {"render": time.perf_counter() - t0}
    timer = tmp / "nvcc_time.csv"
    comp = TimedCompiler(arch="sm_90a", cache_dir=tmp / "cache", extra_flags=("--time", str(timer)),
                         whole_program=whole_program)
    needs = tuple(sorted(src.needs))
    if is_launcher(needs):  # the configuration's parts first, so the stages do not overlap
        t0 = time.perf_counter()
        comp.launcher_host(launcher_host_part(src.source), needs)
        stages["host_part"] = time.perf_counter() - t0
    if comp.separate(src.source, needs):
        t0 = time.perf_counter()
        defines = layout_defines(comp.launcher_layout(src.source, needs))
        stages["layout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        comp.frozen_unit(frozen_text(src.source), needs, defines)
        stages["frozen"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    comp.compile(src.source, needs=needs, name=name)
    wall = time.perf_counter() - t0
    stages.update(phase_seconds(timer, source_file_name(name)))
    if comp.device_link:
        stages["device_link"] = comp.device_link
    device = sum(v for k, v in stages.items() if k not in ("render", *PER_CONFIG))
    stages["link"] = max(0.0, wall - device)
    return stages


def measure(name: str, repeats: int, whole_program: bool = False) -> dict:
    runs = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="cuco-stages-") as tmp:
            runs.append(build_once(name, KINDS[name], Path(tmp), whole_program))
        print(f"{name} repeat {r}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[-1].items()), flush=True)
    stages = {k: round(statistics.median(run.get(k, 0.0) for run in runs), 3) for k in runs[0]}
    candidate = round(sum(v for k, v in stages.items() if k not in PER_CONFIG), 2)
    return {"case": KINDS[name]().name, "variant": name, "stages_s": stages, "candidate_s": candidate,
            "first_of_config_s": round(candidate + sum(stages.get(k, 0.0) for k in PER_CONFIG), 2),
            "build": "whole_program" if whole_program or "layout" not in stages else "separate",
            "runs": [{k: round(v, 3) for k, v in run.items()} for run in runs]}


def earlier(path: Path) -> dict:
    """The commit, repeats and each kind's per-stage medians of an earlier run's file."""
    try:
        doc = json.loads(path.read_text())
        rows = {r["variant"]: {"stages_s": r["stages_s"], "candidate_s": r["candidate_s"],
                               "first_of_config_s": r["first_of_config_s"]} for r in doc["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--before {path}: not a compile_stages file ({exc}); run this script at the "
                         "earlier commit with --out-dir and pass the file it wrote") from None
    return {"commit": doc.get("commit"), "created": doc.get("created"),
            "repeats": doc.get("repeats"), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--name", default="compile_stages")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--whole-program", action="store_true", help="build the in-kernel kinds as one unit "
                    "(Compiler(whole_program=True)), not by separate compilation")
    ap.add_argument("--before", default="", help="this script's file from an earlier commit: "
                    "its per-stage medians are kept under before")
    a = ap.parse_args(argv)
    before = earlier(Path(a.before)) if a.before else None
    unknown = [k for k in a.kinds.split(",") if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    load = [os.getloadavg()[0]]
    rows = [measure(k, a.repeats, a.whole_program) for k in a.kinds.split(",")]
    load.append(os.getloadavg()[0])
    machine = {"cpu": results.cpu_model(), "cores": os.cpu_count(), "gpu": None,
               "load_average_1min_start_end": [round(x, 2) for x in load]}
    path = results.write(a.name, rows, device=f"CPU only: {machine['cpu']} ({machine['cores']} cores)",
                         world_size=2, emulated=False, out_dir=a.out_dir,
                         extra={"machine": machine, "repeats": a.repeats,
                                "note": "seconds of one build's stages on this machine (one nvcc "
                                        "process at a time); 'load' needs a GPU and is not measured",
                                **({"before": before} if before else {})})
    print(f"{'kind':22s} {'candidate s':>11s}  stages")
    for r in rows:
        top = sorted(r["stages_s"].items(), key=lambda kv: -kv[1])[:3]
        then = (before or {}).get("rows", {}).get(r["variant"])
        print(f"{r['variant']:22s} {r['candidate_s']:11.2f}  " + ", ".join(f"{k} {v:.1f}" for k, v in top)
              + (f"  (before: {then['candidate_s']:.2f} at {before['commit']})" if then else ""))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
