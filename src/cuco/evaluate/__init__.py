"""The evaluator cascade: static checks, compile, correctness, timing, score."""

from cuco.evaluate.evaluator import Candidate, EvalResult, Evaluator, StageTimeouts, evaluator_for
from cuco.evaluate.static import FORBIDDEN, static_violations

__all__ = ["FORBIDDEN", "Candidate", "EvalResult", "Evaluator", "StageTimeouts",
           "evaluator_for", "static_violations"]
