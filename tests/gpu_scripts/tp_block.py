"""Run under torchrun (2 ranks): the tensor-parallel block of ``examples/tp_block.py`` checked
against references that share no tensor-parallel code with it. Rank 0 writes a JSON verdict.

    torchrun --standalone --nproc-per-node 2 tp_block.py cpu OUT.json
    torchrun --standalone --nproc-per-node 2 tp_block.py gpu OUT.json ARTIFACT...

MODE ``cpu`` (gloo, fp32, no GPU): the plain-TP block (``rs`` and ``ar``, training and
decode) against the unsharded block on one rank: its loss, output and every weight's
gradient; and each of :mod:`cuco.torch_ops`'s backward duals (plain torch on the CPU) against
autograd of the whole, unsplit GEMM.
MODE ``gpu`` (NCCL, 2 GPUs): the ARTIFACTs registered as torch ops, a small block (hidden 1024)
trained 2 steps with cuco's ops and with the plain block, both bf16, against the plain block
in fp32: bad elements of the output and of every gradient of the first step, and the losses.
"""
import json
import os
import sys
from pathlib import Path

import torch

from cuco.runtime.emulated import apply_rank_env

apply_rank_env()  # CUCO_EMULATE: every rank on one GPU, each with its own NCCL host id
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import tp_block as B  # noqa: E402

from cuco import torch_ops as T  # noqa: E402

mode, out_path, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def gather_max(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def total(n: int) -> int:
    t = torch.tensor([n], device=DEVICE)
    dist.all_reduce(t)
    return int(t.item())


def rel(a, b) -> float:
    return B.rel_err(a, b)


# ---- cpu: the sharded block against the whole one ------------------------------------------

def whole_block(s, seed):
    """The unsharded block (fp32, every weight a leaf): its output, loss and gradients."""
    full = {k: v.requires_grad_() for k, v in B.global_weights(torch, s, seed, DEVICE).items()}
    data = B.global_data(torch, s, seed, DEVICE)
    y = B.forward(torch, s, B.shard(torch, full, s, 0, 1), data, B.Comm())
    loss, _ = B.loss_parts(torch, s, y, data, B.Comm())
    if not s.decode:
        loss.backward()
    return y.detach(), float(loss.detach()), full


def check_block(s, group, seed=3) -> dict:
    y_ref, loss_ref, full = whole_block(s, seed)
    master, data = B.block_inputs(torch, s, rank, DEVICE, seed)
    params = {k: v.clone().requires_grad_() for k, v in master.items()}
    comm = B.PlainTP(torch, group, world)
    y = B.forward(torch, s, params, data, comm)
    mine, loss = B.loss_parts(torch, s, y, data, comm)
    rows = y_ref if s.out == "ar" else y_ref.chunk(world)[rank]
    out = {"loss_rel_err": abs(float(loss) - loss_ref) / loss_ref, "output_rel_err": gather_max(rel(y, rows))}
    if not s.decode:
        mine.backward()
        B.reduce_replicated_grads(s, params, comm)
        want = B.shard(torch, {k: v.grad for k, v in full.items()}, s, rank, world)
        out["grad_rel_err"] = {k: gather_max(rel(params[k].grad, want[k])) for k in B.WEIGHTS}
    return out


def check_duals(group, seed=5) -> dict:
    """Each dual at world 2 against autograd of the whole GEMM, on blocks of it."""
    g = torch.Generator().manual_seed(seed)
    M, K, N = 8 * world, 6 * world, 4 * world
    A, Bm, G = (torch.randn(*s, generator=g) for s in ((M, K), (K, N), (M, N)))
    A.requires_grad_(), Bm.requires_grad_()
    (A @ Bm).mul(G).sum().backward()  # dA = G B^T, dB = A^T G
    dA, dB = A.grad, Bm.grad
    A, Bm = A.detach(), Bm.detach()

    def block(t, dim):
        return t.chunk(world, dim)[rank]

    cases = {  # name: (backward, A_r, B_r, dY_r, expected dA_r, expected dB_r)
        "all_gather_matmul": (T.all_gather_matmul_backward, block(A, 0), block(Bm, 1), block(G, 1),
                              block(dA, 0), block(dB, 1)),
        "matmul_reduce_scatter": (T.matmul_reduce_scatter_backward, block(A, 1), block(Bm, 0),
                                  block(G, 0), block(dA, 1), block(dB, 0)),
        "matmul_all_reduce": (T.matmul_all_reduce_backward, block(A, 1), block(Bm, 0), G,
                              block(dA, 1), block(dB, 0)),
        "column_parallel_matmul": (T.replicated_input_backward, A, block(Bm, 1), block(G, 1),
                                   dA, block(dB, 1)),
    }
    out = {}
    for name, (fn, a, b, dy, want_a, want_b) in cases.items():
        got_a, got_b = fn(a.contiguous(), b.contiguous(), dy.contiguous(), group)
        only_a = fn(a.contiguous(), b.contiguous(), dy.contiguous(), group, need=(True, False))
        out[name] = {"dA": gather_max(rel(got_a, want_a)), "dB": gather_max(rel(got_b, want_b)),
                     "dA_shape_ok": total(int(got_a.shape == want_a.shape)) == world,
                     "need_only_dA": only_a[1] is None and rel(only_a[0], want_a) < 1e-6}
    return out


def cpu_mode(group) -> dict:
    v = {"duals": check_duals(group)}
    for out in ("rs", "ar"):
        for decode in (0, 6):
            s = B.BlockShape(64, 96, 4, 2, 8 if decode else 32, world, out, head_dim=16,
                             decode=decode).check()
            v[s.label] = check_block(s, group)
    return v


# ---- gpu: cuco's block against the plain one --------------------------------------------------

#: the small block of the GPU test: 8 heads of 128 (4 KV heads), FFN 2816, 1024 tokens
SMALL = dict(hidden=1024, ffn=2816, heads=8, kv_heads=4, tokens=1024)
RTOL, ATOL = 0.05, 0.02  # per element: |x - ref| <= RTOL |ref| + ATOL max |ref|


def bad(x, ref) -> int:
    ref = ref.float()
    limit = RTOL * ref.abs() + ATOL * ref.abs().max()
    return int(((x.float() - ref).abs() > limit).sum()) + int(torch.isnan(x).sum())


def first_step(s, master, data, comm, dtype):
    """One training step: (output, gradients, the losses of 2 steps)."""
    t = B.Trainer(torch, s, master, comm, dtype, lr=0.5)
    y = t.forward(data).detach()
    loss0, grads = t.step(data)
    loss1, _ = t.step(data)
    return y, grads, [loss0, loss1]


def gpu_mode(group) -> dict:
    for p in paths:
        import cuco
        cuco.load(p, world_size=world).as_torch_op()
    v = {"registered": len(T.registered())}
    for out in ("rs", "ar"):
        s = B.BlockShape(**SMALL, world=world, out=out).check()
        master, data = B.block_inputs(torch, s, rank, DEVICE)
        comms = {"plain": B.PlainTP(torch, group, world), "cuco": B.CucoTP(torch, group, world)}
        y_ref, g_ref, l_ref = first_step(s, master, data, comms["plain"], torch.float32)
        row = {"fp32_losses": l_ref}
        for name, comm in comms.items():
            y, grads, losses = first_step(s, master, data, comm, torch.bfloat16)
            row[name] = {"output_bad": total(bad(y, y_ref)),
                         "grad_bad": {k: total(bad(grads[k], g_ref[k])) for k in B.WEIGHTS},
                         "losses": losses,
                         "loss_rel_err": max(abs(a - b) / b for a, b in zip(losses, l_ref))}
        v[s.label] = row
    return v


if mode == "cpu":
    DEVICE = torch.device("cpu")
    dist.init_process_group("gloo")
else:
    DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(DEVICE)
    dist.init_process_group("nccl", device_id=DEVICE)
group_name = dist.group.WORLD.group_name
verdict = {"mode": mode, "world": world, "torch": torch.__version__,
           **(cpu_mode(group_name) if mode == "cpu" else gpu_mode(group_name))}
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(verdict, f, indent=1)
for op in T.registered():
    op.close()
dist.destroy_process_group()
