"""Do W MPS clients on one GPU run their kernels at the same time? (issue #35)

    python bench/mps_barrier_probe.py --world 2 --world 4 --world 8

Under the running MPS daemon, :func:`cuco.runtime.mps_barrier.barrier_us` for each W: an
all-to-all IPC flag barrier, ``--rounds`` of them inside one launch per rank. Prints per rank
the microseconds per barrier. A probe: no results file.
"""

from __future__ import annotations

import argparse

from cuco.runtime.mps_barrier import barrier_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, action="append", required=True)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--limit-s", type=float, default=5.0)
    args = ap.parse_args()
    for world in args.world:
        got = barrier_us(world, args.rounds, args.limit_s)
        worst = max(us for _, _, us in got)
        print(f"W={world}: " + ", ".join(f"rank {r} {n} rounds {us:.1f} us" for r, n, us in got)
              + f"  -> worst {worst:.1f} us per barrier", flush=True)


if __name__ == "__main__":
    main()
