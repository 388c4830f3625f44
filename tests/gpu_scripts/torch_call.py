"""Run under torchrun (2 ranks): call an exported cuco kernel from torch, check it
against torch's own GEMM + all-reduce in fp32, and time it interleaved with torch's
host-driven sequence. Rank 0 writes a JSON verdict.

    torchrun --standalone --nproc-per-node 2 torch_call.py ARTIFACT OUT.json
"""
import json
import os
import sys

import cupy
import torch

from cuco.runtime.emulated import apply_rank_env

apply_rank_env()  # CUCO_EMULATE: every rank on one GPU, each with its own NCCL host id
import torch.distributed as dist

import cuco
from cuco.runtime.timing import median, time_interleaved
from cuco.workloads import get

art_dir, out_path = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()  # one GPU when emulated
torch.cuda.set_device(local)
dist.init_process_group("nccl")
art = cuco.load(art_dir, world_size=world)
p = art.problem
call = art.bind_torch()
(xm, xk), (wk, wn) = call.shapes()
g = torch.Generator(device="cuda").manual_seed(1234 + rank)
x = torch.randn(xm, xk, device="cuda", generator=g).to(torch.bfloat16)
w = (torch.randn(wk, wn, device="cuda", generator=g) / p.k ** 0.5).to(torch.bfloat16)

ref = x.float() @ w.float()
dist.all_reduce(ref)
y = call(x, w)
torch.cuda.synchronize()
rtol, atol_f = get(p.workload)(m=p.m, n=p.n, k=p.k, world_size=world).tolerance()
err = (y.float() - ref).abs()
bad = int((err > rtol * ref.abs() + atol_f * ref.abs().max()).sum()) + int(torch.isnan(y).sum())

buf = torch.empty(xm, wn, device="cuda", dtype=torch.bfloat16)
tick = torch.ones(1, device="cuda")


def torch_sequence():
    torch.matmul(x, w, out=buf)
    dist.all_reduce(buf)


stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
samples = time_interleaved({"cuco": lambda: call(x, w), "torch_host_nccl": torch_sequence}, stream,
                           warmup=5, iters=50, align=lambda: dist.all_reduce(tick))
times = torch.tensor([median(samples["cuco"]), median(samples["torch_host_nccl"])], device="cuda")
dist.all_reduce(times, op=dist.ReduceOp.MAX)
bads = torch.tensor([bad], device="cuda")
dist.all_reduce(bads)
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"bad_elements": int(bads.item()), "elements": y.numel() * world,
                   "max_abs_err": float(err.max()), "cuco_ms": float(times[0]),
                   "torch_host_nccl_ms": float(times[1]), "db_ms": art.manifest["evaluation"]["time_ms"],
                   "artifact": art.manifest["variant"], "shape": p.label}, f, indent=1)
call.close()
dist.destroy_process_group()
