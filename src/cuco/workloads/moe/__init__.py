"""The MoE layer (dispatch -> expert SwiGLU FFN -> combine, experts split across ranks).

:mod:`~cuco.workloads.moe.workload`: the workload, its router and the routing tables both
sides agree on, and the fused call; :mod:`~cuco.workloads.moe.grouped_gemm`: the CUTLASS
grouped GEMM the fused call and a host program share; :mod:`~cuco.workloads.moe.host`: the
host-driven programs; :mod:`~cuco.workloads.moe.runner` and :mod:`~cuco.workloads.moe.gin`: the
fused call on one host (LSA, NVSHMEM) and for ranks on different hosts (GIN).
"""

from cuco.workloads.moe.grouped_gemm import GroupedGemm, grouped_gemm_source
from cuco.workloads.moe.gin import MoEGinRunner
from cuco.workloads.moe.runner import MoERunner
from cuco.workloads.moe.workload import MoE, route, routing_tables

__all__ = ["GroupedGemm", "MoE", "MoEGinRunner", "MoERunner", "grouped_gemm_source", "route", "routing_tables"]
