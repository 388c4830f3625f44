"""Proposers turn parents into new candidates. The offline ones need no API key."""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Protocol

from cuco.agents.population import Individual
from cuco.agents.schedule import Phase
from cuco.design import DesignSpace, Directives
from cuco.design.space import FIELDS


@dataclass(frozen=True)
class Proposal:
    directives: Directives
    parents: tuple[int, ...]
    origin: str
    source: str | None = None
    note: str = ""


class Proposer(Protocol):
    """Anything with ``propose``; plug your own into :class:`EvolutionAgent`."""

    name: str

    def propose(self, parents: list[Individual], phase: Phase, rng: random.Random) -> Proposal: ...

    def observe(self, ind: Individual) -> None: ...


class OfflineProposer:
    """Directive mutation and crossover; bolder in exploration, small steps in exploitation."""

    name = "offline"

    def __init__(self, space: DesignSpace):
        self.space = space

    def propose(self, parents: list[Individual], phase: Phase, rng: random.Random) -> Proposal:
        if len(parents) >= 2 and rng.random() < phase.crossover_rate:
            a, b = parents[0], parents[1]
            child = self.space.crossover(a.directives, b.directives, rng)
            child = self.space.mutate(child, rng, strength=phase.mutation_strength) if child in (
                a.directives, b.directives) else child
            return Proposal(child, (a.candidate_id, b.candidate_id), "offline",
                            note="crossover")
        p = parents[0]
        return Proposal(self.space.mutate(p.directives, rng, strength=phase.mutation_strength),
                        (p.candidate_id,), "offline", note=f"mutation s={phase.mutation_strength}")

    def observe(self, ind: Individual) -> None:
        pass


class TPEProposer:
    """A tree-structured Parzen estimator (TPE) over the valid points of the space.

    The last ``window`` verdicts are split into the best ``gamma(n)`` and the rest; each
    field gets a categorical density in both groups (counts plus a uniform prior), and the
    proposal is the candidate with the highest good/bad density ratio among ``candidates``
    unseen valid points drawn by the good density (Bergstra et al. 2011, as Optuna does it).
    Verdicts of a resumed run are observed like new ones.

    Why not Optuna's sampler: about 1 % of the grid is valid, so it asked ~100 invalid
    trials per proposal, each reading the whole growing history (150 evaluations took
    minutes). Here candidates are valid points only (the space's points, enumerated once
    where the grid is small enough, else a sample of them) and the history is bounded, so a
    proposal costs the same at any budget (the space lists its valid points once, and the
    agent's seeding has already done so).
    """

    name = "tpe"

    def __init__(self, space: DesignSpace, seed: int = 0, *, window: int = 256,
                 candidates: int = 24, startup: int = 10, scored_points: int = 2048,
                 enumerate_below: int = 2_000_000):
        self.space = space
        self.seed = seed
        self.window, self.candidates, self.startup = window, candidates, startup
        self.scored_points, self.enumerate_below = scored_points, enumerate_below
        self.history: deque[tuple[tuple, float]] = deque(maxlen=window)
        self.seen: set[tuple] = set()
        self._pool: list[tuple] | None = None

    # ---- the points it chooses among ---------------------------------------------------
    def _key(self, d: Directives) -> tuple:
        return tuple(getattr(d, f) for f in FIELDS)

    def pool(self) -> list[tuple]:
        """The valid points (field values in ``FIELDS`` order), built once."""
        if self._pool is None:
            if self.space.grid_size <= self.enumerate_below:
                self._pool = [self._key(d) for d in self.space.enumerate()]
            else:  # too many to list: a fixed sample of them
                r = random.Random(f"cuco:tpe-pool:{self.seed}")
                self._pool = list(dict.fromkeys(self._key(self.space.sample(r))
                                                for _ in range(self.scored_points)))
        return self._pool

    # ---- the densities -----------------------------------------------------------------
    @staticmethod
    def gamma(n: int) -> int:
        """How many of ``n`` verdicts count as good (Optuna's default: 10 %, at most 25)."""
        return max(1, min(math.ceil(0.1 * n), 25))

    def _densities(self) -> tuple[list[dict], list[dict]]:
        ranked = sorted(self.history, key=lambda h: -h[1])
        n_good = self.gamma(len(ranked))
        out = []
        for group in (ranked[:n_good], ranked[n_good:]):
            per_field = []
            for i, f in enumerate(FIELDS):
                counts = Counter(values[i] for values, _ in group)
                prior = 1.0 / len(self.space.choices[f])
                total = len(group) + 1.0
                per_field.append({c: (counts[c] + prior) / total for c in self.space.choices[f]})
            out.append(per_field)
        return out[0], out[1]

    def propose(self, parents: list[Individual], phase: Phase, rng: random.Random) -> Proposal:
        pool = self.pool()
        if len(pool) > self.scored_points:
            pool = rng.sample(pool, self.scored_points)
        unseen = [v for v in pool if v not in self.seen]
        lineage = tuple(p.candidate_id for p in parents[:1] if p.candidate_id >= 0)
        if not unseen:
            return Proposal(self.space.sample(rng), lineage, "tpe", note="every listed point seen")
        if len(self.history) < self.startup:
            pick, note = rng.choice(unseen), "startup: random"
        else:
            good, bad = self._densities()
            log_l = [sum(math.log(good[i][v]) for i, v in enumerate(values)) for values in unseen]
            top = max(log_l)
            drawn = rng.choices(range(len(unseen)), weights=[math.exp(x - top) for x in log_l],
                                k=self.candidates)
            best = max(set(drawn), key=lambda j: (log_l[j] - sum(
                math.log(bad[i][v]) for i, v in enumerate(unseen[j])), -j))
            pick, note = unseen[best], "tpe: best l/g of candidates"
        self.seen.add(pick)
        return Proposal(Directives.model_construct(**dict(zip(FIELDS, pick))), lineage, "tpe",
                        note=note)

    def observe(self, ind: Individual) -> None:
        key = self._key(ind.directives)
        self.seen.add(key)
        self.history.append((key, ind.score if ind.ok else 0.0))
