"""One-call search API (``cuco.search``) and the GPU search space for a workload."""

from __future__ import annotations

from typing import Any

from cuco.agents.evolution import Budget, EvolutionAgent, SearchResult
from cuco.agents.proposers import OfflineProposer, TPEProposer
from cuco.db import CandidateDB
from cuco.design import DesignSpace, Problem
from cuco.design.tiles import chunk_sizes


def gpu_space(problem: Problem) -> DesignSpace:
    """The points that have a fused template today (side_stream; tiles and stages unused)."""
    chunks = sorted(chunk_sizes(problem, (2, 4, 8, 16, 32), floor_log2=15))
    return DesignSpace(problem, backend=["lsa", "nvshmem"], placement=["side_stream"],
                       sync_scope=["chunk"], chunk_bytes=chunks, tile_m=[128], tile_n=[128],
                       tile_k=[64], stages=[4], comm_ctas=[8, 16, 32, 64],
                       chunk_schedule=["direct"])


def search(workload: str, m: int, n: int, k: int, world_size: int = 2, *,
           db: str | CandidateDB = "cuco.db", budget: int = 100, islands: int = 4,
           seed: int = 0, proposer: str = "offline", dry_run: bool = False,
           resume: int | None = None, evaluator: Any = None, on_progress=None,
           llm: str | None = None, cluster: str | None = None, hosts: int = 2,
           **agent_kw) -> SearchResult:
    """Search fused kernels for one workload and shape; results land in ``db``.

    ``dry_run=True`` scores an analytic model instead of GPUs (no GPU needed);
    otherwise a worker group of ``world_size`` GPUs is started and closed.
    ``llm="openai:MODEL" | "anthropic:MODEL" | "compat:URL|MODEL"`` adds LLM edits of the
    kernels' EVOLVE-BLOCKs (the key comes from the environment).
    """
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
    problem = Problem(workload=workload, m=m, n=n, k=k, world_size=world_size)
    client = None
    if llm is not None:  # fail on a missing key before any GPU is started
        from cuco.llm import make_client
        client = make_client(llm)
    group = None
    if evaluator is None and cluster is not None:
        from cuco.cluster import RayBackend
        evaluator = RayBackend(_host_evaluator(workload, m, n, k, world_size, dry_run),
                               problem=problem, hosts=hosts,
                               address=None if cluster == "local" else cluster,
                               actor_options={"num_cpus": 1} if dry_run else {"num_gpus": world_size})
    if evaluator is None:
        if dry_run:
            from cuco.evaluate.analytic import AnalyticEvaluator
            evaluator = AnalyticEvaluator(problem)
        else:
            from cuco.evaluate import Evaluator
            from cuco.runtime import WorkerGroup
            from cuco.workloads import get
            group = WorkerGroup(world_size, nvshmem=True).start()
            evaluator = Evaluator(get(workload)(m, n, k, world_size), group=group)
    space = agent_kw.pop("space", None) or gpu_space(problem)
    prop = TPEProposer(space, seed) if proposer == "tpe" else OfflineProposer(space)
    agent = EvolutionAgent(evaluator, store, space=space, islands=islands, seed=seed,
                           budget=Budget(evaluations=budget), proposer=prop,
                           on_progress=on_progress, **agent_kw)
    if client is not None:
        from cuco.agents.llm_proposer import LLMProposer
        from cuco.kernels.tp import render_tp
        agent.proposer = LLMProposer(client, space, lambda d: render_tp(problem, d)[0].source,
                                     meta_summary=agent.meta_summary)
    try:
        return agent.run(resume)
    finally:
        if group is not None:
            group.close()


def fastpath(workload: str, m: int, n: int, k: int, world_size: int = 2, *,
             db: str | CandidateDB = "cuco.db", host_program: str | None = None,
             llm: str | None = None, max_rounds: int = 6, evaluator: Any = None):
    """The first correct fused kernel for a host-driven program (CUCo's fast path).

    Without ``llm``: the template route (conservative directives, no LLM call).
    With ``llm`` and ``host_program`` (CUDA/C++ text): the LLM route, which writes the
    fused scaffold's blocks from the program and learns from each failure.
    """
    from cuco.agents.fastpath import FastPathAgent

    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
    problem = Problem(workload=workload, m=m, n=n, k=k, world_size=world_size)
    if llm is not None and not host_program:
        raise ValueError("the LLM route needs the host program (host_program=...); without "
                         "--llm the template route needs none")
    client = None
    if llm is not None:  # a missing key fails before any GPU starts
        from cuco.llm import make_client
        client = make_client(llm)
    group = None
    if evaluator is None:
        from cuco.evaluate import Evaluator
        from cuco.runtime import WorkerGroup
        from cuco.workloads import get
        group = WorkerGroup(world_size, nvshmem=True).start()
        evaluator = Evaluator(get(workload)(m, n, k, world_size), group=group)
    agent = FastPathAgent(evaluator, store, space=gpu_space(problem))
    run_id = store.create_run(f"{workload}-fastpath", workload, problem=problem.model_dump(),
                              config={"route": "llm" if client else "template", "llm": llm})
    try:
        res = (agent.run_llm(client, host_program, max_rounds=max_rounds, run_id=run_id)
               if client is not None else agent.run(run_id, max_rounds=max_rounds))
        store.update_run(run_id, status="done")
        return res
    finally:
        if group is not None:
            group.close()


def _host_evaluator(workload: str, m: int, n: int, k: int, world_size: int, dry_run: bool):
    """What each cluster host builds for itself: its own worker group and evaluator."""
    def make():
        if dry_run:
            from cuco.evaluate.analytic import AnalyticEvaluator
            return AnalyticEvaluator(Problem(workload=workload, m=m, n=n, k=k, world_size=world_size))
        from cuco.evaluate import Evaluator
        from cuco.runtime import WorkerGroup
        from cuco.workloads import get
        return Evaluator(get(workload)(m, n, k, world_size),
                         group=WorkerGroup(world_size, nvshmem=True).start())
    return make
