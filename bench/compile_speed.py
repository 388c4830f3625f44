"""Cold build seconds of one in-kernel candidate, before and after the two-piece launcher
build (issue #23) -> bench/results/compile_speed.json (top-level ``compile_s_per_candidate``).

    python bench/compile_speed.py                      # 3 in-kernel + 1 side-stream candidate, 2 repeats
    python bench/compile_speed.py --repeats 3 --before-rev 6d00761

before: ``tp_fused.cu.j2`` (and its partials, with the headers) as of ``--before-rev``, built by that
commit's own compiler (host part cached, where it has one; before issue #23, one ``nvcc -shared``
over host and device code). after: today's template
through :class:`cuco.kernels.Compiler` (the candidate's device code alone to a cubin, linked
with its configuration's host part), timed twice: with the host part already cached (every
candidate of a configuration but the first: ``after_s``) and with nothing cached
(``after_first_of_config_s``; the host part builds beside the device code). Every build
starts from an empty cache for the candidate's own source. Since issue #39 today's build is
separate compilation (the configuration's frozen unit, layout and host part cached; the
candidate's unit and the nvJitLink device link per candidate); ``whole_program_s`` is the
same candidate built as one unit (``Compiler(whole_program=True)``, host part cached), and
``sass_identical`` compares that build with before's. The CPU is shared, so the
order of before and after alternates from one repeat to the next (interleaved A/B) and
the load average is recorded. ``sass_identical``: each pair's device code is the same
(:func:`cuco.kernels.compiler.device_code`: SASS, resources and launch attributes).
The evaluator builds one source per in-kernel candidate: since the kernels take their GEMM
shape per launch, the small-shape check runs the binary that is timed (before that, two).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cuco import results
from cuco.benchmarks.kernels_at import KernelTree, kernels_at
from cuco.design import Directives, GemmProblem
from cuco.kernels import Compiler
from cuco.kernels.compiler import device_code, source_file_name
from cuco.kernels.toolchain import find_nvcc
from cuco.kernels.tp import fused_context, in_kernel, render_tp
from cuco.errors import run_script

BIG = dict(m=8192, n=8192, k=8192, world_size=2)
CANDIDATES = {
    "allreduce_epilogue": (GemmProblem(workload="gemm_allreduce", **BIG),
                           in_kernel("epilogue", tile_n=256, stages=3, raster_group=8, comm_warps=3)),
    "allreduce_dedicated_ctas": (GemmProblem(workload="gemm_allreduce", **BIG),
                                 in_kernel("dedicated_ctas", tile_n=256, stages=3, comm_ctas=8)),
    "allgather_epilogue": (GemmProblem(workload="allgather_gemm", **BIG),
                           in_kernel("epilogue", tile_n=128, stages=4)),
}
SIDE_STREAM = (GemmProblem(workload="gemm_allreduce", **BIG),
               Directives(backend="lsa", placement="side_stream", sync_scope="chunk", issuer="cta",
                          chunk_bytes=4 << 20, comm_ctas=64))


def build_before(source: str, needs: tuple[str, ...], tree: KernelTree, tmp: Path) -> tuple[float, bytes]:
    """The earlier commit's build of its own source (its ``compiler.py``, against its
    headers): where it builds launchers in two pieces (issue #23), timed with the host part
    cached, as ``after_s`` is; before that, one nvcc over host and device code."""
    comp = tree.compiler(arch="sm_90a", cache_dir=tmp / "before")
    if not hasattr(comp, "launcher_host"):
        src, so = tmp / source_file_name("kernel"), tmp / "before.so"
        src.write_text(source)
        t0 = time.perf_counter()
        subprocess.run([str(find_nvcc()), *comp.base_flags(needs), "-shared", "-Xcompiler", "-fPIC", str(src),
                        "-o", str(so)], check=True, capture_output=True)
        return time.perf_counter() - t0, so.read_bytes()
    first = comp.compile(source, needs=needs, name="kernel")
    first.path.unlink()
    t0 = time.perf_counter()
    again = comp.compile(source, needs=needs, name="kernel")
    return time.perf_counter() - t0, again.path.read_bytes()


def build_after(source: str, needs: tuple[str, ...], tmp: Path) -> tuple[float, float, bytes, float, bytes]:
    """Today's build (separate compilation, issue #39) from an empty cache (host part, layout
    and frozen unit too), then again with only the candidate's own library removed (the
    configuration's parts cached), then the whole-program build (one unit, nvcc; host part
    cached): (first, warm, library, whole-program warm, its library)."""
    comp = Compiler(arch="sm_90a", cache_dir=tmp / "cache")
    t0 = time.perf_counter()
    first = comp.compile(source, needs=needs, name="kernel")
    cold = time.perf_counter() - t0
    first.path.unlink()
    t0 = time.perf_counter()
    warm = comp.compile(source, needs=needs, name="kernel")
    warm_s = time.perf_counter() - t0
    whole = Compiler(arch="sm_90a", cache_dir=tmp / "cache", whole_program=True)
    t0 = time.perf_counter()
    one = whole.compile(source, needs=needs, name="kernel")
    return cold, warm_s, warm.path.read_bytes(), time.perf_counter() - t0, one.path.read_bytes()


def measure(name: str, tree: KernelTree, repeats: int) -> dict:
    problem, d = CANDIDATES[name]
    new = render_tp(problem, d)[0]
    needs = tuple(sorted(new.needs))
    old_source = tree.environment().get_template("tp_fused.cu.j2").render(**fused_context(problem, d))
    before, after, first, same, whole = [], [], [], [], []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="cuco-speed-") as tmp:
            steps = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for step in steps:
                if step == "before":
                    s, old_lib = build_before(old_source, needs, tree, Path(tmp))
                    before.append(round(s, 2))
                else:
                    cold, warm, new_lib, whole_s, whole_lib = build_after(new.source, needs, Path(tmp))
                    first.append(round(cold, 2))
                    after.append(round(warm, 2))
                    whole.append(round(whole_s, 2))
            same.append(device_code(old_lib) == device_code(whole_lib))
            print(f"{name} repeat {r}: before {before[-1]} s, after {after[-1]} s "
                  f"(first of its configuration {first[-1]} s; whole program {whole[-1]} s), "
                  f"whole-program SASS identical to before: {same[-1]}", flush=True)
    return {"candidate": name, "kernel": new.name, "kind": "launcher (CUTLASS)",
            "before_s": before, "after_s": after, "after_first_of_config_s": first,
            "before_median_s": statistics.median(before), "after_median_s": statistics.median(after),
            "after_first_of_config_median_s": statistics.median(first),
            "speedup": round(statistics.median(before) / statistics.median(after), 2),
            "whole_program_s": whole, "whole_program_median_s": statistics.median(whole),
            "sass_identical": all(same),
            "note": "sass_identical: the whole-program build against before's; the separately "
                    "compiled kernel is linked by nvJitLink (its own optimiser and ptxas), "
                    "checked against a one-unit LTO build by tests/test_separate_compilation.py"}


def measure_side_stream(repeats: int) -> dict:
    """A side-stream candidate: a cubin, whose build path did not change (for its time)."""
    problem, d = SIDE_STREAM
    src = render_tp(problem, d)[0]
    seconds = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="cuco-speed-") as tmp:
            seconds.append(round(Compiler(arch="sm_90a", cache_dir=tmp).compile(
                src.source, needs=src.needs, name="side").seconds, 2))
    return {"candidate": "allreduce_side_stream", "kernel": src.name, "kind": "cubin (build unchanged)",
            "after_s": seconds, "after_median_s": statistics.median(seconds)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--before-rev", default="6d00761", help="commit whose launcher template and build is 'before'")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--name", default="compile_speed")
    ap.add_argument("--out-dir", default="bench/results")
    a = ap.parse_args(argv)
    load = [os.getloadavg()[0]]
    with kernels_at(a.before_rev) as tree:
        rows = [measure(name, tree, a.repeats) for name in a.candidates.split(",")]
    rows.append(measure_side_stream(a.repeats))
    load.append(os.getloadavg()[0])
    launchers = [r for r in rows if "before_s" in r]
    machine = {"cpu": results.cpu_model(), "cores": os.cpu_count(), "gpu": None,
               "load_average_1min_start_end": [round(x, 2) for x in load]}
    extra = {
        "machine": machine,
        "before_rev": a.before_rev,
        "compile_s_per_candidate": statistics.median(r["after_median_s"] for r in launchers),
        "compile_s_per_candidate_before": statistics.median(r["before_median_s"] for r in launchers),
        "compile_s_per_candidate_whole_program": statistics.median(r["whole_program_median_s"] for r in launchers),
        "build": "separate compilation (frozen unit + candidate unit, nvJitLink) vs whole program",
        "compile_s_first_of_config": statistics.median(r["after_first_of_config_median_s"] for r in launchers),
        "sass_identical": all(r["sass_identical"] for r in launchers),
        "note": "seconds of one in-kernel build on this machine, which is one search candidate "
                "(the small-shape check runs the same binary); candidates/min on 2 x H200 is "
                "bench/evaluator.py's",
    }
    path = results.write(a.name, rows, device=f"CPU only: {machine['cpu']} ({machine['cores']} cores)",
                         world_size=2, emulated=False, out_dir=a.out_dir, extra=extra)
    print(f"wrote {path}: {extra['compile_s_per_candidate_before']} s -> {extra['compile_s_per_candidate']} s "
          f"per in-kernel build, SASS identical: {extra['sass_identical']}")
    return 0 if extra["sass_identical"] else 1


if __name__ == "__main__":
    run_script(main)
