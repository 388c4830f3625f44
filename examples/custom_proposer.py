"""Plug your own proposer into the evolutionary search (runs anywhere: analytic evaluator).

    python examples/custom_proposer.py

Swap AnalyticEvaluator(problem) for cuco.evaluate.Evaluator(problem, group=WorkerGroup(2)) on a
GPU machine to measure instead of predict.
"""

import random

from cuco import CandidateDB, GemmProblem
from cuco.agents import EvolutionAgent, Proposal
from cuco.agents.api import gpu_space
from cuco.evaluate.analytic import AnalyticEvaluator


class RandomRestartHillClimber:
    """One small step from the best parent, or a fresh random point now and then."""

    name = "hill-climber"

    def __init__(self, space, restart: float = 0.2):
        self.space, self.restart = space, restart

    def propose(self, parents, phase, rng: random.Random) -> Proposal:
        if rng.random() < self.restart:
            return Proposal(self.space.sample(rng), (), self.name, note="restart")
        best = parents[0]
        return Proposal(self.space.mutate(best.directives, rng, strength=0.1),
                        (best.candidate_id,), self.name, note="step")

    def observe(self, individual) -> None:  # called with every verdict
        pass


problem = GemmProblem(workload="gemm_reducescatter", m=8192, n=8192, k=8192, world_size=2)
space = gpu_space(problem)
db = CandidateDB("custom_proposer.db")
agent = EvolutionAgent(AnalyticEvaluator(problem), db, space=space, islands=2, budget=40,
                       proposer=RandomRestartHillClimber(space), seed=3)
result = agent.run()
print(f"run {result.run_id}: {result.evaluations} candidates in {db.url}")
print(f"best (predicted) speedup {result.best.score:.3f}: {result.best.directives.full_name}")
print(agent.meta_summary(3))
