"""Nsight Compute's counters of the default cuco GEMM point beside the library's (issue #37).

    ncu --profile-from-start off --clock-control none --cache-control none --section ... \\
        python3 bench/gemm_ncu_probe.py [--shape MxNxK ...] [--part as_is --part no_store ...] \\
            [--mainloop cooperative:128x256:cl2 ...]

(``bench/gpu_session.sh gemm_ncu`` runs it so; ``--summarize LOG`` prints a table of such a
run's log, no GPU.) Each program is built and warmed up outside
the profiled range; inside it, each runs once, in the order printed first, so ncu's report
lists the kernels in that order. The clocks are left alone and the caches are not flushed,
as between the bench's back-to-back calls. A probe: its counters say where the time goes,
and nothing here is a speedup.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import gemm_overhead_probe as probe
from cuco.benchmarks import gemm_alone as ga
from cuco.errors import run_script
from cuco.runtime import check_gpus

SHAPES = ((200, 4096, 4096), (1536, 1536, 1536), (2048, 2048, 4096))
LIBRARIES = ("torch.matmul", "cublaslt.heuristic0")
#: The counters --summarize tabulates: (column, the metric's name in ncu's details page).
COLUMNS = (("us", "Duration"), ("cycles", "Elapsed Cycles"), ("sm active", "SM Active Cycles"),
           ("SM %", "Compute (SM) Throughput"), ("mem %", "Memory Throughput"),
           ("L1 %", "L1/TEX Cache Throughput"), ("L2 %", "L2 Cache Throughput"),
           ("DRAM %", "DRAM Throughput"), ("grid", "Grid Size"), ("smem KB", "Dynamic Shared Memory Per Block"))
KERNEL = re.compile(r"^  (\S+) \((\d+), (\d+), (\d+)\)x\((\d+), \d+, \d+\), Context")


def summarize(log: str) -> list[dict[str, str]]:
    """One row per profiled kernel of an ncu details log (in launch order): its name, labelled
    with the probe's own line for it (``profiled kernel i: ...``), and :data:`COLUMNS`."""
    labels = dict(re.findall(r"^profiled kernel (\d+): (.*)$", log, re.M))
    rows: list[dict[str, str]] = []
    for line in log.splitlines():
        if m := KERNEL.match(line):
            rows.append({"kernel": m.group(1)[:40], "what": labels.get(str(len(rows)), "")})
        elif rows:
            for col, metric in COLUMNS:
                if line.startswith(f"    {metric} ") and col not in rows[-1]:
                    rows[-1][col] = line.split()[-1]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", type=lambda s: tuple(int(x) for x in s.split("x")))
    ap.add_argument("--part", action="append", choices=tuple(probe.PARTS))
    ap.add_argument("--mainloop", action="append", default=[], type=probe.mainloop_spec,
                    help="also this mainloop beside the default point (repeatable)")
    ap.add_argument("--summarize", metavar="LOG", help="print the counters of an ncu log of this probe; no GPU")
    args = ap.parse_args(argv)
    if args.summarize:
        for row in summarize(Path(args.summarize).read_text()):
            print("  ".join([f"{row['what'][:60]:<60}", f"{row['kernel']:<40}"]
                            + [f"{col} {row.get(col, '-')}" for col, _ in COLUMNS]))
        return 0
    check_gpus(1, None, need_p2p=False)  # a clear error, not cupy's, where no GPU is visible
    import cupy
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    shapes = args.shape or SHAPES
    built = probe.build(shapes, tuple(args.part or ("as_is",)), sms, tuple(args.mainloop))
    runs = []
    for shape in shapes:
        progs, text, ops = probe.programs(shape, built, sms)
        for v, (fn, c) in progs.items():
            if v in LIBRARIES or v.startswith("cuco."):
                bad = ga.check_output(fn, c, ops["ref"], ops["k"], "bf16")
                for _ in range(5):
                    fn()
                runs.append((shape, v, fn, bad, text.get(v, "")))
    cupy.cuda.Device().synchronize()
    for i, (shape, v, _, bad, t) in enumerate(runs):
        print(f"profiled kernel {i}: {'x'.join(map(str, shape))} {v} (bad {bad}) {t}", flush=True)
    cupy.cuda.runtime.profilerStart()
    for _, _, fn, _, _ in runs:
        fn()
        cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    return 0


if __name__ == "__main__":
    run_script(main)
