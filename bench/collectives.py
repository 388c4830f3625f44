"""cuco's LSA and NVSHMEM collectives against host NCCL -> bench/results/collectives.json.

    python bench/collectives.py                  # 2 GPUs, 64KiB .. 256MiB
    python bench/collectives.py --world-size 4 --name collectives_w4

Without enough GPUs it compiles every kernel (a compile-only pass) and says so.
"""

from __future__ import annotations

import argparse

from cuco.benchmarks.collectives import SIZES, CollectivesBench
from cuco.runtime import visible_gpus
from cuco.errors import run_script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--ops", default="allreduce,allgather,reducescatter")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--ctas", default="8,16,32,64,128")
    ap.add_argument("--name", default="collectives")
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args(argv)
    bench = CollectivesBench(world_size=args.world_size, sizes=tuple(args.sizes.split(",")),
                             ops=tuple(args.ops.split(",")), iters=args.iters,
                             ctas=tuple(int(c) for c in args.ctas.split(",")),
                             out_dir=args.out_dir, name=args.name)
    if visible_gpus() < args.world_size:
        report = bench.compile_all("sm_90a")
        for name, status in report.items():
            print(f"compiled {name}: {status}")
        print(f"{visible_gpus()} GPU(s) visible: the benchmark needs {args.world_size} GPUs "
              "with NVLink; only the compile-only pass ran.")
        return 0 if all(v == "ok" for v in report.values()) else 1
    bench.run()
    return 0


if __name__ == "__main__":
    run_script(main)
