"""The GEMM alone on one GPU: cuco's in-kernel mainloops against torch.matmul and cuBLAS
(issue #21) -> bench/results/gemm_mainloop.json.

    python bench/gemm_mainloop.py                 # nine-pair per-rank GEMMs + a spread
    python bench/gemm_mainloop.py --shape 6144x5120x6144 --rounds 25

Shapes are per-rank GEMMs ``MxNxK`` (C[M, N] = A[M, K] B[K, N]). See
:mod:`cuco.benchmarks.gemm_alone` for what is timed and checked.
"""

from __future__ import annotations

import argparse
import sys

from cuco.benchmarks.gemm_alone import GemmAloneBench
from cuco.errors import run_script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help="MxNxK (repeatable); default: nine pairs + spread")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--name", default="gemm_mainloop")
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args()
    kw = {}
    if args.shape:
        try:
            kw["shapes"] = tuple(tuple(int(x) for x in s.lower().split("x")) for s in args.shape)
        except ValueError:
            print(f"--shape takes MxNxK, e.g. 8192x8192x4096 (got {args.shape})", file=sys.stderr)
            return 2
    GemmAloneBench(rounds=args.rounds, name=args.name, out_dir=args.out_dir, **kw).run()
    return 0


if __name__ == "__main__":
    run_script(main)
