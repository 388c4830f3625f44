"""Proposers turn parents into new candidates. The offline ones need no API key."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from cuco.agents.population import Individual
from cuco.agents.schedule import Phase
from cuco.design import DesignSpace, Directives


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
    """Optuna's TPE sampler over the directive grid (model-based; ignores parents).

    Invalid points the sampler asks for are told as failures and asked again.
    """

    name = "tpe"

    def __init__(self, space: DesignSpace, seed: int = 0):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self.study = optuna.create_study(direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=seed))
        self.pending: dict[str, list] = {}
        self._optuna = optuna

    def _encode(self, v) -> str | int:
        return getattr(v, "value", v)

    def propose(self, parents: list[Individual], phase: Phase, rng: random.Random) -> Proposal:
        for _ in range(200):
            trial = self.study.ask()
            values = {f: trial.suggest_categorical(f, [self._encode(c) for c in choices])
                      for f, choices in self.space.choices.items()}
            if self.space.violations(_typed(self.space, values)):
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            d = Directives(**values)
            self.pending.setdefault(d.full_name, []).append(trial)
            return Proposal(d, tuple(p.candidate_id for p in parents[:1]), "tpe")
        return Proposal(self.space.sample(rng), (), "tpe", note="sampler gave only invalid points")

    def observe(self, ind: Individual) -> None:
        trials = self.pending.get(ind.directives.full_name)
        if trials:
            self.study.tell(trials.pop(0), ind.score)


def _typed(space: DesignSpace, values: dict) -> dict:
    out = {}
    for f, v in values.items():
        out[f] = next(c for c in space.choices[f] if getattr(c, "value", c) == v)
    return out
