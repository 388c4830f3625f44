"""The tensor-parallel transformer block, plain TP vs PyTorch async-TP vs cuco -> bench/results/tp_block.json.

    python bench/tp_block.py                          # 2 GPUs: every size, both models
    python bench/tp_block.py --models llama3-8b --tokens 1024,4096 --out rs --budget 8
    python bench/tp_block.py --list                   # sizes and the GEMMs each tunes; no GPU

The block is ``examples/tp_block.py``'s (Llama-3-8B and -70B, TP = 2, 1k..16k tokens and a
decode step of 128 sequences after 1024 cached tokens). Per size:

1. cuco's kernels: ``cuco.tune`` for each fused GEMM of the block and of its backward, in
   this process, one shape after another. Each artifact lands in ``--cache-dir`` as soon as
   it is found and is loaded, not searched again, on the next run: an interrupted run
   resumes at the first shape not yet exported. A shape no kernel is found for leaves the
   size without a cuco column (the row says why).
2. Under torchrun (one launch per size, so a failure costs one size): every variant trains
   ``--steps`` steps in bf16 and is checked against the plain block in fp32 (the losses at
   every step, the first step's gradients: ``LOSS_RTOL`` / ``GRAD_RTOL`` of the example);
   then each variant's forward and forward+backward are timed (CUDA events, ``--warmup``
   calls, median of ``--iters``, the slowest rank's), beside the block with its
   communication removed (each rank's GEMMs at their shapes, no collective: ``bound_ms``).

Rows (DESIGN.md's schema): one per size and pass; ``ms`` is cuco's, ``baseline_ms`` plain
TP's, ``peers.torch_async_tp_ms`` PyTorch's async-TP (``rs`` only: PyTorch has no fused
matmul + all-reduce). Without 2 GPUs it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import tp_block as B  # noqa: E402

from cuco import results  # noqa: E402
from cuco.benchmarks.torch_timing import slowest_rank_median_ms  # noqa: E402
from cuco.errors import CucoError, run_script  # noqa: E402

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "CUDA_MODULE_LOADING": "EAGER", "PYTHONUNBUFFERED": "1"}


def sizes(models, tokens, out, decode: bool) -> list[dict]:
    todo = [dict(model=m, tokens=t, out=out, decode=0) for m in models for t in tokens]
    if decode:
        todo += [dict(model=m, tokens=B.DECODE_BATCH, out=out, decode=B.DECODE_CONTEXT) for m in models]
    return todo


def shape_of(size: dict, world: int) -> "B.BlockShape":
    return B.block_shape(size["model"], size["tokens"], world, size["out"], decode=size["decode"])


def tune(size: dict, world: int, cache_dir: str, budget: int, group) -> dict:
    """``size`` with the artifacts of its GEMMs (or why there are none). Every shape's search
    runs on ``group``: a group's start-up (worker processes, NCCL, NVSHMEM) takes seconds,
    and the sweep tunes ~100 shapes."""
    import cuco
    from cuco.agents.api import resolve_problem
    from cuco.evaluate import evaluator_for
    s = shape_of(size, world)
    paths = []
    for pattern, shape in s.gemms(backward=not s.decode):
        t0 = time.perf_counter()
        try:
            problem = resolve_problem(pattern, shape, world)
            art = cuco.tune(problem, world_size=world, cache_dir=cache_dir, budget=budget,
                            evaluator=evaluator_for(problem, group=group))
        except CucoError as exc:
            return {**size, "artifacts": None, "why": f"{pattern} {shape}: {exc}"}
        print(f"  {pattern} {shape}: {art.path.name} ({time.perf_counter() - t0:.0f} s)", flush=True)
        paths.append(str(art.path))
    return {**size, "artifacts": paths}


def launch(plan: dict, world: int, timeout: int) -> list[dict]:
    """The worker's rows for one size (an error row if it failed or hung)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan_path, out = Path(tmp) / "plan.json", Path(tmp) / "rows.json"
        plan_path.write_text(json.dumps(plan))
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node", str(world), __file__, "--worker", str(plan_path),
                                 str(out)], env={**os.environ, **NCCL_ENV}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            log = f"no result within {timeout} s (a hang)"
        print(log[-2000:], flush=True)
        if out.exists():
            return json.loads(out.read_text())
        return [{"case": plan["case"], "error": log[-1500:]}]


# ---- the worker: one size, under torchrun ---------------------------------------------------

class ComputeOnly(B.Comm):
    """Each rank's GEMMs at the shapes the tensor-parallel block runs them, no collective:
    the time a perfect overlap of communication would reach."""
    name = "compute_only"

    def __init__(self, world: int):
        self.world = world

    def ag_mm(self, x, w):
        return x.repeat(self.world, 1) @ w

    def mm_rs(self, x, w):
        return (x @ w)[: x.shape[0] // self.world]


def passes(torch, s, params: dict, data: dict, comm) -> dict:
    """The calls timed: the forward (no autograd) and forward+backward."""
    def fwd():
        with torch.no_grad():
            B.forward(torch, s, params, data, comm)

    def fwd_bwd():
        for p in params.values():
            p.grad = None
        B.forward(torch, s, params, data, comm).float().sum().backward()

    return {"forward": fwd} if s.decode else {"forward": fwd, "forward+backward": fwd_bwd}


def worker(plan_path: str, out_path: str) -> int:
    import torch
    import torch.distributed as dist

    import cuco
    from cuco import torch_ops as T
    plan = json.loads(Path(plan_path).read_text())
    rank, world, device, group = B.setup_ranks(torch)
    s = shape_of(plan["size"], world)
    for p in plan["size"].get("artifacts") or []:
        cuco.load(p, world_size=world).as_torch_op()
    names = ["plain"] + (["async"] if s.out == "rs" else []) + (["cuco"] if plan["size"].get("artifacts") else [])
    comms = {n: B.make_comm(torch, n, group, world) for n in names}
    master, data = B.block_inputs(torch, s, rank, device)
    check = B.train_and_check(torch, s, master, data, comms, steps=plan["steps"], lr=plan["lr"],
                              dtype=torch.bfloat16)
    params = {k: v.to(torch.bfloat16).requires_grad_() for k, v in master.items()}
    ms = {}
    for name, comm in [*comms.items(), ("compute_only", ComputeOnly(world))]:
        for what, fn in passes(torch, s, params, data, comm).items():
            ms[(name, what)] = slowest_rank_median_ms(fn, plan["iters"], plan["warmup"])
    rows = []
    for what in passes(torch, s, params, data, comms["plain"]):
        base, cu, asy = ms[("plain", what)], ms.get(("cuco", what)), ms.get(("async", what))
        bound = ms[("compute_only", what)]
        rows.append({
            "case": plan["case"], "pass": what, "variant": "cuco" if cu else None,
            "ms": cu, "baseline": "plain_tp", "baseline_ms": base,
            "speedup": base / cu if cu else None, "bound_ms": bound,
            "overlap_eff": bound / cu if cu else None,
            "correct": check["cuco"]["matched"] if cu else None,
            "peers": {"torch_async_tp_ms": asy},
            "cuco_over_async_tp": asy / cu if (cu and asy) else None,
            "plain_overlap_eff": bound / base,
            "losses_matched": {n: check[n]["matched"] for n in comms},
            "loss_rel_err": {n: check[n]["loss_rel_err"] for n in comms},
            "grad_rel_err": {n: check[n]["grad_rel_err"] for n in comms},
            "fp32_losses": check["reference"]["losses"],
            "why_no_cuco": plan["size"].get("why"),
            "device": torch.cuda.get_device_name(),
        })
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))
    for op in T.registered():
        op.close()
    dist.destroy_process_group()
    return 0


# ---- the driver -------------------------------------------------------------------------------

def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(B.MODELS))
    ap.add_argument("--tokens", default=",".join(map(str, B.TOKENS)))
    ap.add_argument("--out", default="rs", choices=("rs", "ar"), help="row-parallel output")
    ap.add_argument("--no-decode", action="store_true", help="leave out the decode step")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--budget", type=int, default=8, help="evaluations per GEMM shape's search")
    ap.add_argument("--cache-dir", default=os.environ.get("CUCO_TUNE_CACHE", "cuco_tuned"),
                    help="tuned kernels, one per shape (kept: a rerun tunes only what is missing)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--name", default="tp_block")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--list", action="store_true", help="print the sizes and their GEMMs; no GPU")
    ap.add_argument("--worker", nargs=2, metavar=("PLAN", "OUT"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(*args.worker)
    todo = sizes(args.models.split(","), [int(t) for t in args.tokens.split(",")], args.out,
                 not args.no_decode)
    shapes = [shape_of(z, args.world_size) for z in todo]  # refuses a bad size before any GPU
    if args.list:
        for s in shapes:
            print(f"{s.label}: " + ", ".join(f"{p} {sh}" for p, sh in s.gemms(not s.decode)))
        return 0
    from cuco.runtime import visible_gpus
    if visible_gpus() < args.world_size:
        print(f"bench/tp_block.py needs {args.world_size} GPUs ({visible_gpus()} visible); "
              "`--list` shows the sizes and GEMMs without one", file=sys.stderr)
        return 2
    from cuco.runtime import WorkerGroup
    group = WorkerGroup(args.world_size, nvshmem=True).start()
    try:
        return run_sizes(args, todo, shapes, group)
    finally:
        group.close()


def run_sizes(args, todo: list[dict], shapes: list, group) -> int:
    """Tune (on ``group``), then run under torchrun, one size after another; the file is
    rewritten after each."""
    rows = []
    for i, (z, s) in enumerate(zip(todo, shapes)):
        print(f"{s.label}: tuning {len(s.gemms(not s.decode))} GEMM shapes (cached in {args.cache_dir})")
        plan = {"case": f"{z['model']}/{s.label}", "size": tune(z, args.world_size, args.cache_dir, args.budget, group),
                "steps": args.steps, "lr": args.lr, "iters": args.iters, "warmup": args.warmup}
        rows += launch(plan, args.world_size, timeout=580)
        device = next((r["device"] for r in rows if "device" in r), "?")
        path = results.write(args.name, rows, device=f"{args.world_size} x {device}",
                             world_size=args.world_size, emulated=False, out_dir=args.out_dir,
                             extra={"partial": i + 1 < len(todo), "loss_rtol": B.LOSS_RTOL,
                                    "grad_rtol": B.GRAD_RTOL, "budget": args.budget})
    print(f"wrote {path}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    run_script(main)
