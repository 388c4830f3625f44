"""The MoE layer (dispatch -> expert SwiGLU FFN -> combine, experts split across ranks).

:mod:`~cuco.workloads.moe.workload`: the workload, its router and the routing tables both
sides agree on, and the fused call; :mod:`~cuco.workloads.moe.grouped_gemm`: the CUTLASS
grouped GEMM the fused call and a host program share; :mod:`~cuco.workloads.moe.host`: the
host-driven programs.
"""

from cuco.workloads.moe.grouped_gemm import GroupedGemm, grouped_gemm_source
from cuco.workloads.moe.workload import MoE, MoERunner, route, routing_tables

__all__ = ["GroupedGemm", "MoE", "MoERunner", "grouped_gemm_source", "route", "routing_tables"]
