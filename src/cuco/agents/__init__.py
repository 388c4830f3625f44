"""Search agents: the fast path, the evolutionary slow path, proposers and schedules."""

from cuco.agents.base import Agent
from cuco.agents.evolution import Budget, EvolutionAgent, SearchInterrupted, SearchResult
from cuco.agents.fastpath import FastPathAgent, FastPathResult
from cuco.agents.population import Individual, Island, power_law, rank_based, tournament
from cuco.agents.proposers import OfflineProposer, Proposal, Proposer, TPEProposer
from cuco.agents.schedule import EXPLOITATION, EXPLORATION, Phase, SinglePhase, TwoPhaseSchedule

__all__ = ["Agent", "Budget", "EXPLOITATION", "EXPLORATION", "EvolutionAgent", "FastPathAgent",
           "FastPathResult", "Individual", "Island", "OfflineProposer", "Phase", "Proposal",
           "Proposer", "SearchInterrupted", "SearchResult", "SinglePhase", "TPEProposer", "TwoPhaseSchedule",
           "power_law", "rank_based", "tournament"]
