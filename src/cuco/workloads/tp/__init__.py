"""The tensor-parallel layers (GEMM + AllReduce, GEMM + ReduceScatter, AllGather + GEMM).

:mod:`~cuco.workloads.tp.workload`: the workloads; :mod:`~cuco.workloads.tp.side_stream` and
:mod:`~cuco.workloads.tp.in_kernel`: the launch code of a fused call per placement (shared by
the evaluator's jobs and :mod:`cuco.fused_call`); :mod:`~cuco.workloads.tp.torch_fused`:
PyTorch's fused ops as peers timed beside cuco's variants.
"""

from cuco.workloads.tp.in_kernel import InKernelRunner, runner_class
from cuco.workloads.tp.side_stream import SideStreamRunner
from cuco.workloads.tp.workload import AllGatherGemm, GemmAllReduce, GemmReduceScatter, GemmWorkload

__all__ = ["AllGatherGemm", "GemmAllReduce", "GemmReduceScatter", "GemmWorkload",
           "InKernelRunner", "SideStreamRunner", "runner_class"]
