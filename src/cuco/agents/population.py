"""Individuals and islands: who is in a population, and who gets to be a parent."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuco.design import DesignSpace, Directives


@dataclass
class Individual:
    """An evaluated (or pending) candidate as the search sees it."""

    candidate_id: int
    directives: Directives
    island: int
    generation: int
    parents: tuple[int, ...] = ()
    source: str | None = None
    status: str = "pending"
    score: float = 0.0
    stage: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


#: A selection policy picks one parent from a population (already sorted best first).
Selection = Callable[[list[Individual], random.Random], Individual]


def tournament(k: int = 3) -> Selection:
    def pick(pop: list[Individual], rng: random.Random) -> Individual:
        return max(rng.sample(pop, min(k, len(pop))), key=lambda i: i.score)
    return pick


def rank_based(pop: list[Individual], rng: random.Random) -> Individual:
    """Probability proportional to (n - rank)."""
    n = len(pop)
    return rng.choices(pop, weights=[n - r for r in range(n)])[0]


def power_law(alpha: float = 1.5) -> Selection:
    """Probability proportional to (rank + 1) ** -alpha: mostly the best, sometimes the rest."""
    def pick(pop: list[Individual], rng: random.Random) -> Individual:
        return rng.choices(pop, weights=[(r + 1) ** -alpha for r in range(len(pop))])[0]
    return pick


SELECTIONS: dict[str, Callable[[], Selection]] = {
    "tournament": lambda: tournament(3), "rank": lambda: rank_based, "power_law": lambda: power_law(),
}


@dataclass
class Island:
    """A sub-population that evolves on its own; keeps ``capacity`` members, ``elite`` of
    them by score alone, the rest by score plus a novelty bonus."""

    index: int
    space: DesignSpace
    capacity: int = 8
    elite: int = 2
    members: list[Individual] = field(default_factory=list)
    history: list[float] = field(default_factory=list)  # best score after each generation

    def add(self, ind: Individual, novelty_weight: float = 0.0) -> None:
        self.members.append(ind)
        self._cull(novelty_weight)

    def _novelty(self, ind: Individual) -> float:
        others = [m for m in self.members if m is not ind]
        if not others:
            return 0.0
        return sum(self.space.distance(ind.directives, m.directives) for m in others) / len(others)

    def _cull(self, novelty_weight: float) -> None:
        if len(self.members) <= self.capacity:
            return
        by_score = sorted(self.members, key=lambda m: (-m.score, m.candidate_id))
        keep = by_score[: self.elite]
        rest = by_score[self.elite:]
        rest.sort(key=lambda m: (-(m.score + novelty_weight * self._novelty(m)), m.candidate_id))
        self.members = keep + rest[: self.capacity - len(keep)]

    def ranked(self) -> list[Individual]:
        return sorted(self.members, key=lambda m: (-m.score, m.candidate_id))

    def best(self) -> Individual | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def select(self, n: int, policy: Selection, rng: random.Random) -> list[Individual]:
        pop = self.ranked()
        return [policy(pop, rng) for _ in range(n)] if pop else []

    def stats(self) -> dict[str, Any]:
        scores = [m.score for m in self.members]
        best = self.best()
        return {"island": self.index, "size": len(self.members),
                "best": best.score if best else 0.0,
                "best_id": best.candidate_id if best else None,
                "mean": sum(scores) / len(scores) if scores else 0.0,
                "ok": sum(m.ok for m in self.members)}
