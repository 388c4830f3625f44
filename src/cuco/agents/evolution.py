"""EvolutionAgent: islands, migration, a two-phase schedule, resumable from the DB.

Generation 0 seeds every island with the fast-path baseline (the most
conservative directives) and random points. Each later generation, every
island selects parents, asks the proposer for children, evaluates them and
keeps the best (plus, while exploring, the most novel). Every
``migrate_every`` generations each island's best joins its neighbour. Every
candidate is written to the :class:`CandidateDB` *before* it is evaluated and
its verdict right after, so a search killed at any point resumes with nothing
lost: candidates without a verdict are evaluated first, then the search goes on
from its last generation with the same random streams.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuco.agents.base import Agent
from cuco.agents.population import SELECTIONS, Individual, Island, Selection
from cuco.agents.proposers import OfflineProposer, Proposal, Proposer
from cuco.agents.schedule import TwoPhaseSchedule
from cuco.agents.topology import TOPOLOGIES
from cuco.db.candidate_db import best_first
from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives
from cuco.llm.base import LLMUnreachable
from cuco.errors import InputError
from cuco.evaluate.evaluator import Candidate, EvalResult, store_result


@dataclass
class Budget:
    evaluations: int = 100
    seconds: float | None = None
    dollars: float | None = None


@dataclass
class SearchResult:
    run_id: int
    best: Individual | None
    evaluations: int
    history: list[dict[str, Any]] = field(default_factory=list)  # per generation
    phase_switch_generation: int | None = None
    stopped: str = "budget"


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped run ``run_id``; everything it recorded is kept and
    ``resume=run_id`` goes on (still a ``KeyboardInterrupt``)."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        super().__init__(f"run {run_id} interrupted")


def _rng(seed: int, generation: int, island: int) -> random.Random:
    return random.Random(f"cuco:{seed}:{generation}:{island}")


class EvolutionAgent(Agent):
    """The CUCo slow path, offline by default (no API key needed).

    ``evaluator`` is anything with ``problem`` and ``evaluate(Candidate) -> EvalResult``
    (an :class:`cuco.evaluate.Evaluator` or your own); ``proposer``, ``selection``
    and ``topology`` are pluggable.
    """

    def __init__(self, evaluator, db: CandidateDB, *, space: DesignSpace | None = None,
                 islands: int = 4, population: int = 6, children: int = 2,
                 migrate_every: int = 3, topology: str | Callable = "ring",
                 schedule=None, proposer: Proposer | None = None,
                 selection: str | Selection = "tournament", seed: int = 0,
                 budget: Budget | int = 100, name: str | None = None,
                 on_progress: Callable[[dict[str, Any]], None] | None = None):
        super().__init__(evaluator, db, space)
        self.n_islands, self.population, self.children = islands, population, children
        self.migrate_every = migrate_every
        self.topology = TOPOLOGIES[topology] if isinstance(topology, str) else topology
        self.topology_name = topology if isinstance(topology, str) else getattr(topology, "__name__", "custom")
        self.schedule = schedule or TwoPhaseSchedule()
        self.proposer = proposer or OfflineProposer(self.space)
        self.selection = SELECTIONS[selection]() if isinstance(selection, str) else selection
        self.selection_name = selection if isinstance(selection, str) else "custom"
        self.seed = seed
        self.budget = Budget(evaluations=budget) if isinstance(budget, int) else budget
        self.name = name or f"{self.problem.workload}-evolution"
        self.on_progress = on_progress
        self.islands = [Island(i, self.space, capacity=population) for i in range(islands)]
        self.evaluated = 0
        #: Evaluations this process ran (a resumed run's ``evaluated`` counts those the
        #: database already held): what the live view's rate is made of.
        self.judged = 0
        self.seen: set[str] = set()
        self.statuses: Counter[str] = Counter()
        self.rejected = 0
        self.history: list[dict[str, Any]] = []
        self.phase_switch: int | None = None
        #: This generation's build CPU seconds, GPU job seconds and GPU seconds spent waiting
        #: on builds (from each result's extra; the live view shows them).
        self.spent = {"compile_s": 0.0, "gpu_s": 0.0, "build_wait_s": 0.0}
        self._t0 = time.perf_counter()
        #: Settings of the caller that the run stores beside the agent's own (``cuco.search``
        #: adds the dry-run flag and the LLM spec), so a resume can take them back.
        self.run_config: dict[str, Any] = {}

    # ---- bookkeeping ------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"seed": self.seed, "islands": self.n_islands, "population": self.population,
                "children": self.children, "migrate_every": self.migrate_every,
                "topology": self.topology_name, "selection": self.selection_name,
                "proposer": self.proposer.name, "schedule": repr(self.schedule),
                "budget": vars(self.budget), "space": {f: [getattr(c, "value", c) for c in v]
                                                       for f, v in self.space.choices.items()},
                **self.run_config}

    def progress(self) -> float:
        return min(1.0, self.evaluated / max(1, self.budget.evaluations))

    def _out_of_budget(self, run_id: int) -> str | None:
        if self.evaluated >= self.budget.evaluations:
            return "budget"
        if self.budget.seconds is not None and time.perf_counter() - self._t0 >= self.budget.seconds:
            return "time"
        if self.budget.dollars is not None and self.db.llm_cost(run_id) >= self.budget.dollars:
            return "dollars"
        return None

    # ---- evaluating one proposal ------------------------------------------------------
    def _record(self, run_id: int, island: int, generation: int, p: Proposal) -> Individual:
        cid = self.db.add_candidate(self.problem.workload, directives=p.directives, source=p.source,
                                    origin=p.origin, run_id=run_id, island=island,
                                    generation=generation, parents=p.parents, note=p.note or None)
        return Individual(cid, p.directives, island, generation, p.parents, p.source)

    def _evaluate(self, run_id: int, ind: Individual) -> Individual:
        return self._evaluate_batch(run_id, [ind])[0]

    def _evaluate_batch(self, run_id: int, inds: list[Individual]) -> list[Individual]:
        """Judge a batch (in parallel where the evaluator can: a cluster backend, say)."""
        if not inds:
            return []
        cands = [Candidate(i.directives, i.source, i.candidate_id) for i in inds]
        try:
            if len(cands) > 1 and hasattr(self.evaluator, "evaluate_many"):
                results = self.evaluator.evaluate_many(cands)
            else:
                results = [self.evaluator.evaluate(c) for c in cands]
        except Exception:  # noqa: BLE001 - a broken evaluator must not lose the candidates
            results = None
        if results is None:  # judge one by one, so the candidates that can be judged are
            results = []
            for c in cands:
                try:
                    results.append(self.evaluator.evaluate(c))
                except Exception as exc:  # noqa: BLE001
                    r = EvalResult("error", "evaluate", f"{type(exc).__name__}: {exc}")
                    if getattr(self.evaluator, "db", None) is not None:
                        store_result(self.db, self.problem.workload, c, r, run_id)
                    results.append(r)
        for ind, cand, r in zip(inds, cands, results):
            if getattr(self.evaluator, "db", None) is None:
                store_result(self.db, self.problem.workload, cand, r, run_id)
            ind.status, ind.score, ind.stage, ind.error = r.status, r.score, r.stage_reached, r.error
            self.evaluated += 1
            self.judged += 1
            for key in self.spent:  # where this generation's time goes (build CPU, GPU, idle GPU)
                self.spent[key] += float(getattr(r, "extra", {}).get(key) or 0.0)
            self.seen.add(ind.directives.full_name)
            self.statuses[r.status if r.status == "ok" else f"{r.stage_reached}:{r.status}"] += 1
            self.proposer.observe(ind)
        return inds

    def _propose_new(self, parents: list[Individual], phase, rng: random.Random,
                     run_id: int | None = None, generation: int | None = None) -> Proposal | None:
        from cuco.agents.llm_proposer import ProposalRejected
        from cuco.llm.base import LLMError

        for _ in range(30):
            try:
                p = self.proposer.propose(parents, phase, rng)
            except LLMUnreachable:  # no proposal will come: the run stops (see run)
                raise
            except (ProposalRejected, LLMError) as exc:  # stored by the proposer; go on
                self.rejected += 1
                if run_id is not None:
                    self.db.log_event(run_id, "rejected", {"reason": str(exc)[:2000]}, generation)
                return None
            if p.source is not None or p.directives.full_name not in self.seen:
                return p
        # the neighbourhood is used up: an unseen point anywhere keeps the search going
        for _ in range(200):
            d = self.space.sample(rng)
            if d.full_name not in self.seen:
                return Proposal(d, (), "offline", note="restart: neighbourhood exhausted")
        return None

    # ---- the search -------------------------------------------------------------------
    def run(self, run_id: int | None = None) -> SearchResult:
        """Start a new run, or resume ``run_id`` from the database."""
        self._t0 = time.perf_counter()
        self.judged = 0
        fresh = run_id is None
        if fresh:
            run_id = self.db.create_run(self.name, self.problem.workload,
                                        problem=self.problem.model_dump(), config=self.config())
        if hasattr(self.proposer, "bind"):
            self.proposer.bind(self.db, run_id)
        try:
            stopped = self._search(run_id, fresh)
        except KeyboardInterrupt as exc:
            self.db.update_run(run_id, status="interrupted")
            raise SearchInterrupted(run_id) from exc
        except LLMUnreachable as exc:  # resumable once the endpoint or key is fixed
            self.db.update_run(run_id, status="interrupted")
            self.db.log_event(run_id, "stopped", {"reason": str(exc)[:2000]})
            exc.run_id = run_id
            raise
        self.db.update_run(run_id, status="done")
        best = min((m for isl in self.islands for m in isl.members
                    if m.ok and self.db.disqualified(m.candidate_id) is None),
                   key=lambda m: best_first(m.score, m.candidate_id), default=None)
        return SearchResult(run_id, best, self.evaluated, self.history, self.phase_switch, stopped)

    def _search(self, run_id: int, fresh: bool) -> str:
        """Seed or restore, then generations until a budget runs out; why it stopped."""
        if fresh:
            generation = self._seed(run_id)
        else:
            generation = self._restore(run_id)
            self.db.update_run(run_id, status="running")
        stopped = self._out_of_budget(run_id)
        empty = 0
        while stopped is None:
            generation += 1
            phase = self.schedule.phase(self.progress())
            if phase.name == "exploitation" and self.phase_switch is None:
                self.phase_switch = generation
                self.db.log_event(run_id, "phase_switch", {"to": phase.name,
                                                           "evaluations": self.evaluated},
                                  generation)
            before = self.evaluated
            summary = self._generation(run_id, generation, phase)
            if summary is None:
                stopped = "space exhausted"
                break
            empty = empty + 1 if self.evaluated == before else 0
            if empty >= 5:
                stopped = "proposer produced nothing for 5 generations"
                break
            if self.migrate_every and generation % self.migrate_every == 0:
                self._migrate(run_id, generation)
            stopped = self._out_of_budget(run_id)
        return stopped

    def _seed(self, run_id: int) -> int:
        """Generation 0: the fast-path baseline and random points on every island."""
        base = self.space.default()
        for isl in self.islands:
            rng = _rng(self.seed, 0, isl.index)
            picks = [base] + [self.space.sample(rng) for _ in range(self.population - 1)]
            batch = []
            for d in picks[: max(0, self.budget.evaluations - self.evaluated)]:
                origin = "fastpath" if d == base else "offline"
                batch.append(self._record(run_id, isl.index, 0, Proposal(d, (), origin)))
            for ind in self._evaluate_batch(run_id, batch):
                isl.add(ind)
        self._summarise(run_id, 0, [m for isl in self.islands for m in isl.members], "seed")
        return 0

    def _generation(self, run_id: int, g: int, phase) -> dict | None:
        rejected_before = self.rejected
        pending: list[tuple[Island, Individual]] = []
        for isl in self.islands:
            rng = _rng(self.seed, g, isl.index)
            for _ in range(self.children):
                if self.evaluated + len(pending) >= self.budget.evaluations or self._out_of_budget(run_id):
                    break
                parents = isl.select(2, self.selection, rng)
                if not parents:
                    parents = [Individual(-1, self.space.default(), isl.index, g)]
                p = self._propose_new(parents, phase, rng, run_id, g)
                if p is None:
                    continue
                if p.source is None:
                    self.seen.add(p.directives.full_name)  # no twin within one batch
                pending.append((isl, self._record(run_id, isl.index, g, p)))
        born = self._evaluate_batch(run_id, [ind for _, ind in pending])
        for (isl, _), child in zip(pending, born):
            isl.add(child, phase.novelty_weight)
        if not born and self.rejected == rejected_before and not self._out_of_budget(run_id):
            return None
        return self._summarise(run_id, g, born, phase.name)

    def _summarise(self, run_id: int, g: int, born: list[Individual], phase: str) -> dict:
        """What improved and what failed this generation (fed to later LLM prompts)."""
        by_id = {m.candidate_id: m for isl in self.islands for m in isl.members}
        notes, worse = [], []
        for c in born:
            parent = by_id.get(c.parents[0]) if c.parents else None
            if parent is None or not c.ok or not parent.ok or parent.score <= 0:
                continue
            gain = c.score / parent.score - 1
            if abs(gain) >= 0.02:
                changed = [f"{f}={getattr(v, 'value', v)}" for f, v in c.directives.__dict__.items()
                           if parent.directives.__dict__[f] != v]
                (notes if gain > 0 else worse).append(
                    f"{'+' if gain > 0 else ''}{gain:.1%} from {', '.join(changed)}")
        failed = Counter(f"{c.stage}:{c.status}" for c in born if not c.ok)
        if self.rejected:
            failed["llm:rejected (total)"] = self.rejected
        stats = [isl.stats() for isl in self.islands]
        best = max((s["best"] for s in stats), default=0.0)
        for isl in self.islands:
            isl.history.append(isl.stats()["best"])
        summary = {"generation": g, "phase": phase, "evaluations": self.evaluated,
                   "judged": self.judged,
                   "best": best, "islands": stats, "improved": notes[:8], "worsened": worse[:8],
                   "failed": dict(failed), "elapsed_s": round(time.perf_counter() - self._t0, 2),
                   **{k: round(v, 2) for k, v in self.spent.items()}}
        self.spent = dict.fromkeys(self.spent, 0.0)
        self.history.append(summary)
        self.db.log_event(run_id, "generation", summary, g)
        if self.on_progress:
            self.on_progress(summary)
        return summary

    def _migrate(self, run_id: int, g: int) -> None:
        rng = _rng(self.seed, g, -1)
        moves = []
        for src, dst in self.topology(self.n_islands, rng):
            best = self.islands[src].best()
            if best is not None and best.ok and all(
                    m.candidate_id != best.candidate_id for m in self.islands[dst].members):
                moves.append((src, dst, best))
        for src, dst, best in moves:
            self.islands[dst].add(best)
            self.db.log_event(run_id, "migration", {"from": src, "to": dst,
                                                    "candidate": best.candidate_id}, g)

    # ---- resume -----------------------------------------------------------------------
    def meta_summary(self, last: int = 5) -> str:
        """Recent generations in a few lines, for prompts and the live view."""
        lines = []
        for h in self.history[-last:]:
            part = f"gen {h['generation']} ({h['phase']}): best {h['best']:.3f}"
            if h["improved"]:
                part += "; improved: " + "; ".join(list(dict.fromkeys(h["improved"]))[:3])  # once each
            if h.get("worsened"):
                part += "; worse: " + "; ".join(list(dict.fromkeys(h["worsened"]))[:2])
            if h["failed"]:
                part += "; failed: " + ", ".join(f"{k} x{v}" for k, v in h["failed"].items())
            lines.append(part)
        return "\n".join(lines)

    def _restore(self, run_id: int) -> int:
        run = self.db.run(run_id)
        cfg = run.config or {}
        if cfg.get("seed", self.seed) != self.seed or cfg.get("islands", self.n_islands) != self.n_islands:
            raise InputError(f"run {run_id} was started with seed={cfg.get('seed')} and "
                             f"islands={cfg.get('islands')}; resume with the same values")
        latest: dict[int, Any] = {}
        for e in self.db.evaluations():
            latest[e.candidate_id] = e
        generation = 0
        by_id: dict[int, Individual] = {}
        for c in self.db.candidates(run_id=run_id):
            d = Directives(**c.directives) if c.directives else self.space.default()
            ind = Individual(c.id, d, c.island or 0, c.generation or 0, tuple(c.parents), c.source)
            ev = latest.get(c.id)
            if ev is None:  # recorded, never judged (the process died): judge it now
                self._evaluate(run_id, ind)
            else:
                ind.status, ind.stage, ind.error = ev.status, ev.stage_reached, ev.error
                ind.score = ev.speedup if ev.status == "ok" and ev.speedup else 0.0
                self.evaluated += 1
                self.seen.add(d.full_name)
                self.proposer.observe(ind)
            by_id[c.id] = ind
            self.islands[ind.island].add(ind)
            generation = max(generation, ind.generation)
        for ev in self.db.events(run_id, "migration"):
            ind = by_id.get(ev["data"]["candidate"])
            if ind is not None:
                self.islands[ev["data"]["to"]].add(ind)
        switches = self.db.events(run_id, "phase_switch")
        self.phase_switch = switches[0]["generation"] if switches else None
        self.history = [e["data"] for e in self.db.events(run_id, "generation")]
        return generation
