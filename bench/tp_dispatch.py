"""The dispatched ops against torch's fused op and the host program -> bench/results/tp_dispatch.json.

    cuco tune gemm_reducescatter --n 4096 --k 14336 --table tp.json     # per layer, on 2 GPUs
    python bench/tp_dispatch.py --table tp.json                          # starts torchrun (2 ranks)

For every layer of the table, over :data:`MS` (>= 24 Ms from 2 to 16384, ragged ones and
decode-like ones included), each rank times in one run and on the same operands: the
dispatched op (what the table chose for the M's bucket), torch's fused op (GEMM+RS, AG+GEMM;
PyTorch has no fused matmul + all-reduce) and the host program (matmul, then NCCL). Every
element of each program's output, from its first call and from a call after its timing, is
checked against an fp32 reference (the same gather, GEMM and reduction in fp32) within the
tensor-parallel workload's tolerance; the memory each output lands in held NaNs just before. The summary is the worst ratio of the best of
torch's op and the host program to the dispatched op (>= 0.98: never slower, within noise).
Rows use the shared result schema (DESIGN.md, "Benchmark result files").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

MS = (2, 16, 32, 64, 100, 128, 256, 384, 512, 768, 1000, 1024, 1536, 2048, 2500, 3000, 4096,
      5000, 6144, 8192, 10000, 12288, 14000, 16384)


def bad_elements(y, ref, tol: tuple[float, float]) -> int:
    """Elements of ``y`` outside ``rtol * |ref| + atol_factor * max|ref|`` of the fp32
    reference (NaN, from memory the call did not write, is outside)."""
    rtol, atol_factor = tol
    diff = (y.float() - ref).abs()
    limit = rtol * ref.abs() + atol_factor * ref.abs().max()
    return int((~(diff <= limit)).sum().item())


def checked_call(fn, shape) -> object:
    """``fn()`` after NaN-filling a freed block of its output's size, which PyTorch's caching
    allocator hands to the next allocation of that size: an output element the call leaves
    unwritten then reads NaN, not a right answer an earlier call left there."""
    import torch
    torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)  # freed at once
    return fn()


def timed(fn, iters: int = 20) -> float:
    """Median ms of ``fn`` over ``iters`` calls after 3 warm-up calls, the slowest rank's."""
    from cuco.benchmarks.torch_timing import slowest_rank_median_ms
    return slowest_rank_median_ms(fn, iters, warmup=3)


def on_rank(table_path: str, out_dir: str) -> int:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    from cuco import make_problem, results
    from cuco import torch_ops as T
    from cuco.workloads import for_problem
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    G = dist.group.WORLD.group_name
    enable_symm_mem_for_group(G)
    table = T.load_table(table_path, group_name=G)
    rows = []
    for layer in table.layers:
        tp = layer.pattern
        p = tp.name
        for m in MS:
            if layer.takes_m(m):
                continue
            w = world
            a_shape = tp.operand_shapes(m=m, n=layer.n, k=layer.k, world_size=w).a
            a = (torch.randn(a_shape, device="cuda") / a_shape[1] ** 0.5).bfloat16()
            b = torch.randn(layer.b_shape(), device="cuda").bfloat16()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", T.FallbackWarning)
                op = {"gemm_allreduce": lambda: T.matmul_all_reduce(a, b, G),
                      "gemm_reducescatter": lambda: T.fused_matmul_reduce_scatter(a, b, "sum", 0, G),
                      "allgather_gemm": lambda: T.fused_all_gather_matmul(a, [b], 0, G, return_A=False)[1][0]}[p]
                host = lambda: T.host_program(tp, a, b, G)  # noqa: E731
                fused = (lambda: T.torch_fused_op(tp, a, b, G)) if tp.symm_mem_op else None
                ref = T.host_program(tp, a.float(), b.float(), G)  # the fp32 reference
                tol = for_problem(make_problem(p, layer.shape(m), world_size=w,
                                               dtype=layer.dtype)).tolerance()
                before = dict(T.DISPATCHED)
                programs = {"op": op, "host": host, **({"torch_fused": fused} if fused else {})}
                bad = {name: bad_elements(checked_call(fn, ref.shape), ref, tol)
                       for name, fn in programs.items()}
                chose = [k[2] for k, n in T.DISPATCHED.items() if n != before.get(k, 0)]
                ms = timed(op)
                host_ms = timed(host)
                fused_ms = timed(fused) if fused else None
                for name, fn in programs.items():  # and once more after the timing
                    bad[name] += bad_elements(checked_call(fn, ref.shape), ref, tol)
            correct = {name: n == 0 for name, n in bad.items()}
            best = min((t for name, t in (("host", host_ms), ("torch_fused", fused_ms))
                        if t is not None and correct[name]), default=host_ms)
            rows.append({"case": f"{layer.key}/M{m}", "variant": chose[0] if chose else "?",
                         "ms": ms, "baseline": "host_nccl", "baseline_ms": host_ms,
                         "speedup": host_ms / ms, "ratio_to_best": best / ms,
                         "correct": correct["op"], "bad_elements": bad,
                         "check": "every element of two calls of each program against an fp32 "
                                  f"reference, rtol {tol[0]:.3g}, atol {tol[1]:.3g} max|ref|",
                         "peers": {"torch_fused_ms": fused_ms,
                                   "torch_fused_correct": correct.get("torch_fused"),
                                   "host_correct": correct["host"]}})
    if rank == 0:
        # a wrong op scores nothing: its row is the worst there is
        worst = min(rows, key=lambda r: r["ratio_to_best"] if r["correct"] else 0.0) if rows else None
        # ranks sharing one GPU (CUCO_EMULATE under torchrun) are an emulated world: the device
        # label counts the GPUs they ran on, and no ratio of such a run is a speedup
        gpus = min(world, torch.cuda.device_count())
        path = results.write("tp_dispatch", rows, device=f"{gpus} x {torch.cuda.get_device_name()}",
                             world_size=world, emulated=gpus < world, out_dir=out_dir,
                             extra={"table": table_path, "table_source": table.provenance.source,
                                    "worst_ratio": worst["ratio_to_best"] if worst else None,
                                    "worst_case": worst["case"] if worst else None})
        print(f"wrote {path}; worst ratio of best(host, torch) to the op: "
              f"{worst['ratio_to_best']:.3f} at {worst['case']}" if worst else "no rows")
    T.unload_tables()
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True, help="a table written by `cuco tune ... --table`")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--out-dir", default="bench/results")
    args = ap.parse_args()
    if "RANK" in os.environ:
        return on_rank(args.table, args.out_dir)
    from cuco.runtime import visible_gpus
    if visible_gpus() < args.world_size:
        print(f"tp_dispatch times {args.world_size} ranks on {args.world_size} GPUs; "
              f"{visible_gpus()} visible: nothing to time here")
        return 1
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(args.world_size), __file__, *sys.argv[1:]])


if __name__ == "__main__":
    from cuco.errors import run_script
    run_script(main)
