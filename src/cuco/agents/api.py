"""One-call search API (``cuco.search``) and the GPU search space for a workload."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco.agents.evolution import Budget, EvolutionAgent, SearchResult
from cuco.agents.proposers import OfflineProposer, TPEProposer
from cuco.agents.resume import DEFAULTS, RunSettings, resumed
from cuco.db import CandidateDB
from cuco.design import DesignSpace, Problem, check_count, make_problem
from cuco.design.placement_rules import PLACEMENTS
from cuco.errors import InputError


PROPOSERS = ("offline", "tpe")

#: What ``cluster=`` takes: ``local`` (a Ray cluster started here), ``auto`` (the one this
#: machine is part of), ``HOST:PORT`` or a Ray client address ``ray://HOST:PORT``.
_RAY_ADDRESS = re.compile(r"local|auto|(ray://)?([A-Za-z0-9_.-]+|\[[0-9A-Fa-f:]+\]):\d{1,5}")


def check_cluster(cluster: str | None) -> None:
    """``cluster`` if Ray can take it as an address, else an :class:`InputError` naming the
    forms it takes (checked before a database is opened or Ray is started)."""
    if cluster is not None and not _RAY_ADDRESS.fullmatch(cluster.strip()):
        raise InputError(f"cluster {cluster!r} is not a Ray address: give ray://HOST:10001 (a Ray "
                         "client), HOST:6379 or auto (a cluster this machine is part of), or local "
                         "(start one here)", param="cluster", fix="local")

Shape = str | Mapping[str, Any] | None


def resolve_problem(workload: str | Problem, shape: Shape = None, world_size: int = 2,
                    **fields: Any) -> Problem:
    """The typed problem an entry point was given: a :class:`Problem`, or a workload name
    with its shape (``"8192x8192x8192"``, ``"tokens=128,hidden=7168"``, a mapping, or named
    fields such as ``m=..., k=..., n=...``); refused with the field and fix otherwise."""
    if isinstance(workload, Problem):
        return workload  # make_problem checks the name, the world size and the shape
    return make_problem(workload, shape, world_size=world_size,
                        **{f: v for f, v in fields.items() if v is not None})


def check_search(problem: Problem, *, budget: int = 1, islands: int = 1,
                 proposer: str = "offline", llm: str | None = None,
                 placements: Sequence[str] | None = None, hosts: int = 1,
                 space: bool = True) -> Problem:
    """``problem`` if a search of it can start, or :class:`~cuco.errors.InputError` naming
    the argument to change. Every entry point (``search``, ``fastpath``, ``tune``, the CLI)
    calls this before it opens a database or starts a GPU."""
    check_count("budget", budget, "evaluations", 100)
    check_count("islands", islands, "islands", 4)
    check_count("hosts", hosts, "cluster hosts", 2)
    if proposer not in PROPOSERS:
        close = difflib.get_close_matches(str(proposer), PROPOSERS, n=1)
        raise InputError(f"unknown proposer {proposer!r}; the proposers are {', '.join(PROPOSERS)}",
                         param="proposer", fix=close[0] if close else "offline", guess=bool(close))
    if placements is not None:
        placements = tuple(placements)
        bad = [p for p in placements if p not in PLACEMENTS]
        if bad or not placements:
            raise InputError(f"placements {','.join(placements) or '(none)'}: choose among "
                             f"{', '.join(PLACEMENTS)}", param="placements", fix=",".join(PLACEMENTS))
    if llm is not None:
        from cuco.llm.base import check_llm_spec
        check_llm_spec(llm)
    if space:  # a shape or placement no template fits is refused here, naming what to change
        gpu_space(problem, placements).sample(0)
    return problem


def gpu_space(problem: Problem, placements: Sequence[str] | None = None) -> DesignSpace:
    """The points that have a fused template for ``problem`` (its workload's
    :meth:`~cuco.workloads.Workload.space`), optionally only ``placements``."""
    from cuco.workloads import for_problem
    return for_problem(problem).space(placements)


def search_settings(workload: str | Problem | None = None, shape: Shape = None,
                    world_size: int | None = None, *, db: str | os.PathLike | CandidateDB = "cuco.db",
                    resume: int | None = None, budget: int | None = None,
                    islands: int | None = None, seed: int | None = None,
                    proposer: str | None = None, dry_run: bool | None = None,
                    llm: str | None = None, placements: Sequence[str] | None = None,
                    hosts: int = 1, space: bool = True, **fields: Any) -> RunSettings:
    """The settings a search runs with, checked (:func:`check_search`). A new run: what was
    given, else the defaults (``resume.DEFAULTS``). ``resume=ID``: the run's stored settings
    (:func:`cuco.agents.resume.resumed`); a given value that contradicts them is an
    :class:`~cuco.errors.InputError` naming the stored value, a larger budget extends it."""
    for name, value in (("budget", budget), ("islands", islands)):
        if value is not None:
            check_count(name, value, "evaluations" if name == "budget" else "islands",
                        DEFAULTS[name])
    if resume is None:
        if workload is None:
            raise InputError("search needs a workload (or resume=RUN_ID to continue a run)",
                             param="workload", fix="gemm_allreduce")
        settings = RunSettings(
            problem=resolve_problem(workload, shape, DEFAULTS["world_size"] if world_size is None
                                    else world_size, **fields),
            budget=DEFAULTS["budget"] if budget is None else budget,
            islands=DEFAULTS["islands"] if islands is None else islands,
            seed=DEFAULTS["seed"] if seed is None else seed,
            proposer=DEFAULTS["proposer"] if proposer is None else proposer,
            dry_run=bool(dry_run), placements=tuple(placements) if placements else None, llm=llm)
    else:
        if proposer is not None:
            check_search(resolve_problem("gemm_allreduce", "8192x8192x8192"), proposer=proposer,
                         space=False)  # an unknown name is refused as such, not as a conflict
        if not isinstance(db, CandidateDB) and "://" not in str(db) and not Path(db).exists():
            raise InputError(f"no candidate database at {db} to resume run {resume} from; pass "
                             "the database the run is in", param="db", fix="cuco.db")
        store = db if isinstance(db, CandidateDB) else CandidateDB(db)
        settings = resumed(store, resume, workload=workload, shape=shape, world_size=world_size,
                           budget=budget, islands=islands, seed=seed, proposer=proposer,
                           dry_run=dry_run, placements=placements, llm=llm, **fields)
    check_search(settings.problem, budget=settings.budget, islands=settings.islands,
                 proposer=settings.proposer, llm=settings.llm, placements=settings.placements,
                 hosts=hosts, space=space)
    return settings


def search(workload: str | Problem | None = None, shape: Shape = None,
           world_size: int | None = None, *, db: str | CandidateDB = "cuco.db",
           budget: int | None = None, islands: int | None = None, seed: int | None = None,
           proposer: str | None = None, dry_run: bool | None = None,
           resume: int | None = None, evaluator: Any = None, on_progress=None,
           llm: str | None = None, cluster: str | None = None, hosts: int = 2,
           placements: Sequence[str] | None = None, m: int | None = None,
           n: int | None = None, k: int | None = None, **agent_kw) -> SearchResult:
    """Search fused kernels for one workload and shape; results land in ``db``.

    >>> search("gemm_allreduce", "8192x8192x8192", db="c.db", dry_run=True)       # doctest: +SKIP
    >>> search("moe", {"tokens": 128, "hidden": 7168, "experts": 256, "topk": 8})  # doctest: +SKIP
    >>> search(db="c.db", resume=1, budget=500)   # run 1 as it was started, to 500  # doctest: +SKIP

    ``shape``: a string (``MxKxN`` for the GEMM workloads, ``field=value,...`` for any), a
    mapping of the workload's problem fields, or ``m=, k=, n=``; or pass a
    :class:`~cuco.design.Problem` as ``workload``. ``dry_run=True`` scores an analytic model
    instead of GPUs (no GPU needed); otherwise a worker group of ``world_size`` GPUs is
    started and closed. ``llm="openai:MODEL" | "anthropic:MODEL" | "compat:URL|MODEL"`` adds
    LLM edits of the kernels' EVOLVE-BLOCKs (the key comes from the environment).
    ``placements`` narrows the workload's space (e.g. ``("side_stream",)`` where CUTLASS's
    Hopper kernels cannot run). Left out (``None``): world size 2, budget 100, 4 islands,
    seed 0, the offline proposer, no dry run; ``resume=RUN_ID`` instead takes every one of
    them from the run (a value given must agree; a larger ``budget`` extends the run).
    """
    check_cluster(cluster)
    settings = search_settings(workload, shape, world_size, db=db, resume=resume, budget=budget,
                               islands=islands, seed=seed, proposer=proposer, dry_run=dry_run,
                               llm=llm, placements=placements, hosts=hosts,
                               space="space" not in agent_kw, m=m, n=n, k=k)
    problem, budget, islands, seed = (settings.problem, settings.budget, settings.islands,
                                      settings.seed)
    proposer, dry_run, placements = settings.proposer, settings.dry_run, settings.placements
    client = None
    if llm is not None:  # a missing key fails before the database is made or a GPU started
        from cuco.llm import make_client
        client = make_client(llm)
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
    group = None
    if evaluator is None and cluster is not None:
        from cuco.cluster import RayBackend
        evaluator = RayBackend(_host_evaluator(problem, dry_run), problem=problem, hosts=hosts,
                               address=None if cluster == "local" else cluster,
                               actor_options={"num_cpus": 1} if dry_run else {"num_gpus": problem.world_size})
    if evaluator is None:
        if dry_run:
            from cuco.evaluate.analytic import AnalyticEvaluator
            evaluator = AnalyticEvaluator(problem)
        else:
            from cuco.evaluate import evaluator_for
            from cuco.runtime import WorkerGroup
            from cuco.errors import NoGPUError
            try:
                group = WorkerGroup(problem.world_size, nvshmem=True).start()
            except NoGPUError:  # its own fix (WorkerGroup(gpu=False)) is not a search's
                raise NoGPUError("no CUDA GPU is visible to run the search's kernels; without "
                                 "GPUs, search the analytic model",
                                 param="dry_run", fix=True) from None
            evaluator = evaluator_for(problem, group=group)
    space = agent_kw.pop("space", None) or gpu_space(problem, placements)
    prop = TPEProposer(space, seed) if proposer == "tpe" else OfflineProposer(space)
    agent = EvolutionAgent(evaluator, store, space=space, islands=islands, seed=seed,
                           budget=Budget(evaluations=budget), proposer=prop,
                           on_progress=on_progress, **agent_kw)
    agent.run_config = {"dry_run": dry_run, "llm": llm, "base_proposer": proposer}
    if resume is not None and budget != settings.stored_budget:  # a larger budget extends it
        cfg = store.run(resume).config or {}
        store.update_run(resume, config={**cfg, "budget": {**(cfg.get("budget") or {}),
                                                           "evaluations": budget}})
    if client is not None:
        from cuco.agents.llm_proposer import LLMProposer
        from cuco.workloads import for_problem
        wl = for_problem(problem)
        agent.proposer = LLMProposer(client, space, lambda d: wl.render(d).source,
                                     meta_summary=agent.meta_summary)
    try:
        return agent.run(resume)
    finally:
        if group is not None:
            group.close()


def fastpath(workload: str | Problem, shape: Shape = None, world_size: int = 2, *,
             db: str | CandidateDB = "cuco.db", host_program: str | None = None,
             llm: str | None = None, max_rounds: int = 6, evaluator: Any = None,
             m: int | None = None, n: int | None = None, k: int | None = None):
    """The first correct fused kernel for a host-driven program (CUCo's fast path).

    ``workload`` and ``shape`` as in :func:`search`. Without ``llm``: the template route
    (conservative side-stream directives, no LLM call). With ``llm`` and ``host_program``
    (CUDA/C++ text): the LLM route, which writes the fused scaffold's blocks from the
    program and learns from each failure.
    """
    from cuco.agents.fastpath import FastPathAgent

    problem = check_search(resolve_problem(workload, shape, world_size, m=m, n=n, k=k), llm=llm,
                           placements=("side_stream",))
    check_count("max_rounds", max_rounds, "rounds", 6)
    if llm is not None and not host_program:
        raise InputError("the LLM route ports a host program: pass it as host_program= (its source), "
                         "or leave llm out for the template route, which needs none")
    client = None
    if llm is not None:  # a missing key fails before the database is made or a GPU started
        from cuco.llm import make_client
        client = make_client(llm)
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
    group = None
    if evaluator is None:
        from cuco.evaluate import evaluator_for
        from cuco.runtime import WorkerGroup
        group = WorkerGroup(problem.world_size, nvshmem=True).start()
        evaluator = evaluator_for(problem, group=group)
    # the fast path's baseline: the side-stream template (vendor compute, no CUTLASS needed)
    agent = FastPathAgent(evaluator, store, space=gpu_space(problem, ("side_stream",)))
    run_id = store.create_run(f"{problem.workload}-fastpath", problem.workload,
                              problem=problem.model_dump(),
                              config={"route": "llm" if client else "template", "llm": llm})
    try:
        res = (agent.run_llm(client, host_program, max_rounds=max_rounds, run_id=run_id)
               if client is not None else agent.run(run_id, max_rounds=max_rounds))
        store.update_run(run_id, status="done")
        return res
    finally:
        if group is not None:
            group.close()


def _host_evaluator(problem: Problem, dry_run: bool):
    """What each cluster host builds for itself: its own worker group and evaluator."""
    def make():
        if dry_run:
            from cuco.evaluate.analytic import AnalyticEvaluator
            return AnalyticEvaluator(problem)
        from cuco.evaluate import evaluator_for
        from cuco.runtime import WorkerGroup
        return evaluator_for(problem, group=WorkerGroup(problem.world_size, nvshmem=True).start())
    return make
