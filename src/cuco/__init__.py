"""cuco: search, verify and tune GPU kernels that fuse computation with
device-initiated inter-GPU communication (NCCL device API, NVSHMEM).

Importing cuco needs neither torch nor a GPU. A first look, on any machine (an analytic
model scores the points; on GPUs ``cuco.search(..., dry_run=False)`` measures them, every
call verified)::

    import cuco
    problem = cuco.make_problem("gemm_allreduce", "8192x8192x8192", world_size=2)  # MxKxN
    space = cuco.DesignSpace(problem, backend=["lsa", "nvshmem"])
    print(space.size, "valid points; the most conservative:", space.default().full_name)
    result = cuco.search(problem, budget=20, dry_run=True, db=":memory:")  # or a file, a URL
    print(result.best.directives.full_name if result.best else "none")

The names: problems (``make_problem``, ``GemmProblem``, ...), the design space
(``DesignSpace``, ``Directives``), the workloads (``GemmAllReduce``, ``MoE``, ...), the
evaluator (``Evaluator``, on a ``WorkerGroup``), the searches (``search``, ``fastpath``,
``EvolutionAgent``), the database (``CandidateDB``), export (``load``, ``tune``) and the
errors, each a ``CucoError`` whose message says what to fix. ``dir(cuco)`` lists them all.
"""

from cuco.db import EVIDENCE, Candidate, CandidateDB, Evaluation
from cuco.design import (
    Backend, ChunkSchedule, Core, CPProblem, DesignSpace, Directives, GemmProblem, Issuer, KVProblem,
    MoEProblem, PIPELINE_OPS, PipelineOp, Placement, Problem, Schedule, SyncScope, TP_PATTERNS,
    TPPattern, make_problem,
)
from cuco.errors import (
    CompileError, CucoError, DirectiveError, EnvironmentProblem, LibraryConflict, LibraryNotFound,
    NoGPUError, ShapeError, TooFewGPUsError,
)

__version__ = "0.1.0"


#: Public names that live in heavier modules, imported on first use.
_LAZY = {
    "Workload": "cuco.workloads", "GemmAllReduce": "cuco.workloads",
    "GemmReduceScatter": "cuco.workloads", "AllGatherGemm": "cuco.workloads",
    "KVTransfer": "cuco.workloads", "MoE": "cuco.workloads", "CPAttention": "cuco.workloads",
    "GemmWorkload": "cuco.workloads", "PipelineWorkload": "cuco.workloads",
    "Case": "cuco.evaluate.jobs",
    "Evaluator": "cuco.evaluate", "EvalResult": "cuco.evaluate",
    "Agent": "cuco.agents", "FastPathAgent": "cuco.agents", "EvolutionAgent": "cuco.agents", "Island": "cuco.agents",
    "OfflineProposer": "cuco.agents", "TPEProposer": "cuco.agents", "Budget": "cuco.agents",
    "WorkerGroup": "cuco.runtime", "Compiler": "cuco.kernels",
    "DispatchTable": "cuco.dispatch", "TableMismatch": "cuco.dispatch",
    # the entry points themselves (help() shows their real signatures and docs)
    "search": "cuco.agents.api", "fastpath": "cuco.agents.api", "tune": "cuco.export", "load": "cuco.export",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cuco' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazily imported ones too (``Evaluator``, ``WorkerGroup``, ...)."""
    return sorted(set(__all__) | set(globals()))


__all__ = [
    "Backend", "CPProblem", "Candidate", "CandidateDB", "ChunkSchedule", "CompileError", "Core",
    "CucoError", "DesignSpace", "DirectiveError", "Directives", "EVIDENCE", "EnvironmentProblem",
    "Evaluation", "GemmProblem", "Issuer", "KVProblem", "LibraryConflict", "LibraryNotFound",
    "MoEProblem", "NoGPUError", "PIPELINE_OPS", "PipelineOp", "Placement", "Problem", "Schedule", "ShapeError", "SyncScope",
    "TP_PATTERNS", "TPPattern", "TooFewGPUsError", "__version__", "make_problem",
    *sorted(_LAZY),
]
