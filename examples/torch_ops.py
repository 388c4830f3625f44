"""cuco kernels as torch ops: drop-ins for ``torch.ops.symm_mem``'s fused ops that
``torch.compile`` traces whole, and that serve every token count (see ``cuco.torch_ops``).

    torchrun --standalone --nproc-per-node 2 examples/torch_ops.py   # 2 GPUs: runs a layer
    python examples/torch_ops.py                                      # no GPU: traces it

A tensor-parallel MLP: AllGather+GEMM in (column-parallel), GEMM+ReduceScatter out
(row-parallel). Each of its two layers is tuned once into one dispatch table, per bucket of
tokens (``cuco tune ... --table``: cuco's candidates, torch's fused op and the host program,
the fastest correct per bucket), and the table is loaded with ``load_table``: the drop-ins
then run at any token count, and never slower than torch at the tuned buckets.
Without a GPU the table is the analytic model's (a dry run, marked ``model``) and the layer
is traced by ``torch.compile(dynamic=True)`` at three token counts over torch's fake
process group: one graph, no break, and each call's M picks its bucket when it runs.
"""
import os
import tempfile
import warnings
from pathlib import Path

import cuco
from cuco.errors import install_extra, run_script

HIDDEN, FFN = 4096, 14336
#: token counts the layer sees (the table adds them to the default powers of two)
TOKENS = (200, 3000)


def mlp(T, group):
    """The layer: x_shard[tokens/w, hidden] -> y_shard[tokens/w, hidden]."""
    def layer(x_shard, w_up, w_down):
        _, (h,) = T.fused_all_gather_matmul(x_shard, [w_up], 0, group, return_A=False)
        return T.fused_matmul_reduce_scatter(h.relu(), w_down, "sum", 0, group)
    return layer


def tune_table(world: int, table: Path, dry_run: bool) -> None:
    """The layer's two layers into one table (what `cuco tune` does, from Python)."""
    from cuco.dispatch import Layer, buckets
    from cuco.dispatch_tune import GpuMeasure, ModelMeasure, tune_table as tune
    layers = (Layer("allgather_gemm", FFN, HIDDEN, "bf16", world),
              Layer("gemm_reducescatter", HIDDEN, FFN, "bf16", world))
    group = None
    if dry_run:  # side-stream kernels build in seconds (the one-kernel ones in a minute)
        measure, placements = ModelMeasure(), ("side_stream",)
        ms = buckets(TOKENS, default=(64, 1024, 4096))
    else:
        from cuco.runtime import WorkerGroup
        group = WorkerGroup(world).start()
        measure, placements, ms = GpuMeasure(group), ("side_stream", "epilogue", "dedicated_ctas"), buckets(TOKENS)
    try:
        for layer in layers:
            print(f"tuning {layer.key} at {len(ms)} buckets: {layer.tune_command(TOKENS, str(table))}")
            tune(layer, ms, measure=measure, table_path=table, placements=placements)
    finally:
        if group is not None:
            group.close()


def traced_without_gpu(torch) -> int:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from cuco import torch_ops as T
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    group = dist.group.WORLD.group_name
    with tempfile.TemporaryDirectory() as root:
        os.environ.setdefault("CUCO_CACHE_DIR", os.path.join(root, "kcache"))
        table = Path(root) / "mlp.json"
        tune_table(2, table, dry_run=True)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loaded = T.load_table(table, group_name=group)
        for w in seen:
            print(f"load_table says: {w.message}")
        print("\n".join(loaded.summary()))
        trace(torch, T, group)
    dist.destroy_process_group()
    print("on 2 GPUs: torchrun --standalone --nproc-per-node 2 examples/torch_ops.py")
    return 0


def trace(torch, T, group) -> None:
    """The layer on meta tensors at three token counts: what torch.compile sees, and one bad call."""
    bf = dict(device="meta", dtype=torch.bfloat16)
    w_up, w_down = torch.empty(HIDDEN, FFN // 2, **bf), torch.empty(FFN // 2, HIDDEN, **bf)
    explained = torch._dynamo.explain(mlp(T, group))(torch.empty(512, HIDDEN, **bf), w_up, w_down)
    calls = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    print(f"torch.compile traces the layer as {explained.graph_count} graph with "
          f"{explained.graph_break_count} graph breaks: {', '.join(calls)}")
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    layer = torch.compile(mlp(T, group), backend=backend, dynamic=True, fullgraph=True)
    for tokens in (100, 1500, 4096):  # per rank
        y = layer(torch.empty(tokens, HIDDEN, **bf), w_up, w_down)
        print(f"{tokens} tokens per rank -> output per rank {list(y.shape)} {y.dtype}")
    print(f"compiled {len(compiles)} time(s) for 3 token counts (dynamic=True: no recompile per M)")
    try:  # a mistake users make: nn.Linear's weight is [out, in], so W.t() is not row-major
        mlp(T, group)(torch.empty(512, HIDDEN, **bf), torch.empty(FFN // 2, HIDDEN, **bf).t(), w_down)
    except T.TorchOpError as e:
        print(f"and a bad call says what to fix: {e}")


def on_gpus(torch) -> int:
    import torch.distributed as dist

    from cuco import torch_ops as T
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    group = dist.group.WORLD.group_name
    table = Path(os.environ.get("CUCO_TABLE", "tp_mlp_table.json"))
    if rank == 0 and not table.exists():  # tuned once (its own workers), shipped as a file
        tune_table(world, table, dry_run=False)
    dist.barrier()
    T.load_table(table, group_name=group)
    g = torch.Generator(device="cuda").manual_seed(rank)
    tokens = 4096
    x = torch.randn(tokens // world, HIDDEN, device="cuda", generator=g).bfloat16()
    w_up = (torch.randn(HIDDEN, FFN // world, device="cuda", generator=g) / HIDDEN ** 0.5).bfloat16()
    w_down = (torch.randn(FFN // world, HIDDEN, device="cuda", generator=g) / FFN ** 0.5).bfloat16()
    layer = torch.compile(mlp(T, group), fullgraph=True)
    y = layer(x, w_up, w_down)
    full = x.new_empty(tokens, HIDDEN)  # plain TP: the same layer with NCCL from the host
    dist.all_gather_into_tensor(full, x)
    part = (full @ w_up).relu() @ w_down
    ref = part.new_empty(tokens // world, HIDDEN)
    dist.reduce_scatter_tensor(ref, part)
    err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
    if rank == 0:
        print(f"compiled TP MLP with cuco's kernels: relative difference to plain TP {err:.2e}")
    T.unload_tables()
    dist.destroy_process_group()
    return 0


def main() -> int:
    try:
        import torch
    except ImportError:
        print(f"cuco's torch ops need torch ({install_extra('torch')}); this example has "
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
