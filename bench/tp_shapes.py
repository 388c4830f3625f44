"""The tensor-parallel layers over a spread of shapes -> bench/results/tp_shapes.json.

    python bench/tp_shapes.py              # 26 shapes x 3 families, 2 GPUs (quick grids)
    python bench/tp_shapes.py --full       # every point of tp_workloads' grid per case
    python bench/tp_shapes.py --list       # the cases and each one's grid size; no GPU

The same machinery as ``bench/tp_workloads.py`` (every variant checked and timed against the
strongest host program, torch's fused ops as peers), over :data:`SHAPES` instead of nine
pairs. A case's grid holds only the points that can run its shape: a ragged M (not a
multiple of 2 x 128) gets side_stream points, never the in-kernel ones. The summary names
each case's best variant and where it loses (speedup < 1 against the host program or
torch's fused op).
"""

from __future__ import annotations

import argparse

from cuco.benchmarks.tp_workloads import FAMILIES, PLACEMENTS, PROFILED, TPBench, grid
from cuco.benchmarks.variants import compile_variants
from cuco.design import GemmProblem, Placement
from cuco.errors import CucoError, run_script
from cuco.kernels.tp import render_tp

#: (M, K, N) global shapes of real tensor-parallel layers, M from 128 to 16384 tokens (a
#: quarter of them ragged: M not a multiple of 128, as real batches are), K and N from 1536
#: to 28672. Row-parallel layers (AllReduce, ReduceScatter) read K as the split input
#: (attention out-projection K = hidden, MLP down-projection K = FFN); column-parallel
#: (AllGather) reads N as the output (QKV, MLP up/gate). Models: Llama-3-8B / Mistral-7B /
#: Mixtral-8x7B experts (hidden 4096, FFN 14336, QKV 6144), Llama-3-70B (hidden 8192, FFN
#: 28672, QKV 10240), Llama-2-13B (hidden 5120, FFN 13824), Qwen2-7B (hidden 3584, FFN
#: 18944), Qwen2-1.5B (hidden 1536, FFN 8960). M <= 1024 are decode batches.
SHAPES: tuple[tuple[int, int, int], ...] = (
    # decode-like: M <= 1024
    (128, 4096, 4096),      # Llama-3-8B o_proj, batch 128
    (200, 1536, 8960),      # Qwen2-1.5B up-proj, batch 200 (ragged)
    (256, 8192, 8192),      # Llama-3-70B o_proj
    (512, 14336, 4096),     # Llama-3-8B down-proj
    (640, 4096, 14336),     # Mixtral expert up-proj
    (768, 3584, 18944),     # Qwen2-7B up-proj
    (1000, 8192, 28672),    # Llama-3-70B up-proj, batch 1000 (ragged)
    (1024, 8192, 8192),     # issue #21's decode shape
    # prefill
    (1536, 1536, 1536),     # a small model's square layer
    (2048, 4096, 14336),    # Llama-3-8B up-proj
    (2500, 5120, 13824),    # Llama-2-13B up-proj (ragged)
    (3000, 8192, 8192),     # issue #21's ragged M
    (3584, 3584, 3584),     # Qwen2-7B o_proj
    (4000, 28672, 8192),    # Llama-3-70B down-proj (ragged)
    (4096, 14336, 4096),    # Llama-3-8B down-proj
    (4096, 8192, 28672),    # Llama-3-70B up-proj (a nine-pair shape)
    (5000, 4096, 6144),     # Llama-3-8B QKV (ragged)
    (6144, 12288, 5120),    # issue #21's ReduceScatter shape
    (7000, 8192, 10240),    # Llama-3-70B QKV (ragged)
    (8192, 8192, 8192),     # the square nine-pair shape
    (8192, 28672, 8192),    # Llama-3-70B down-proj
    (10000, 14336, 4096),   # Llama-3-8B down-proj (ragged)
    (12000, 4096, 14336),   # Llama-3-8B up-proj (ragged)
    (16384, 4096, 4096),    # Llama-3-8B o_proj, long prefill
    (16384, 8192, 1536),    # a narrow output (N = 1536)
    (16384, 5120, 13824),   # Llama-2-13B up-proj, long prefill
)


class ShapeSpread(TPBench):
    """:class:`TPBench` over :data:`SHAPES`; the in-kernel GEMM alone is profiled only where
    its kernel fits the shape, and each case's summary says where it loses."""

    def compile_all(self, arch: str | None = None) -> dict[str, list]:
        points = [(p.label, d, render_tp(p, d)[0]) for p in self.problems()
                  for d in grid(p, self.placements, self.quick)]
        if any(Placement(p).in_kernel for p in self.placements):
            points += [(p.label, d, src) for p in self.problems() for d in PROFILED
                       if (src := _profile(p, d)) is not None]
        return compile_variants(points, self.console, arch)

    @staticmethod
    def _summary(rows: list[dict]) -> dict:
        out = TPBench._summary(rows)
        for s in out.values():
            s["loses_to"] = [who for who, ratio in (("host_nccl", s["speedup"]),
                                                    ("torch_fused", s.get("cuco_over_torch_fused")))
                             if ratio is not None and ratio < 1]
        return out

    def _print(self, summary: dict) -> None:
        super()._print(summary)
        losses = {case: s["loses_to"] for case, s in summary.items() if s["loses_to"]}
        self.console.print(f"cuco's best loses on {len(losses)} of {len(summary)} cases"
                           + "".join(f"\n  {case}: to {', '.join(who)}" for case, who in losses.items()))


def _profile(p: GemmProblem, d):
    """The in-kernel GEMM alone at ``p``, or None where that kernel does not fit the shape."""
    try:
        return render_tp(p, d, gemm_only=True)[0]
    except CucoError:
        return None


def listing(bench: TPBench) -> list[str]:
    """One line per case: its label, whether each rank's rows end in a short 128-row tile,
    and its grid by placement."""
    lines = []
    for p in bench.problems():
        points = grid(p, bench.placements, bench.quick)
        side = sum(d.placement is Placement.SIDE_STREAM for d in points)
        ragged = " ragged" if (p.m // p.world_size) % 128 else ""  # a short last row tile
        lines.append(f"{p.label:44s}{ragged:7s} grid {len(points):3d} "
                     f"(side_stream {side}, in-kernel {len(points) - side})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--full", action="store_true", help="the full tp_workloads grid per case "
                    "(default: one issuer per placement; 78 cases)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--no-peers", action="store_true", help="skip PyTorch's fused ops")
    ap.add_argument("--resume", action="store_true", help="keep the cases already in the result "
                    "file (a run cut short) and run only the others")
    ap.add_argument("--list", "--dry-run", dest="list", action="store_true",
                    help="print the cases and their grid sizes, then stop (no GPU, no compile)")
    args = ap.parse_args()
    bench = ShapeSpread(world_size=args.world_size, shapes=SHAPES, families=tuple(args.families.split(",")),
                        iters=args.iters, out_dir=args.out_dir, name="tp_shapes", peers=not args.no_peers,
                        placements=tuple(args.placements.split(",")), quick=not args.full,
                        resume=args.resume)
    if args.list:
        lines = listing(bench)
        print("\n".join(lines))
        print(f"{len(lines)} cases")
        return 0
    return bench.run_here()


if __name__ == "__main__":
    run_script(main)
