"""Built-in workloads, all through one protocol (:class:`Workload`).

Tensor-parallel layers (:class:`GemmWorkload`: GEMM+AllReduce, GEMM+ReduceScatter,
AllGather+GEMM) and the pipelines (:class:`PipelineWorkload`: KV-cache transfer, MoE,
context-parallel attention). The verification job that checks and times the variants of
any of them, :class:`~cuco.evaluate.jobs.Case`, lives in :mod:`cuco.evaluate` (above this
layer: a workload never imports it).
"""

from cuco.workloads.base import REGISTRY, Runner, Workload, for_problem, get, register
from cuco.workloads.cp_attention import CPAttention
from cuco.workloads.kv_transfer import KVTransfer
from cuco.workloads.moe import MoE
from cuco.workloads.pipeline import PipelineWorkload
from cuco.workloads.tp import AllGatherGemm, GemmAllReduce, GemmReduceScatter, GemmWorkload

__all__ = ["REGISTRY", "AllGatherGemm", "CPAttention", "GemmAllReduce",
           "GemmReduceScatter", "GemmWorkload", "KVTransfer", "MoE", "PipelineWorkload", "Runner",
           "Workload", "for_problem", "get", "register"]
