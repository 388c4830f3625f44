"""The GEMM alone on one GPU: cuco's in-kernel mainloops against the fastest library GEMM
(torch.matmul, cuBLAS gemmEx, cuBLASLt's top heuristic algorithms; issue #37)
-> bench/results/gemm_mainloop.json.

    python bench/gemm_mainloop.py                       # 32 per-rank GEMMs x bf16, fp16 (~6 min on an H100)
    python bench/gemm_mainloop.py --quick               # 6 GEMMs x bf16, fp16 (~2 min)
    python bench/gemm_mainloop.py --shape 6144x5120x6144 --dtype bf16 --rounds 25
    python bench/gemm_mainloop.py --list                # the cases and their timed points, no GPU
    python bench/gemm_mainloop.py --resume              # go on from a run a time limit cut short
    python bench/gemm_mainloop.py --cluster-n --name gemm_mainloop_cluster_n   # + swapped clusters along N
    python bench/gemm_mainloop.py --swapped-only --shape 64x28672x8192 --name gemm_swapped_clusters
                                                        # the swapped mainloops and their clusters alone
    python bench/gemm_mainloop.py --best-of bench/results/gemm_mainloop.json --top 2 --tile-k 32 \
        --dtype bf16 --name gemm_tile_k                 # that file's two best points per case, and
                                                        # their twins in 32-deep k-tiles
    python bench/gemm_mainloop.py --shape 200x4096x4096 --mainloop cooperative:208x128:sk4:ab
                                                        # + a mainloop the sweep does not take
    python bench/gemm_mainloop.py --no-library-twins    # without cuco's builds of the library's
                                                        # own tilings (timed by default)

Shapes are per-rank GEMMs ``MxNxK`` (C[M, N] = A[M, K] B[K, N]). Each row: cuco's fastest
correct point, the fastest correct library program (``baseline``), their ratio (``speedup``),
the default a user who does not search gets (``default_speedup``), and ``why_not`` where cuco
is slower (with cuco's build of the fastest library kernel's own tiling, or why cuco cannot
build it: :mod:`cuco.benchmarks.library_twins`); the minimum ratio over every case is printed last. See
:mod:`cuco.benchmarks.gemm_alone` for what is timed and checked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cuco.benchmarks.gemm_alone import (
    DTYPES, LT_TOP, QUICK, GemmAloneBench, best_points, default_shapes, mainloop_refusal, parse_mainloop,
    spread_table,
)
from cuco.errors import CucoError, run_script
from cuco.runtime import check_gpus

NAME = "gemm_mainloop"


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes MxNxK, e.g. 8192x8192x4096 (got {text!r})") from None
    if min(m, n, k) <= 0 or n % 8 or k % 8:
        raise argparse.ArgumentTypeError(f"--shape {text}: M, N, K > 0, N and K multiples of 8 "
                                         "(16-byte rows)")
    return m, n, k


def mainloop_arg(text: str):
    try:
        ml = parse_mainloop(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--mainloop {exc}") from None
    why = mainloop_refusal(ml)
    if why:
        raise argparse.ArgumentTypeError(f"--mainloop {text}: {why}")
    return ml


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", type=parse_shape,
                    help="MxNxK (repeatable); default: the nine pairs' six GEMMs and the spread (32)")
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default: both")
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} GEMMs: {QUICK}")
    ap.add_argument("--rounds", type=int, default=9, help="timed samples per program (>= 3)")
    ap.add_argument("--lt-top", type=int, default=LT_TOP, help="cuBLASLt heuristic algorithms timed")
    ap.add_argument("--cluster-n", action="store_true",
                    help="also time the swapped mainloops in clusters along N (46 more builds on the default cases)")
    ap.add_argument("--swapped-only", action="store_true",
                    help="time only the swapped mainloops fitted to each GEMM, their clusters along N and the default")
    ap.add_argument("--tile-k", action="append", type=int, choices=(32, 64, 128), default=[],
                    help="also time each point's twin in k-tiles this deep, with the most stages that fit (repeatable)")
    ap.add_argument("--mainloop", action="append", type=mainloop_arg, default=[],
                    help="also time this mainloop where it renders: SCHEDULE:MxN[:sSTAGES][:skSLICES][:ab][:cl2] "
                         "(e.g. cooperative:208x128:sk4:ab; repeatable)")
    ap.add_argument("--no-library-twins", action="store_true",
                    help="do not time cuco's build of each cuBLASLt algorithm's own tiling "
                         "(cuco.benchmarks.library_twins; a lost row then says less of why)")
    ap.add_argument("--best-of", type=Path, help="time only this bench file's --top fastest points per case "
                                                 "(and the default); its cases unless --shape/--quick")
    ap.add_argument("--top", type=int, default=2, help="with --best-of: points per case")
    ap.add_argument("--resume", action="store_true",
                    help="go on from --name's file in --out-dir (same commit and GPU): its cases are kept")
    ap.add_argument("--name", default=NAME)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--list", action="store_true", help="print the cases and their timed points; no GPU")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (the median of fewer is one sample)")
    if args.lt_top < 1:
        ap.error("--lt-top: at least 1")
    if args.quick and args.shape:
        ap.error("--quick and --shape: choose one")
    if args.top < 1:
        ap.error("--top: at least 1")
    return args


def best_of(path: Path, top: int) -> tuple[dict[str, list[str]], list[tuple[int, int, int]]]:
    """``path``'s ``top`` fastest points per case, and its shapes in its order."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError) as exc:
        raise CucoError(f"--best-of {path}: not a bench file with rows ({exc}); give a "
                        "bench/results/gemm_mainloop*.json") from None
    return best_points(rows, top), list(dict.fromkeys(tuple(r["shape"]) for r in rows))


def bench_of(args: argparse.Namespace) -> GemmAloneBench:
    only, theirs = best_of(args.best_of, args.top) if args.best_of else (None, None)
    shapes = tuple(args.shape) if args.shape else QUICK if args.quick else tuple(theirs or default_shapes())
    return GemmAloneBench(shapes=shapes, dtypes=tuple(args.dtype or DTYPES), rounds=args.rounds,
                          lt_top=args.lt_top, cluster_n=args.cluster_n,
                          swapped_only=args.swapped_only, resume=args.resume, name=args.name,
                          out_dir=Path(args.out_dir), tile_ks=tuple(args.tile_k), only=only,
                          mainloops=tuple(args.mainloop), library_twins=not args.no_library_twins)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        rows = spread_table()
        for row in rows:
            print(json.dumps(row))
        print(f"{len(rows)} shapes x {len(args.dtype or DTYPES)} dtypes")
        return 0
    bench = bench_of(args)  # a --best-of file that is no bench file is named first, GPU or not
    check_gpus(1, None, need_p2p=False)  # a clear error, not cupy's, where no GPU is visible
    bench.run()
    return 0


if __name__ == "__main__":
    run_script(main)
