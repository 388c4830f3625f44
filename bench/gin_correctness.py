"""The GIN kernels checked on the emulated GIN, in an emulated world on one GPU
-> bench/results/gin_correctness.json.

    python bench/gin_correctness.py                 # W = 2 and 4, every GIN family and issuer
    python bench/gin_correctness.py --worlds 2 --issuers cta

NCCL's own GIN cannot run on the machines lent here (it needs GDRCopy and an RDMA network:
docs/gin-on-one-host.md). So the GIN templates run on cuco's emulated GIN
(``cuco/gin.cuh``), whose proxy completes puts late and out of order, as GIN allows. Every
TP family's side-stream GIN kernel and the MoE layer's GIN kernels (dispatch, expert GEMMs,
combine), for each issuer, go through the real evaluator (static checks, compile, small and
full checks on fresh seeds, the timing job whose every call is verified); the planted
kernels that break GIN's rules (a source reused before ``flush``, received data read before
its signal; TP AllReduce and MoE) must be judged wrong. Rows carry ``gin: emulated`` and no
speedup: NCCL's GIN transport itself is not exercised, and emulated times mean nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from cuco import CandidateDB, results
from cuco.benchmarks import gin
from cuco.errors import run_script
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate, StageTimeouts
from cuco.runtime import WorkerGroup
from cuco.workloads.base import for_problem


def _row(kind: str, family: str, world: int, d, r, expect_ok: bool) -> dict:
    extra = r.extra or {}
    return {"kind": kind, "workload": family, "world_size": world, "issuer": d.issuer.value,
            "variant": d.full_name, "status": r.status, "stage": r.stage_reached,
            "all_correct": r.status == "ok",
            "as_expected": (r.status == "ok") == expect_ok,
            "gin": extra.get("gin"),  # what the verdict says (an ok one must say emulated)
            "emulated": True, "calls_verified": extra.get("calls_verified"),
            "seconds": extra.get("seconds"),
            "error": (r.error or "").splitlines()[0][:300] if r.error else None}


def run_world(world: int, issuers: tuple[str, ...], plants: bool, db: CandidateDB) -> tuple[list[dict], str]:
    rows = []
    timeouts = StageTimeouts(small=90, full=180, timing=240)
    planted = {name: make(world) for name, make in gin.PLANTS.items()} if plants else {}
    with WorkerGroup(world, emulate=True) as group:
        for family in gin.FAMILIES:
            wl = for_problem(gin.problem(family, world))
            ev = Evaluator(wl, group=group, db=db, timing_iters=5, timeouts=timeouts)
            cands = [Candidate(gin.directives(i)) for i in issuers]
            kinds = ["kernel"] * len(cands)
            for name, (problem, d, src) in planted.items():
                if problem.workload == family:
                    cands.append(Candidate(d, src))
                    kinds.append(f"plant:{name}")
            t0 = time.perf_counter()
            for kind, c, r in zip(kinds, cands, ev.evaluate_many(cands)):
                row = _row(kind, family, world, c.directives, r, expect_ok=kind == "kernel")
                rows.append(row)
                print(f"W={world} {family:<19} {kind:<44} {c.directives.issuer.value:<6} {r.status:<8} "
                      f"{r.stage_reached:<8} {'ok' if row['as_expected'] else 'UNEXPECTED'} "
                      f"{(r.error or '')[:70]}", flush=True)
            print(f"  {family}: {len(cands)} candidates in {time.perf_counter() - t0:.0f} s", flush=True)
        device = group.infos[0].get("device_name", "?")
    return rows, device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4", help="world sizes to emulate, comma-separated")
    ap.add_argument("--issuers", default=",".join(gin.ISSUERS), help="issuers, comma-separated")
    ap.add_argument("--out-dir", default=str(results.RESULTS_DIR), help="where the JSON goes")
    ap.add_argument("--name", default="gin_correctness", help="result file name (no .json)")
    args = ap.parse_args()
    issuers = tuple(i for i in args.issuers.split(",") if i)
    db = CandidateDB(tempfile.mkdtemp() + "/gin.db")
    rows, device, t0 = [], "?", time.perf_counter()
    for world in (int(w) for w in args.worlds.split(",")):
        got, device = run_world(world, issuers, plants=True, db=db)
        rows += got
    kernels = [r for r in rows if r["kind"] == "kernel"]
    planted = [r for r in rows if r["kind"] != "kernel"]
    good = sum(r["as_expected"] for r in rows)
    path = results.write(args.name, rows, device=f"1 x {device}", world_size=max(r["world_size"] for r in rows),
                         emulated=True, out_dir=args.out_dir,
                         extra={"worlds": args.worlds, "gin": "emulated",
                                "kernels_correct": sum(r["all_correct"] for r in kernels),
                                "kernels": len(kernels),
                                "plants_caught": sum(not r["all_correct"] for r in planted),
                                "plants": len(planted),
                                "all_as_expected": good == len(rows),
                                "seconds": round(time.perf_counter() - t0, 1),
                                "note": "the emulated GIN (cuco/gin.cuh), not NCCL's GIN transport; "
                                        "correctness only: no row has a speedup"})
    print(f"{sum(r['all_correct'] for r in kernels)}/{len(kernels)} GIN kernels correct, "
          f"{sum(not r['all_correct'] for r in planted)}/{len(planted)} plants caught -> {path}")


if __name__ == "__main__":
    run_script(main)
