"""cuco kernels as torch ops: drop-ins for ``torch.ops.symm_mem``'s fused ops that
``torch.compile`` traces whole (see ``cuco.torch_ops``).

    torchrun --standalone --nproc-per-node 2 examples/torch_ops.py   # 2 GPUs: runs a layer
    python examples/torch_ops.py                                      # no GPU: traces it

A tensor-parallel MLP: AllGather+GEMM in (column-parallel), GEMM+ReduceScatter out
(row-parallel). Every rank tunes (or finds cached) one kernel per shape the layer uses,
registers each with ``.as_torch_op()``, and calls the drop-ins where it called
``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``.
Without a GPU the kernels are tuned by the analytic model (a dry run) and the layer is
traced on meta tensors over torch's fake process group: the graph, its ops, no break.
"""
import os
import sys
import tempfile

import cuco
from cuco.errors import run_script

TOKENS, HIDDEN, FFN = 4096, 4096, 14336


def mlp(T, group):
    """The layer: x_shard[tokens/w, hidden] -> y_shard[tokens/w, hidden]."""
    def layer(x_shard, w_up, w_down):
        _, (h,) = T.fused_all_gather_matmul(x_shard, [w_up], 0, group, return_A=False)
        return T.fused_matmul_reduce_scatter(h.relu(), w_down, "sum", 0, group)
    return layer


def tune_layer(world: int, cache: str, dry_run: bool):
    """The layer's two kernels, registered as torch ops."""
    kw = dict(world_size=world, cache_dir=cache, dry_run=dry_run, budget=12)
    if dry_run:  # side-stream kernels build in seconds (the one-kernel ones in a minute)
        kw["placements"] = ("side_stream",)
    up = cuco.tune("allgather_gemm", f"{TOKENS}x{HIDDEN}x{FFN}", **kw)
    down = cuco.tune("gemm_reducescatter", f"{TOKENS}x{FFN}x{HIDDEN}", **kw)
    return up.as_torch_op(), down.as_torch_op()


def traced_without_gpu(torch) -> int:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cuco import torch_ops as T
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    group = dist.group.WORLD.group_name
    with tempfile.TemporaryDirectory() as cache:
        for op in tune_layer(2, cache, dry_run=True):
            print(f"registered {op}")
        trace(torch, T, group)
    dist.destroy_process_group()
    print("on 2 GPUs: torchrun --standalone --nproc-per-node 2 examples/torch_ops.py")
    return 0


def trace(torch, T, group) -> None:
    """The layer on meta tensors: what torch.compile sees, and one bad call."""
    bf = dict(device="meta", dtype=torch.bfloat16)
    args = (torch.empty(TOKENS // 2, HIDDEN, **bf), torch.empty(HIDDEN, FFN // 2, **bf),
            torch.empty(FFN // 2, HIDDEN, **bf))
    explained = torch._dynamo.explain(mlp(T, group))(*args)
    calls = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    print(f"torch.compile traces the layer as {explained.graph_count} graph with "
          f"{explained.graph_break_count} graph breaks: {', '.join(calls)}")
    y = torch.compile(mlp(T, group), fullgraph=True, backend="aot_eager")(*args)
    print(f"output per rank: {list(y.shape)} {y.dtype}")
    try:  # a mistake users make: nn.Linear's weight is [out, in], so W.t() is not row-major
        mlp(T, group)(args[0], torch.empty(FFN // 2, HIDDEN, **bf).t(), args[2])
    except T.TorchOpError as e:
        print(f"and a bad call says what to fix: {e}")


def on_gpus(torch) -> int:
    import torch.distributed as dist

    from cuco import torch_ops as T
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    group = dist.group.WORLD.group_name
    tune_layer(world, os.environ.get("CUCO_TUNE_CACHE", "cuco_tuned"), dry_run=False)
    g = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(TOKENS // world, HIDDEN, device="cuda", generator=g).bfloat16()
    w_up = (torch.randn(HIDDEN, FFN // world, device="cuda", generator=g) / HIDDEN ** 0.5).bfloat16()
    w_down = (torch.randn(FFN // world, HIDDEN, device="cuda", generator=g) / FFN ** 0.5).bfloat16()
    layer = torch.compile(mlp(T, group), fullgraph=True)
    y = layer(x, w_up, w_down)
    full = x.new_empty(TOKENS, HIDDEN)  # plain TP: the same layer with NCCL from the host
    dist.all_gather_into_tensor(full, x)
    part = (full @ w_up).relu() @ w_down
    ref = part.new_empty(TOKENS // world, HIDDEN)
    dist.reduce_scatter_tensor(ref, part)
    err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
    if rank == 0:
        print(f"compiled TP MLP with cuco's kernels: relative difference to plain TP {err:.2e}")
    for op in T.registered():
        op.close()
    dist.destroy_process_group()
    return 0


def main() -> int:
    try:
        import torch
    except ImportError:
        print("cuco's torch ops need torch (pip install 'cuco[torch]'); this example has "
              "nothing to show without it")
        return 0
    if "RANK" in os.environ:
        if torch.cuda.device_count() < int(os.environ.get("WORLD_SIZE", "2")):
            print("torchrun started more ranks than there are GPUs; one GPU per rank")
            return 1
        return on_gpus(torch)
    return traced_without_gpu(torch)


if __name__ == "__main__":
    run_script(main)
