"""Every multi-rank path checked in an emulated world on one GPU -> bench/results/emulated_world.json.

    python bench/emulated_world.py                      # W = 2 and 4, all six workloads
    python bench/emulated_world.py --worlds 2 --only moe,kv_transfer

For each world size W, one worker group puts W ranks on GPU 0 under MPS
(:mod:`cuco.runtime.emulated`). For each workload at its small shape for W, and each
(placement, backend) pair its design space offers, the space's default point of that pair
goes through the real evaluator (static checks, compile, small and full checks on fresh
seeds, the timing job whose every call is verified). A row says whether every check passed
(``all_correct``), how many calls were verified, and the seconds it took. Emulated timings
mean nothing (the ranks share SMs and HBM): no row carries a speedup. A pair that cannot
run here is a row with ``refused`` and the reason.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from cuco import CandidateDB, make_problem, results
from cuco.design import DesignSpace
from cuco.errors import run_script
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import StageTimeouts
from cuco.runtime import WorkerGroup
from cuco.workloads.base import for_problem

WORKLOADS = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm", "moe", "kv_transfer",
             "cp_attention")
#: The GEMM families' shape (M x K x N, global): every placement tiles it at W = 2 and 4.
TP_SHAPE = "1024x1024x2048"


def _problem(name: str, world: int):
    if name in WORKLOADS[:3]:
        return make_problem(name, TP_SHAPE, world_size=world)
    return for_problem(make_problem(name, None, world_size=world)).small_problem()


def _pairs(wl) -> list[tuple[str, str]]:
    return sorted({(d.placement.value, d.backend.value) for d in wl.space().enumerate()})


def _point(wl, placement: str, backend: str):
    """The most conservative point the workload's own space has for the pair (its rules: a
    plain ``DesignSpace`` knows none of the placement's)."""
    space = wl.space([placement])
    return DesignSpace(wl.problem, rules=space.rules, **{**space.choices, "backend": [backend]}).default()


def run_world(world: int, names: list[str], db: CandidateDB) -> tuple[list[dict], list[dict]]:
    rows = []
    with WorkerGroup(world, emulate=True, nvshmem=True,
                     env={"NVSHMEM_SYMMETRIC_SIZE": str(1 << 30)}) as group:
        for name in names:
            problem = _problem(name, world)
            wl = for_problem(problem)
            ev = Evaluator(wl, group=group, db=db, timing_iters=5,
                           timeouts=StageTimeouts(small=90, full=180, timing=240))
            pairs = _pairs(wl)
            points = [_point(wl, p, b) for p, b in pairs]
            t0 = time.perf_counter()
            verdicts = ev.evaluate_many(points)
            for (placement, backend), d, r in zip(pairs, points, verdicts):
                extra = r.extra or {}
                rows.append({
                    "case": problem.label, "workload": name, "placement": placement,
                    "backend": backend, "world_size": world, "variant": d.full_name,
                    "status": r.status, "stage": r.stage_reached,
                    "all_correct": r.status == "ok",
                    "calls_verified": extra.get("calls_verified"),
                    "emulated": bool(extra.get("emulated")),
                    "seconds": extra.get("seconds"),
                    "error": (r.error or "").splitlines()[0][:300] if r.error else None,
                })
                print(f"W={world} {name:<19} {placement:<15} {backend:<8} {r.status:<8} "
                      f"{r.stage_reached:<8} {(r.error or '')[:80]}", flush=True)
            print(f"  {name}: {len(pairs)} pairs in {time.perf_counter() - t0:.0f} s", flush=True)
        infos = group.infos
    return rows, infos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4", help="world sizes to emulate, comma-separated")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    ap.add_argument("--out-dir", default=str(results.RESULTS_DIR), help="where the JSON goes")
    ap.add_argument("--name", default="emulated_world", help="result file name (no .json)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    db = CandidateDB(tempfile.mkdtemp() + "/emulated.db")
    rows, device, t0 = [], "1 x GPU", time.perf_counter()
    for world in (int(w) for w in args.worlds.split(",")):
        got, infos = run_world(world, names, db)
        rows += got
        device = f"1 x {infos[0].get('device_name', '?')} ({world} ranks under MPS)"
    ok = sum(r["all_correct"] for r in rows)
    path = results.write(args.name, rows, device=device.split(" (")[0], world_size=max(
        r["world_size"] for r in rows), emulated=True, out_dir=args.out_dir,
        extra={"worlds": args.worlds,
               "all_correct": ok == len(rows), "rows_correct": ok,
               "seconds": round(time.perf_counter() - t0, 1),
               "note": "correctness only: the ranks share one GPU, so no row has a speedup"})
    print(f"{ok}/{len(rows)} rows correct -> {path}")


if __name__ == "__main__":
    run_script(main)
