"""Built-in workloads: compute + communication patterns with references and bounds."""

from cuco.workloads.base import REGISTRY, Workload, get, register
from cuco.workloads.tp import AllGatherGemm, GemmAllReduce, GemmReduceScatter

__all__ = ["REGISTRY", "AllGatherGemm", "GemmAllReduce", "GemmReduceScatter", "Workload", "get",
           "register"]
