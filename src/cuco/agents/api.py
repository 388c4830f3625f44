"""One-call search API (``cuco.search``) and the GPU search space for a workload."""

from __future__ import annotations

import difflib
from typing import Any

from cuco.agents.evolution import Budget, EvolutionAgent, SearchResult
from cuco.agents.proposers import OfflineProposer, TPEProposer
from cuco.db import CandidateDB
from cuco.design import DesignSpace, Directives, Placement, Problem, check_count, check_workload
from cuco.errors import InputError
from cuco.design.tiles import chunk_sizes


PLACEMENTS = ("side_stream", "epilogue", "dedicated_ctas")
PROPOSERS = ("offline", "tpe")


def check_search(workload: str, m: int, n: int, k: int, world_size: int, *, budget: int = 1,
                 islands: int = 1, proposer: str = "offline", llm: str | None = None,
                 placements: tuple[str, ...] = PLACEMENTS, hosts: int = 1,
                 space: bool = True) -> Problem:
    """The problem of a search, or :class:`~cuco.errors.InputError` naming the argument to
    change. Every entry point (``search``, ``fastpath``, ``tune``, the CLI) calls this before
    it opens a database or starts a GPU."""
    check_workload(workload)
    check_count("world_size", world_size, "GPUs (ranks)", 2)
    problem = Problem(workload=workload, m=m, n=n, k=k, world_size=world_size)
    check_count("budget", budget, "evaluations", 100)
    check_count("islands", islands, "islands", 4)
    check_count("hosts", hosts, "cluster hosts", 2)
    if proposer not in PROPOSERS:
        close = difflib.get_close_matches(str(proposer), PROPOSERS, n=1)
        raise InputError(f"unknown proposer {proposer!r}; the proposers are {', '.join(PROPOSERS)}",
                         param="proposer", fix=close[0] if close else "offline", guess=bool(close))
    placements = tuple(placements)
    bad = [p for p in placements if p not in PLACEMENTS]
    if bad or not placements:
        raise InputError(f"placements {','.join(placements) or '(none)'}: choose among "
                         f"{', '.join(PLACEMENTS)}", param="placements", fix=",".join(PLACEMENTS))
    if llm is not None:
        from cuco.llm.base import check_llm_spec
        check_llm_spec(llm)
    if space:  # a shape no template fits is refused here, naming the dimension
        gpu_space(problem, placements).sample(0)
    return problem


def gpu_space(problem: Problem, placements: tuple[str, ...] = PLACEMENTS) -> DesignSpace:
    """The points that have a fused template, for ``problem``.

    ``side_stream``: vendor GEMM per chunk (tile fields unused, kept at 128x128x64, 4
    stages); chunk sizes of 2 to 32 chunks per rank, 8 to 64 communication CTAs.
    ``epilogue`` / ``dedicated_ctas``: the one-kernel CUTLASS templates, one output tile per
    flag, tiles 128x128 (4 stages) or 128x256 (3), row-by-row or grouped tile order, the
    epilogue on the consumers or on 3 spare producer warps, 8 or 16 communication CTAs.
    A workload whose Python ``chunk_epilogue`` runs between chunks gets ``side_stream`` only.
    """
    from cuco.kernels import tp

    if _has_chunk_epilogue(problem.workload):
        placements = tuple(p for p in placements if not Placement(p).in_kernel)
    if not placements:
        raise InputError(f"no placement has a template for {problem.workload}", param="placements",
                         fix="side_stream")
    side = sorted(chunk_sizes(problem, (2, 4, 8, 16, 32), floor_log2=15))
    in_kernel = [p for p in placements if Placement(p).in_kernel]
    tiles = sorted({128 * tn * problem.dtype_bytes for tn in (128, 256)}) if in_kernel else []
    comm = ([8, 16, 32, 64] if "side_stream" in placements else []) + ([0] if "epilogue" in placements else []) \
        + ([8, 16] if "dedicated_ctas" in placements else [])

    def templates(values, prob) -> list[str]:
        """What the templates add to the design rules: side_stream's chunk sizes and its
        unused tile fields fixed (no duplicate points); the in-kernel refusals."""
        if values["placement"].value == "side_stream":
            out = []
            if values["chunk_bytes"] not in side:
                out.append("chunk_bytes: side_stream uses 2 to 32 chunks per rank")
            if (values["tile_n"], values["stages"]) != (128, 4) or values["comm_ctas"] < 8:
                out.append("tile_n: side_stream runs a vendor GEMM; its tile fields stay 128x128x64, 4 stages")
            return out
        if values["placement"].value == "dedicated_ctas" and values["comm_ctas"] > 16:
            return ["comm_ctas: dedicated_ctas reserves 8 or 16 CTAs in this space"]
        if (values["tile_n"], values["stages"]) not in ((128, 4), (256, 3)):
            return ["stages: the in-kernel tiles are 128x128 with 4 stages or 128x256 with 3"]
        return tp.supported(prob, Directives.model_construct(**values))

    return DesignSpace(problem, rules=templates, backend=["lsa", "nvshmem"], placement=list(placements),
                       sync_scope=["chunk"], chunk_bytes=sorted({*side, *tiles}), tile_m=[128],
                       tile_n=[128, 256] if in_kernel else [128], tile_k=[64],
                       stages=[3, 4] if in_kernel else [4], comm_ctas=sorted(set(comm)),
                       issuer=["thread", "warp", "cta"],
                       raster_group=[1, 8] if in_kernel else [1], comm_warps=[0, 3] if in_kernel else [0],
                       chunk_schedule=["direct"])


def _has_chunk_epilogue(workload: str) -> bool:
    """A registered workload that adds Python work between chunks (in-kernel cannot run it)."""
    from cuco.workloads import REGISTRY
    cls = REGISTRY.get(workload)
    return cls is not None and cls.has_chunk_epilogue()


def search(workload: str, m: int, n: int, k: int, world_size: int = 2, *,
           db: str | CandidateDB = "cuco.db", budget: int = 100, islands: int = 4,
           seed: int = 0, proposer: str = "offline", dry_run: bool = False,
           resume: int | None = None, evaluator: Any = None, on_progress=None,
           llm: str | None = None, cluster: str | None = None, hosts: int = 2,
           placements: tuple[str, ...] = PLACEMENTS, **agent_kw) -> SearchResult:
    """Search fused kernels for one workload and shape; results land in ``db``.

    ``dry_run=True`` scores an analytic model instead of GPUs (no GPU needed);
    otherwise a worker group of ``world_size`` GPUs is started and closed.
    ``llm="openai:MODEL" | "anthropic:MODEL" | "compat:URL|MODEL"`` adds LLM edits of the
    kernels' EVOLVE-BLOCKs (the key comes from the environment). ``placements`` narrows
    :func:`gpu_space` (e.g. ``("side_stream",)`` where CUTLASS's Hopper kernels cannot run).
    """
    problem = check_search(workload, m, n, k, world_size, budget=budget, islands=islands,
                           proposer=proposer, llm=llm, placements=placements, hosts=hosts,
                           space="space" not in agent_kw)
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
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
    space = agent_kw.pop("space", None) or gpu_space(problem, tuple(placements))
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

    problem = check_search(workload, m, n, k, world_size, llm=llm, placements=("side_stream",))
    check_count("max_rounds", max_rounds, "rounds", 6)
    if llm is not None and not host_program:
        raise InputError("the LLM route needs the host program (host_program=...); without "
                         "--llm the template route needs none")
    store = db if isinstance(db, CandidateDB) else CandidateDB(db)
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
    # the fast path's baseline: the side-stream template (vendor GEMM, no CUTLASS needed)
    agent = FastPathAgent(evaluator, store, space=gpu_space(problem, ("side_stream",)))
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
