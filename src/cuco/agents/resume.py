"""What a resumed search runs with: the settings its run stored, never today's defaults.

A run records its problem and its agent's configuration when it starts
(:meth:`EvolutionAgent.config`). ``--resume ID`` takes the workload, shape, world size,
proposer, islands, seed, placements, budget and dry-run flag from there; a value given
again must agree (else :class:`~cuco.errors.InputError` naming the stored value), except
the budget, which may grow: a larger budget extends the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuco.db import CandidateDB
from cuco.design import Problem, problem_from_dict
from cuco.errors import InputError

#: What a new run uses where its caller gave nothing.
DEFAULTS: dict[str, Any] = {"world_size": 2, "budget": 100, "islands": 4, "seed": 0,
                            "proposer": "offline", "dry_run": False}


@dataclass(frozen=True)
class RunSettings:
    """The settings of one search, new or resumed."""

    problem: Problem
    budget: int
    islands: int
    seed: int
    proposer: str
    dry_run: bool
    placements: tuple[str, ...] | None = None
    llm: str | None = None
    stored_budget: int | None = None  # a resumed run's budget before this call
    done: int = 0  # evaluations a resumed run already has


def _conflict(run_id: int, what: str, stored: Any, given: Any, param: str,
              fix: Any) -> InputError:
    return InputError(f"run {run_id} was started with {what} {stored}, not {given}; a resumed "
                      "run keeps the settings it was started with (leave the value out, or "
                      "start a new run without resuming)", param=param, fix=fix)


def resumed(store: CandidateDB, run_id: int, *, workload: str | Problem | None = None,
            shape: str | Mapping[str, Any] | Sequence[Any] | None = None,
            world_size: int | None = None, budget: int | None = None,
            islands: int | None = None, seed: int | None = None, proposer: str | None = None,
            dry_run: bool | None = None, placements: Sequence[str] | None = None,
            llm: str | None = None, **shape_fields: Any) -> RunSettings:
    """The settings run ``run_id`` of ``store`` resumes with; the arguments are what the
    caller gave (``None``: not given). :class:`~cuco.errors.UnknownId` for a run the
    database lacks, :class:`~cuco.errors.InputError` for a value that contradicts it."""
    run = store.run(run_id)
    cfg = run.config or {}
    if not run.problem:
        raise InputError(f"run {run_id} is a {run.workload} run without a stored problem (made "
                         "by an older cuco or by hand), so it cannot be resumed; start a new run")
    stored = problem_from_dict(run.problem)
    if isinstance(workload, Problem):
        if workload != stored:
            raise _conflict(run_id, "the problem", stored.label, workload.label, "workload",
                            stored.workload if workload.workload != stored.workload else stored.shape_text)
    elif workload is not None and workload != stored.workload:
        raise _conflict(run_id, "workload", stored.workload, workload, "workload", stored.workload)
    if world_size is not None and world_size != stored.world_size:
        raise _conflict(run_id, "world size", stored.world_size, world_size, "world_size",
                        stored.world_size)
    if (shape is not None or shape_fields) and not isinstance(workload, Problem):
        fields = _shape_fields(stored, shape, shape_fields)
        if any(stored.shape.get(f) != v for f, v in fields.items()):
            raise _conflict(run_id, "shape", stored.shape_text, _text(fields), "shape",
                            stored.shape_text)
    n_islands = cfg.get("islands", DEFAULTS["islands"])
    if islands is not None and islands != n_islands:
        raise _conflict(run_id, "islands", n_islands, islands, "islands", n_islands)
    run_seed = cfg.get("seed", DEFAULTS["seed"])
    if seed is not None and seed != run_seed:
        raise _conflict(run_id, "seed", run_seed, seed, "seed", run_seed)
    run_proposer = cfg.get("proposer", DEFAULTS["proposer"])
    run_llm = cfg.get("llm")
    if run_proposer == "llm" or run_llm:
        if llm is None:
            spec = run_llm or "its spec was not stored"
            raise InputError(f"run {run_id} proposes with an LLM ({spec}); resume it with the "
                             "same LLM", param="llm", fix=run_llm or "openai:MODEL")
        if run_llm and llm != run_llm:
            raise _conflict(run_id, "LLM", run_llm, llm, "llm", run_llm)
        run_proposer = cfg.get("base_proposer", DEFAULTS["proposer"])
    elif llm is not None:
        raise _conflict(run_id, "proposer", run_proposer, f"an LLM ({llm})", "proposer", run_proposer)
    if proposer is not None and proposer != run_proposer:
        raise _conflict(run_id, "proposer", run_proposer, proposer, "proposer", run_proposer)
    run_places = tuple((cfg.get("space") or {}).get("placement") or ()) or None
    if placements is not None and run_places is not None and set(placements) != set(run_places):
        raise _conflict(run_id, "placements", ",".join(run_places), ",".join(placements),
                        "placements", ",".join(run_places))
    run_dry = cfg.get("dry_run")
    if dry_run is not None and run_dry is not None and dry_run != run_dry:
        how = ("a dry run (the analytic model); resume it as one (--dry-run, dry_run=True)"
               if run_dry else "measured on GPUs; resume it without --dry-run (dry_run=False)")
        raise InputError(f"run {run_id} was {how}: one run never mixes model and measured "
                         "numbers")
    run_budget = int((cfg.get("budget") or {}).get("evaluations", DEFAULTS["budget"]))
    done = store.count_candidates(run_id)
    if budget is not None and budget < run_budget:
        raise InputError(f"run {run_id} was started with a budget of {run_budget} evaluations "
                         f"({done} recorded); resuming can extend a budget, not shrink it",
                         param="budget", fix=run_budget)
    return RunSettings(problem=stored, budget=budget or run_budget, islands=n_islands,
                       seed=run_seed, proposer=run_proposer,
                       dry_run=bool(run_dry if run_dry is not None else dry_run),
                       placements=run_places, llm=llm, stored_budget=run_budget, done=done)


def _shape_fields(stored: Problem, shape: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The shape fields a caller gave, as the stored problem's class reads them."""
    from cuco.design import parse_shape
    if isinstance(shape, str):
        return parse_shape(stored.workload, shape)
    if isinstance(shape, Mapping):
        return dict(shape)
    if isinstance(shape, Sequence):
        return dict(zip(stored.SHAPE, shape))
    return {f: v for f, v in fields.items() if v is not None}


def _text(fields: Mapping[str, Any]) -> str:
    if set(fields) == {"m", "k", "n"}:
        return f"{fields['m']}x{fields['k']}x{fields['n']}"
    return ",".join(f"{f}={v}" for f, v in fields.items())
