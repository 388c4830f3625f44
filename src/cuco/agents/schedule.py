"""Exploration then exploitation: how boldly to move as the budget is spent."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    name: str
    mutation_strength: float  # chance each directive field changes (DesignSpace.mutate)
    novelty_weight: float  # bonus for being far from the island's others
    temperature: float  # LLM sampling temperature
    crossover_rate: float


EXPLORATION = Phase("exploration", mutation_strength=0.6, novelty_weight=0.3, temperature=1.0,
                    crossover_rate=0.3)
EXPLOITATION = Phase("exploitation", mutation_strength=0.12, novelty_weight=0.0, temperature=0.4,
                     crossover_rate=0.1)


@dataclass(frozen=True)
class TwoPhaseSchedule:
    """Exploration until ``switch`` of the budget is spent, then exploitation."""

    switch: float = 0.4

    def phase(self, progress: float) -> Phase:
        return EXPLORATION if progress < self.switch else EXPLOITATION


@dataclass(frozen=True)
class SinglePhase:
    """One phase throughout (the baseline the two-phase schedule is compared with)."""

    only: Phase = EXPLORATION

    def phase(self, progress: float) -> Phase:
        return self.only
