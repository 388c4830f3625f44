"""The tensor-parallel layer as the host runs it, shared by the torchrun scripts: matmul, then
the NCCL collective, in fp32 (the reference) or in the operands' dtype (plain TP, what a user
writes without fused kernels)."""

import torch.distributed as dist


def host_tp(pattern: str, a, b, world: int, fp32: bool):
    if fp32:
        a, b = a.float(), b.float()
    if pattern == "allgather_gemm":
        full = a.new_empty((a.shape[0] * world, a.shape[1]))
        dist.all_gather_into_tensor(full, a)
        return full @ b
    part = a @ b
    if pattern == "gemm_allreduce":
        dist.all_reduce(part)
        return part
    out = part.new_empty((part.shape[0] // world, part.shape[1]))
    dist.reduce_scatter_tensor(out, part)
    return out


def drop_in(ops, group: str, pattern: str, a, b):
    """cuco's op with the signature of the op a user has (``cuco.torch_ops`` as ``ops``)."""
    if pattern == "gemm_allreduce":
        return ops.matmul_all_reduce(a, b, group)
    if pattern == "gemm_reducescatter":
        return ops.fused_matmul_reduce_scatter(a, b, "sum", 0, group)
    return ops.fused_all_gather_matmul(a, [b], 0, group, return_A=False)[1][0]
