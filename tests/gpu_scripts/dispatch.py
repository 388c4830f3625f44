"""Run under torchrun (2 ranks; on one GPU both ranks share it: an emulated world): cuco's
dispatched torch ops (issue 41). Rank 0 writes a JSON verdict; every check counts the
elements that fail it, over all ranks.

    torchrun --standalone --nproc-per-node 2 dispatch.py MODE OUT.json TABLE.json

MODE ``ms``: every pattern at the Ms of :data:`MS` through the drop-ins, each output
against an fp32 reference (matmul, then NCCL in fp32); what each call ran.
MODE ``choices``: the table's buckets that name host, torch_fused and cuco each run that.
MODE ``unknown``: a layer no table serves falls back (one warning) or, strict, is refused.
"""
import json
import os
import sys
import warnings

import torch
import tp_host  # beside this script

from cuco.runtime.emulated import apply_rank_env

EMULATED = apply_rank_env()  # CUCO_EMULATE: every rank on one GPU, each with its own NCCL host id
import torch.distributed as dist
from torch.distributed._symmetric_memory import enable_symm_mem_for_group

from cuco import torch_ops as T
from cuco.workloads import get

mode, out_path, table_path = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
G = dist.group.WORLD.group_name
if not EMULATED:  # torch's fused ops need it; its symmetric memory refuses ranks sharing a GPU
    enable_symm_mem_for_group(G)
table = T.load_table(table_path, group_name=G)
gen = torch.Generator(device="cuda").manual_seed(99 + rank)
#: >= 20 Ms: decode-like (<= 64), ragged (not a multiple of 128), up to 16384; even (they split
#: over 2 ranks; the AllReduce pattern takes any M)
MS = (2, 8, 16, 30, 64, 96, 128, 200, 256, 512, 640, 1000, 1024, 1536, 2048, 3000, 4096,
      5000, 8192, 10000, 12288, 16384)


def operands(layer, m):
    w = world
    a, b, _ = layer.pattern.operand_shapes(m=m, n=layer.n, k=layer.k, world_size=w)
    x = torch.randn(a, device="cuda", generator=gen) / a[1] ** 0.25
    y = torch.randn(b, device="cuda", generator=gen) / b[0] ** 0.25
    return x.bfloat16(), y.bfloat16()


def reference(pattern, a, b):
    return tp_host.host_tp(pattern, a, b, world, fp32=True)


def drop_in(pattern, a, b):
    return tp_host.drop_in(T, G, pattern, a, b)


def bad(pattern: str, n: int, k: int, m: int, y, ref):
    """Elements of ``y`` past twice the workload's tolerance of the fp32 reference (NaN counts)."""
    rtol, atol = get(pattern)(m=m, n=n, k=k, world_size=world).tolerance()
    limit = 2.0 * (rtol * ref.abs() + atol * ref.abs().max())
    return int(((y.float() - ref).abs() > limit).sum()) + int(torch.isnan(y).sum())


def total(n: int) -> int:
    t = torch.tensor([n], device="cuda")
    dist.all_reduce(t)
    return int(t.item())


def ran(before):
    """What the calls since ``before`` ran: {kind: calls}."""
    out = {}
    for (key, bucket, what), n in T.DISPATCHED.items():
        n -= before.get((key, bucket, what), 0)
        if n:
            kind = what.split(":")[0]
            out[kind] = out.get(kind, 0) + n
    return out


verdict = {"mode": mode, "world": world, "torch": torch.__version__}
if mode == "ms":
    for layer in table.layers:
        rows = {}
        for m in MS:
            if layer.takes_m(m):
                continue
            a, b = operands(layer, m)
            before = dict(T.DISPATCHED)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", T.FallbackWarning)  # above the largest bucket
                y = drop_in(layer.pattern.name, a, b)
            rows[m] = {"bad": total(bad(layer.pattern.name, layer.n, layer.k, m, y, reference(layer.pattern.name, a, b))), "ran": ran(before)}
        verdict[layer.pattern.name] = rows
elif mode == "choices":
    for layer, lt in table.layers.items():
        rows = {}
        for e in lt.entries:
            a, b = operands(layer, e.m)
            before = dict(T.DISPATCHED)
            y = drop_in(layer.pattern.name, a, b)
            rows[e.choice] = {"m": e.m, "ran": ran(before),
                              "bad": total(bad(layer.pattern.name, layer.n, layer.k, e.m, y, reference(layer.pattern.name, a, b)))}
        verdict[layer.pattern.name] = rows
elif mode == "unknown":
    a, b = torch.randn(96, 384, device="cuda").bfloat16(), torch.randn(384, 640, device="cuda").bfloat16()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = T.matmul_all_reduce(a, b, G)
        T.matmul_all_reduce(a, b, G)
    verdict["fallback_warnings"] = [str(w.message) for w in seen if issubclass(w.category, T.FallbackWarning)]
    verdict["fallback_bad"] = total(bad("gemm_allreduce", 640, 384 * world, 96, y,
                                        reference("gemm_allreduce", a, b)))
    with T.policy("strict"):
        try:
            T.matmul_all_reduce(a, b, G)
            verdict["strict"] = None
        except T.NoArtifactError as e:
            verdict["strict"] = str(e)
T.unload_tables()
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(verdict, f)
