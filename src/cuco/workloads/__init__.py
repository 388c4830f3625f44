"""Built-in workloads: compute + communication patterns with references and bounds.

Tensor-parallel layers (``Workload`` subclasses, searchable through the evaluator) and
the pipeline workloads (``PipelineWorkload`` subclasses: KV-cache transfer, MoE,
context-parallel attention; checked and benchmarked by ``PipelineCase``).
"""

from cuco.workloads.base import REGISTRY, Workload, get, register
from cuco.workloads.cp_attention import CPAttention
from cuco.workloads.kv_transfer import KVTransfer
from cuco.workloads.moe import MoE
from cuco.workloads.pipeline import PipelineCase, PipelineWorkload
from cuco.workloads.tp import AllGatherGemm, GemmAllReduce, GemmReduceScatter

__all__ = ["REGISTRY", "AllGatherGemm", "CPAttention", "GemmAllReduce", "GemmReduceScatter",
           "KVTransfer", "MoE", "PipelineCase", "PipelineWorkload", "Workload", "get", "register"]
