"""Timing a torch callable on every rank of a torch process group (torchrun benchmarks)."""

from __future__ import annotations


def slowest_rank_median_ms(fn, iters: int, warmup: int) -> float:
    """Median ms of ``fn`` over ``iters`` calls (CUDA events; the ranks meet at a barrier
    before each call, after ``warmup`` untimed ones), the slowest rank's: a collective ends
    when its last rank does."""
    import torch
    import torch.distributed as dist
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    t = torch.tensor([sorted(ms)[len(ms) // 2]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
