"""The design space: five dimensions of fused compute+communication kernels."""

from cuco.design.dimensions import (
    Backend, ChunkSchedule, Core, Issuer, PeerCalls, Placement, Schedule, SyncScope,
)
from cuco.design.directives import Directives
from cuco.design.patterns import TP_PATTERNS, Collective, LocalGemm, TPPattern, tp_pattern
from cuco.design.pipeline_ops import PIPELINE_OPS, PipelineOp, pipeline_op
from cuco.design.problem import (
    CPProblem, GemmProblem, KVProblem, MoEProblem, Problem, check_count, check_workload,
    make_problem, parse_shape, problem_class, problem_from_dict, register_workload,
)
from cuco.design.rules import violations
from cuco.design.space import DesignSpace, as_rng

__all__ = [
    "Backend", "CPProblem", "ChunkSchedule", "Collective", "Core", "DesignSpace", "Directives",
    "GemmProblem", "Issuer", "KVProblem", "LocalGemm", "MoEProblem", "PIPELINE_OPS", "PeerCalls", "PipelineOp", "Placement", "Problem",
    "Schedule", "SyncScope", "TPPattern", "TP_PATTERNS", "as_rng",
    "check_count", "check_workload", "make_problem", "parse_shape", "problem_class",
    "pipeline_op", "problem_from_dict", "register_workload", "tp_pattern", "violations",
]
