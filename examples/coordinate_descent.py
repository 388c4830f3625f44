"""A search strategy of your own: subclass cuco.Agent (runs anywhere: analytic evaluator).

    python examples/coordinate_descent.py

Coordinate descent: from the space's most conservative point, try every choice of one
field with the others held, keep the best, go on to the next field; sweep until a whole
sweep changes nothing. ``Agent.judge`` records each candidate before judging it and stores
the verdict, so the run shows in ``cuco db ls`` and ``cuco report`` like any search. Swap
AnalyticEvaluator for cuco.evaluate.Evaluator(problem, group=WorkerGroup(2)) on a GPU
machine to measure instead of predict.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco import Agent, CandidateDB, Directives, GemmProblem
from cuco.agents.api import gpu_space
from cuco.evaluate.analytic import AnalyticEvaluator


@dataclass
class Descent:
    run_id: int | None
    best: Directives
    score: float
    judged: int
    sweeps: int


class CoordinateDescent(Agent):
    """One field at a time, every choice of it, the best kept."""

    def run(self, max_sweeps: int = 4) -> Descent:
        run_id = self.start_run(f"{self.problem.workload}-coordinate-descent",
                                {"strategy": "coordinate descent", "max_sweeps": max_sweeps})
        scores: dict[str, float] = {}

        def score(d: Directives) -> float:
            if d.full_name not in scores:  # never judge a point twice
                _, result = self.judge(d, origin="descent", run_id=run_id, generation=sweep)
                scores[d.full_name] = result.score if result.status == "ok" else 0.0
            return scores[d.full_name]

        sweep = 0
        best = self.space.default()
        best_score = score(best)
        for sweep in range(1, max_sweeps + 1):
            start = best
            for field, choices in self.space.choices.items():
                for value in choices:
                    try:
                        d = best.replace(**{field: value})
                    except Exception:  # noqa: BLE001 - a combination the rules refuse
                        continue
                    if self.space.violations(d):
                        continue
                    if score(d) > best_score:
                        best, best_score = d, score(d)
            if best == start:
                break
        if run_id is not None:
            self.db.update_run(run_id, status="done")
        return Descent(run_id, best, best_score, len(scores), sweep)


problem = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
db = CandidateDB("coordinate_descent.db")
result = CoordinateDescent(AnalyticEvaluator(problem), db, gpu_space(problem)).run()
print(f"run {result.run_id}: {result.judged} points judged in {result.sweeps} sweep(s)")
print(f"best (predicted) speedup {result.score:.3f}: {result.best.full_name}")
print(f"{db.count_candidates(result.run_id)} candidates recorded in {db.url}")
