"""KV-cache transfer from prefill ranks to decode ranks while later layers compute.

:mod:`~cuco.workloads.kv.workload`: the workload and its fused call;
:mod:`~cuco.workloads.kv.prefill`: the prefill's transformer layer chain (and its fp32 twin,
the reference).
"""

from cuco.workloads.kv.prefill import PrefillChain, layer_kernel_source
from cuco.workloads.kv.workload import KVRunner, KVTransfer

__all__ = ["KVRunner", "KVTransfer", "PrefillChain", "layer_kernel_source"]
