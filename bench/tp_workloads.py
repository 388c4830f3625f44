"""Fused tensor-parallel layers vs the host-driven program -> bench/results/tp_workloads.json.

    python bench/tp_workloads.py                      # the nine pairs of DEVICE.md, 2 GPUs
    python bench/tp_workloads.py --shapes 2048x4096x4096 --families gemm_allreduce

Shapes are MxKxN (global). Without enough GPUs it compiles every variant and says so.
"""

from __future__ import annotations

import argparse

from cuco.benchmarks.tp_workloads import FAMILIES, PLACEMENTS, SHAPES, TPBench
from cuco.errors import run_script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--name", default="tp_workloads")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--placements", default=",".join(PLACEMENTS),
                    help="which placements' grids to sweep (side_stream,epilogue,dedicated_ctas)")
    ap.add_argument("--quick", action="store_true", help="one issuer per placement (short GPU sessions)")
    ap.add_argument("--no-peers", action="store_true", help="skip PyTorch's fused ops")
    ap.add_argument("--resume", action="store_true", help="keep the cases already in the result "
                    "file (a run cut short) and run only the others")
    args = ap.parse_args(argv)
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    bench = TPBench(world_size=args.world_size, shapes=shapes, families=tuple(args.families.split(",")),
                    iters=args.iters, out_dir=args.out_dir, name=args.name,
                    peers=not args.no_peers, placements=tuple(args.placements.split(",")), quick=args.quick,
                    resume=args.resume)
    return bench.run_here()


if __name__ == "__main__":
    run_script(main)
