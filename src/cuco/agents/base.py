"""``Agent``: the base of cuco's search agents, and of a strategy of your own.

An agent holds what every search needs: an evaluator that judges a point (the GPU
cascade, the analytic model, a cluster backend, or yours), the candidate database that
keeps every candidate and verdict, and the design space it searches. :meth:`Agent.judge`
records a candidate *before* judging it and stores the verdict right after, so nothing an
interrupted search did is lost; a subclass decides which points to judge, in :meth:`run`.
:class:`~cuco.agents.FastPathAgent` and :class:`~cuco.agents.EvolutionAgent` are agents;
``examples/coordinate_descent.py`` writes one more.
"""

from __future__ import annotations

import abc
from typing import Any

from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives, Problem
from cuco.evaluate.evaluator import Candidate, EvalResult, store_result


class Agent(abc.ABC):
    """A search strategy over ``space`` judged by ``evaluator``, recorded in ``db``.

    ``evaluator``: anything with ``problem`` and ``evaluate(Candidate) -> EvalResult``.
    ``db``: where candidates and verdicts go (``None``: nowhere, e.g. a quick probe).
    ``space``: the points to search (default: every valid point of the problem).
    """

    def __init__(self, evaluator: Any, db: CandidateDB | None = None,
                 space: DesignSpace | None = None):
        self.evaluator = evaluator
        self.problem: Problem = evaluator.problem
        self.db = db
        self.space = space or DesignSpace(self.problem)

    @abc.abstractmethod
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Search; what it returns is the strategy's own result."""

    def start_run(self, name: str, config: dict[str, Any] | None = None) -> int | None:
        """A new run in the database (its problem stored, so reports and resumes read it)."""
        if self.db is None:
            return None
        return self.db.create_run(name, self.problem.workload, problem=self.problem.model_dump(),
                                  config=config or {})

    def judge(self, directives: Directives, *, source: str | None = None,
              origin: str = "user", note: str | None = None, run_id: int | None = None,
              generation: int = 0, island: int | None = None,
              parents: tuple[int, ...] = ()) -> tuple[Candidate, EvalResult]:
        """Record one candidate, evaluate it, store the verdict (unless the evaluator stores
        its own); the candidate carries its database id."""
        cand = Candidate(directives, source)
        workload = self.problem.workload
        if self.db is not None:
            cand.candidate_id = self.db.add_candidate(
                workload, directives=directives, source=source, origin=origin, run_id=run_id,
                island=island, generation=generation, parents=parents, note=note)
        result = self.evaluator.evaluate(cand)
        if self.db is not None and getattr(self.evaluator, "db", None) is None:
            store_result(self.db, workload, cand, result, run_id)
        return cand, result
