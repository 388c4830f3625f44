"""Run under torchrun (2 ranks): cuco's torch ops (``cuco.torch_ops``) on real GPUs. Rank 0
writes a JSON verdict; every check counts the elements that fail it, over all ranks.

    torchrun --standalone --nproc-per-node 2 torch_ops.py MODE OUT.json ARTIFACT...

MODE ``check``: each drop-in against an fp32 reference (matmul, then NCCL in fp32), against
plain TP (bf16 matmul + NCCL) and, where PyTorch has one, its own fused op.
MODE ``compile``: ``torch._dynamo.explain`` graph breaks on CUDA, and ``torch.compile``'s
outputs (inductor, fullgraph) against eager ones.
MODE ``graph``: one CUDA graph of the three drop-ins replayed 1000 times; before randomly
chosen replays the inputs get fresh values, and those replays' outputs are checked; then
each kernel's own count of its calls (kept on the device).
MODE ``capture_refused``: capturing each drop-in raises cuco's error; its message.
"""
import json
import os
import random
import sys

import torch
import tp_host  # beside this script

from cuco.runtime.emulated import apply_rank_env

EMULATED = apply_rank_env()  # CUCO_EMULATE: every rank on one GPU, each with its own NCCL host id
import torch.distributed as dist
from torch.distributed._symmetric_memory import enable_symm_mem_for_group

import cuco
from cuco import torch_ops as T
from cuco.workloads import get

mode, out_path, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()  # one GPU when emulated
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
G = dist.group.WORLD.group_name
if mode in ("check", "compile") and not EMULATED:
    # torch's own fused ops need it; its symmetric memory refuses ranks sharing one GPU
    enable_symm_mem_for_group(G)
ops = {o.pattern.name: o for o in (cuco.load(p, world_size=world).as_torch_op() for p in paths)}
gen = torch.Generator(device="cuda").manual_seed(1234 + rank)


def fill(*tensors):
    """Fresh values, in place (a graph's inputs keep their addresses)."""
    for t in tensors:
        t.copy_(torch.randn(t.shape, device="cuda", generator=gen) / t.shape[0] ** 0.25)


def operands(pattern):
    o = ops[pattern]
    a = torch.empty(o.a_shape, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(o.b_shape, device="cuda", dtype=torch.bfloat16)
    fill(a, b)
    return a, b


def host_tp(pattern, a, b, fp32: bool):
    """The layer as the host runs it (:func:`tp_host.host_tp`) over this job's world."""
    return tp_host.host_tp(pattern, a, b, world, fp32)


def reference(pattern, a, b):
    return host_tp(pattern, a, b, fp32=True)


def plain_tp(pattern, a, b):
    return host_tp(pattern, a, b, fp32=False)


def bad(pattern, y, ref, slack=1.0):
    """Elements of ``y`` outside the workload's tolerance of ``ref`` (NaN always fails);
    ``slack`` 2 where ``ref`` is itself rounded (two roundings apart)."""
    p = ops[pattern].artifact.problem
    rtol, atol = get(p.workload)(m=p.m, n=p.n, k=p.k, world_size=world).tolerance()
    ref = ref.float()
    limit = slack * (rtol * ref.abs() + atol * ref.abs().max())
    return int(((y.float() - ref).abs() > limit).sum()) + int(torch.isnan(y).sum())


def drop_in(pattern, a, b):
    return tp_host.drop_in(T, G, pattern, a, b)


def torch_fused(pattern, a, b):
    if EMULATED:
        return None  # torch's symmetric memory refuses ranks that share one GPU
    if pattern == "gemm_reducescatter":
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, G)
    if pattern == "allgather_gemm":
        return torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, G)[1][0]
    return None  # PyTorch has no fused matmul + all-reduce


def total(n: int) -> int:
    t = torch.tensor([n], device="cuda")
    dist.all_reduce(t)
    return int(t.item())


verdict = {"mode": mode, "world": world, "torch": torch.__version__}
if mode == "check":
    for pattern in ops:
        a, b = operands(pattern)
        y = drop_in(pattern, a, b)
        row = {"shape": list(y.shape), "vs_fp32": total(bad(pattern, y, reference(pattern, a, b))),
               "vs_plain_tp": total(bad(pattern, y, plain_tp(pattern, a, b), slack=2.0))}
        theirs = torch_fused(pattern, a, b)
        if theirs is not None:
            row["vs_torch_fused"] = total(bad(pattern, y, theirs, slack=2.0))
        if pattern == "allgather_gemm" and not EMULATED:  # the gathered A is data movement: bit for bit
            mine, (_, ) = T.fused_all_gather_matmul(a, [b], 0, G)
            theirs_a, _ = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, G)
            row["gathered_A_differs"] = total(int((mine != theirs_a).sum()))
        verdict[pattern] = row
elif mode == "compile":
    args = (*operands("gemm_allreduce"), *operands("allgather_gemm"))

    def layer(a_row, b_row, a_ag, b_ag):
        y1 = T.matmul_all_reduce(a_row, b_row, G)
        y2 = T.fused_matmul_reduce_scatter(a_row, b_row, "sum", 0, G)
        y3 = T.fused_all_gather_matmul(a_ag, [b_ag], 0, G, return_A=False)[1][0]
        return y1, y2, y3

    explained = torch._dynamo.explain(layer)(*args)
    verdict["graph_breaks"] = explained.graph_break_count
    verdict["break_reasons"] = [str(r.reason) for r in explained.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)(*args)
    eager = layer(*args)
    verdict["compiled_vs_eager"] = total(sum(int((c != e).sum()) for c, e in zip(compiled, eager)))
elif mode == "graph":
    patterns = list(ops)
    inputs = {p: operands(p) for p in patterns}

    def step():
        return [drop_in(p, *inputs[p]) for p in patterns]

    step()  # the first call binds each kernel (collective, not capturable)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    picks = sorted(random.Random(7).sample(range(1000), 25))  # the same on every rank
    failures = []
    for i in range(1000):
        if i in picks:
            for p in patterns:
                fill(*inputs[p])
        graph.replay()
        if i in picks:
            n = total(sum(bad(p, y, reference(p, *inputs[p])) for p, y in zip(patterns, outs)))
            if n:
                failures.append({"replay": i, "bad_elements": n})
    torch.cuda.synchronize()
    verdict.update(replays=1000, checked=picks, failures=failures,
                   calls_counted={p: ops[p].bound(G).calls_made() for p in patterns})
elif mode == "capture_refused":
    refused = {}
    for p in ops:
        a, b = operands(p)
        drop_in(p, a, b)  # binds (eager calls are fine)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                drop_in(p, a, b)
        except cuco.CucoError as exc:
            refused[p] = str(exc)
        torch.cuda.synchronize()
    verdict["refused"] = refused
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(verdict, f, indent=1)
for o in ops.values():
    o.close()
dist.destroy_process_group()
