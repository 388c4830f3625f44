"""The design space: five dimensions of fused compute+communication kernels."""

from cuco.design.dimensions import Backend, ChunkSchedule, Issuer, Placement, SyncScope
from cuco.design.directives import Directives
from cuco.design.problem import Problem, check_count, check_workload, register_workload
from cuco.design.rules import violations
from cuco.design.space import DesignSpace, as_rng

__all__ = [
    "Backend", "ChunkSchedule", "DesignSpace", "Directives", "Issuer", "Placement",
    "Problem", "SyncScope", "as_rng", "check_count", "check_workload", "register_workload",
    "violations",
]
