"""Seconds per 1000 dry-run evaluations of each proposer -> bench/results/proposer_speed.json.

    python bench/proposer_speed.py                  # 1000 evaluations each (about a minute)
    python bench/proposer_speed.py --budget 200     # quicker; rows still say seconds per 1000

Each proposer drives an ``EvolutionAgent`` (4 islands, the defaults of ``cuco search``)
against the analytic model (no GPU) into a fresh SQLite file, so a row's time is the whole
search as a user runs it: proposals, the model's scores and the database writes.

- ``offline`` and ``tpe`` search GEMM+AllReduce 8192^3 on 2 ranks in the GPU space widened
  (tiles 64/128/256, stages 3-6, raster groups 1/4/8/16, comm warps 0-3: 1224 valid points),
  since the default space has 444 points, fewer than the 1000 evaluations asked for.
- ``llm-recorded``: the LLM proposer with a recorded client (the replies the tests use: one
  SEARCH/REPLACE edit of the side-stream AllReduce block, one refusal), side-stream space;
  it measures cuco's side of an LLM search (prompt, render, edit checks), not a model.

``seconds_per_1000 = seconds / evaluations * 1000``; ``evaluations`` is what the run did
(a row that stopped early says why under ``stopped``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cuco import CandidateDB, GemmProblem, results
from cuco.agents import EvolutionAgent, OfflineProposer, TPEProposer
from cuco.agents.api import gpu_space
from cuco.agents.llm_proposer import LLMProposer
from cuco.design import DesignSpace
from cuco.errors import run_script
from cuco.evaluate.analytic import AnalyticEvaluator
from cuco.kernels.tp import render_tp
from cuco.llm import RecordedClient

PROBLEM = GemmProblem(workload="gemm_allreduce", m=8192, n=8192, k=8192, world_size=2)
LINE = "const uint4 v = reduce_peers(a, p_off, byte);"
EDIT = (f"<<<<<<< SEARCH\n      {LINE}\n=======\n      {LINE}  // tuned\n>>>>>>> REPLACE")


def wide_space() -> DesignSpace:
    """The GPU space of PROBLEM with more tunables (1224 valid points)."""
    base = gpu_space(PROBLEM)
    choices = dict(base.choices)
    choices.update(tile_m=[64, 128, 256], tile_n=[64, 128, 256], stages=[3, 4, 5, 6],
                   raster_group=[1, 4, 8, 16], comm_warps=[0, 1, 2, 3])
    return DesignSpace(PROBLEM, rules=base.rules, **choices)


def timed(name: str, space: DesignSpace, make_proposer, budget: int, folder: Path) -> dict:
    """One search of ``budget`` evaluations with the proposer ``make_proposer(agent)`` gives."""
    db = CandidateDB(folder / f"{name}.db")
    t0 = time.perf_counter()
    agent = EvolutionAgent(AnalyticEvaluator(PROBLEM), db, space=space, islands=4,
                           budget=budget, seed=0)
    agent.proposer = make_proposer(agent)
    res = agent.run()
    seconds = time.perf_counter() - t0
    per_gen = [h["elapsed_s"] for h in res.history]
    gaps = [b - a for a, b in zip(per_gen, per_gen[1:])]
    half = len(gaps) // 2
    return {"case": PROBLEM.label, "variant": name, "proposer": name,
            "evaluations": res.evaluations, "seconds": round(seconds, 2),
            "seconds_per_1000": round(seconds / max(res.evaluations, 1) * 1000, 2),
            "space_points": space.size, "stopped": res.stopped,
            # flat cost: a generation's seconds in the first and second half of the run
            "generation_s_first_half": round(sum(gaps[:half]) / max(half, 1), 4),
            "generation_s_second_half": round(sum(gaps[half:]) / max(len(gaps) - half, 1), 4),
            "best_model_speedup": round(res.best.score, 4) if res.best else None}


def cpu_label() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU: {results.cpu_model()}, {cores} cores"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=1000, help="evaluations per proposer")
    ap.add_argument("--out-dir", type=Path, default=results.RESULTS_DIR)
    args = ap.parse_args()
    side = gpu_space(PROBLEM, ("side_stream",))
    client = RecordedClient([{"text": EDIT, "prompt_tokens": 2000, "completion_tokens": 100,
                              "model": "gpt-4o"}, {"text": "I cannot help", "model": "gpt-4o"}])
    source = lambda d: render_tp(PROBLEM, d)[0].source  # noqa: E731
    runs = [("offline", wide_space, lambda agent: OfflineProposer(agent.space)),
            ("tpe", wide_space, lambda agent: TPEProposer(agent.space, seed=0)),
            ("llm-recorded", lambda: side, lambda agent: LLMProposer(
                client, agent.space, source, meta_summary=agent.meta_summary))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cuco-proposer-speed-") as tmp:
        for name, space, make in runs:  # a space of its own each: none inherits a listed grid
            row = timed(name, space(), make, args.budget, Path(tmp))
            print(f"{name}: {row['evaluations']} evaluations in {row['seconds']} s "
                  f"({row['seconds_per_1000']} s per 1000; stopped by {row['stopped']})", flush=True)
            rows.append(row)
    path = results.write("proposer_speed", rows, device=cpu_label(), world_size=PROBLEM.world_size,
                         emulated=False, out_dir=args.out_dir,
                         extra={"commit": results.current_commit(Path(__file__).parent), "dry_run": True,
                                "unit": "seconds per 1000 dry-run evaluations (analytic model)"})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
