"""The evaluator cascade: static checks, compile, correctness, timing, score."""

from cuco.evaluate.evaluator import (
    STAGES, Candidate, EvalResult, Evaluator, StageTimeouts, for_family,
)
from cuco.evaluate.static import FORBIDDEN, static_violations

__all__ = ["FORBIDDEN", "STAGES", "Candidate", "EvalResult", "Evaluator", "StageTimeouts",
           "for_family", "static_violations"]
