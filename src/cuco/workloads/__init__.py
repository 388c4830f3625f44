"""Built-in workloads, all through one protocol (:class:`Workload`).

Tensor-parallel layers (:class:`GemmWorkload`: GEMM+AllReduce, GEMM+ReduceScatter,
AllGather+GEMM) and the pipelines (:class:`PipelineWorkload`: KV-cache transfer, MoE,
context-parallel attention), a folder per op: :mod:`~cuco.workloads.tp`,
:mod:`~cuco.workloads.moe`, :mod:`~cuco.workloads.kv`, :mod:`~cuco.workloads.cp`. The protocol
(:mod:`~cuco.workloads.base`), the pipeline kind (:mod:`~cuco.workloads.pipeline`) and the
catalog of every kernel (:mod:`~cuco.workloads.catalog`) sit beside them. The verification job that checks and times the variants of
any of them, :class:`~cuco.evaluate.jobs.Case`, lives in :mod:`cuco.evaluate` (above this
layer: a workload never imports it).
"""

from cuco.workloads.base import REGISTRY, Runner, Workload, for_problem, get, in_order, register
from cuco.workloads.cp import CPAttention
from cuco.workloads.kv import KVTransfer
from cuco.workloads.moe import MoE
from cuco.workloads.pipeline import PipelineWorkload
from cuco.workloads.tp import AllGatherGemm, GemmAllReduce, GemmReduceScatter, GemmWorkload

__all__ = ["REGISTRY", "AllGatherGemm", "CPAttention", "GemmAllReduce",
           "GemmReduceScatter", "GemmWorkload", "KVTransfer", "MoE", "PipelineWorkload", "Runner",
           "Workload", "for_problem", "get", "in_order", "register"]
