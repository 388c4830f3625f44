"""PyTorch's fused tensor-parallel ops as peers of cuco's variants, inside cuco's workers.

GEMM+ReduceScatter: ``torch.ops.symm_mem.fused_matmul_reduce_scatter``; AllGather+GEMM:
``torch.ops.symm_mem.fused_all_gather_matmul`` (async tensor parallelism over symmetric
memory, multicast off). They run on the job's stream in a torch process group of the
same workers, interleaved with cuco's variants in one schedule, and every call is
verified like a variant's: the op returns a fresh tensor, which is copied into the
poisoned output after the call's closing event (so the copy is never timed) and checked
there. PyTorch has no fused matmul + all-reduce.
"""

from __future__ import annotations

from cuco.design.patterns import Collective, TPPattern
from cuco.runtime import torch_bridge
from cuco.workloads.base import Buffers, Peer

PEER = "torch_fused"


def gap(ctx, pattern: TPPattern) -> str | None:
    """Why ``pattern`` has no torch peer in this worker (None: it has one)."""
    if pattern.symm_mem_op is None:
        return f"PyTorch has no fused op for {pattern.name}"
    return torch_bridge.symm_mem_unusable(ctx)


def peer(ctx, pattern: TPPattern, inputs: Buffers, out, dtype: str) -> Peer:
    """The fused op of ``pattern`` on this input set; its result lands in ``out``."""
    import torch
    group = torch_bridge.process_group(ctx)
    stream = torch_bridge.stream(ctx)
    x, w = inputs["x"], inputs["w"]
    a, b = torch_bridge.tensor(x, dtype), torch_bridge.tensor(w, dtype)
    op = getattr(torch.ops.symm_mem, pattern.symm_mem_op)
    got: list = []

    if pattern.collective is Collective.REDUCE_SCATTER:  # Y_r = rows_r(sum_s X_s @ W_s)
        def call() -> None:
            with torch.cuda.stream(stream):
                got[:] = [op(a, b, "sum", 0, group)]
    else:  # allgather_gemm: Y_r = allgather_rows(X_s) @ W_r; the op returns the gathered X too
        def call() -> None:
            with torch.cuda.stream(stream):
                gathered, (y,) = op(a, [b], 0, group)
                got[:] = [y, gathered]

    dst = torch_bridge.tensor(out, dtype, (out.size,))

    def settle() -> None:
        """The op's result into the checked output, after the timed call; then every tensor
        it returned is poisoned before torch's allocator takes it back (a right answer, and
        the gathered operand, must not lie in memory a candidate may find)."""
        with torch.cuda.stream(stream):
            dst.copy_(got[0].reshape(-1))
            for t in got:
                t.fill_(float("nan"))
            got.clear()
    return Peer(call, out, settle)
