"""cuco: search, verify and tune GPU kernels that fuse computation with
device-initiated inter-GPU communication (NCCL device API, NVSHMEM).

Importing cuco needs neither torch nor a GPU.
"""

from cuco.db import Candidate, CandidateDB, Evaluation
from cuco.design import (
    Backend, ChunkSchedule, DesignSpace, Directives, Issuer, Placement, Problem, SyncScope,
)
from cuco.errors import (
    CompileError, CucoError, DirectiveError, EnvironmentProblem, LibraryNotFound, NoGPUError,
    ShapeError, TooFewGPUsError,
)

__version__ = "0.1.0"


def load(*args, **kwargs):
    """Load and check an exported artifact; see :func:`cuco.export.load`."""
    from cuco.export import load as _load
    return _load(*args, **kwargs)


def tune(*args, **kwargs):
    """Cached-or-searched artifact for a workload and shape; see :func:`cuco.export.tune`."""
    from cuco.export import tune as _tune
    return _tune(*args, **kwargs)


def search(*args, **kwargs):
    """Search fused kernels for a workload; see :func:`cuco.agents.api.search`."""
    from cuco.agents.api import search as _search
    return _search(*args, **kwargs)

__all__ = [
    "Backend", "Candidate", "CandidateDB", "ChunkSchedule", "CompileError", "CucoError",
    "DesignSpace", "DirectiveError", "Directives", "EnvironmentProblem", "Evaluation", "Issuer",
    "LibraryNotFound", "NoGPUError", "Placement", "Problem", "ShapeError", "SyncScope",
    "TooFewGPUsError", "__version__", "load", "search", "tune",
]
