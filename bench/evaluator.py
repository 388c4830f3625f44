"""Evaluator throughput -> bench/results/evaluator.json (top-level ``candidates_per_min``).

    python bench/evaluator.py                       # GEMM+AllReduce 8192^3, 2 GPUs, 24 candidates
    python bench/evaluator.py --ray                 # and the same batch through the Ray backend
    python bench/evaluator.py --world-size 1 --name evaluator_w1   # one GPU (no peers)

Every candidate is a distinct directive point compiled from scratch (an empty
compile cache), then checked (small shape, two seeds at full shape) and timed
against the host-driven program in the same run. Every call of every stage is verified
(timed calls on the device, after their closing event); ``verification_overhead`` is
the share of the local batch's wall time spent verifying (checked calls in full on the
host, device counts of every other call). The batch API compiles on all
cores while the GPUs check the candidates already built. With ``--ray`` the
same candidates go through :class:`cuco.cluster.RayBackend` (one actor owning
the GPUs, its own empty compile cache), for the time per candidate of both.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from cuco import CandidateDB, results
from cuco.agents.api import gpu_space
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import Candidate
from cuco.kernels import Compiler
from cuco.runtime import WorkerGroup, visible_gpus
from cuco.workloads import get
from cuco.errors import run_script


def _candidates(problem, n: int, seed: int) -> list:
    points = list(gpu_space(problem).enumerate())
    random.Random(seed).shuffle(points)
    return points[: n + 1]  # the first warms a fresh group up and is not counted


def _summary(verdicts, seconds: float) -> dict:
    ok = [v for v in verdicts if v.status == "ok"]
    return {"candidates": len(verdicts), "scored_ok": len(ok), "seconds": round(seconds, 2),
            "seconds_per_candidate": round(seconds / len(verdicts), 3),
            "candidates_per_min": round(60 * len(verdicts) / seconds, 2),
            "statuses": {s: sum(v.status == s for v in verdicts) for s in {v.status for v in verdicts}},
            "median_gpu_stage_s": round(statistics.median(v.extra.get("seconds", 0) for v in verdicts), 3),
            "median_compile_s": round(statistics.median(v.extra.get("compile_s", 0) or 0 for v in verdicts), 3),
            "best_speedup": max((v.speedup for v in ok), default=None)}


def _make_evaluator(family, m, n, k, w, cache):
    def make():
        return Evaluator(get(family)(m, n, k, w), group=WorkerGroup(w, nvshmem=True).start(),
                         compiler=Compiler(cache_dir=cache))
    return make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="gemm_allreduce")
    ap.add_argument("--shape", default="8192x8192x8192", help="MxKxN")
    ap.add_argument("--candidates", type=int, default=24)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--name", default="evaluator", help="result file bench/results/<name>.json")
    a = ap.parse_args(argv)
    m, k, n = (int(v) for v in a.shape.split("x"))
    w = a.world_size
    if visible_gpus() < w:
        print(f"{visible_gpus()} GPU(s) visible: this benchmark needs {w}")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="cuco-evalbench-"))
    wl = get(a.family)(m, n, k, w)
    points = _candidates(wl.problem, a.candidates, a.seed)
    db = CandidateDB(workdir / "bench.db")
    make = _make_evaluator(a.family, m, n, k, w, workdir / "cache-local")
    ev = make()
    ev.db = db
    device = results.device_label(ev.group.infos)
    t0 = time.perf_counter()
    ev.evaluate(points[0])
    warm_s = time.perf_counter() - t0
    verify0 = ev.verify_s
    t0 = time.perf_counter()
    local = ev.evaluate_many([Candidate(d) for d in points[1:]])
    local_s = time.perf_counter() - t0
    verify_s = ev.verify_s - verify0
    ev.group.close()
    entries = {"local": _summary(local, local_s)}
    entries["local"]["first_candidate_s_with_warm_up"] = round(warm_s, 2)
    rows = [{"case": wl.label, "variant": d.full_name, "status": v.status, "stage": v.stage_reached,
             "ms": v.time_ms, "baseline_ms": v.baseline_ms, "bound_ms": v.bound_ms,
             "speedup": v.speedup, "overlap_eff": v.overlap_eff, "gpu_stage_s": v.extra.get("seconds"),
             "compile_s": v.extra.get("compile_s")} for d, v in zip(points[1:], local)]
    if a.ray:
        from cuco.cluster import RayBackend
        backend = RayBackend(_make_evaluator(a.family, m, n, k, w, workdir / "cache-ray"),
                             problem=wl.problem, hosts=1, actor_options={"num_gpus": w, "num_cpus": 1})
        backend.evaluate_many([Candidate(points[0])])  # the actor's warm-up, as above
        t0 = time.perf_counter()
        remote = backend.evaluate_many([Candidate(d) for d in points[1:]])
        ray_s = time.perf_counter() - t0
        backend.close()
        entries["ray"] = _summary(remote, ray_s)
        entries["ray_over_local_time_per_candidate"] = round(ray_s / local_s, 3)
    path = results.write(a.name, rows, device=device, world_size=w, out_dir=a.out_dir,
                         extra={"workload": wl.label, "fresh_compile_each": True,
                                "candidates_per_min": entries["local"]["candidates_per_min"],
                                "verification_overhead": round(verify_s / local_s, 4),
                                "verify_s": round(verify_s, 2),
                                "backends": entries})
    print(f"{'backend':8} {'cands':>5} {'ok':>3} {'s/cand':>7} {'cand/min':>8} {'gpu s':>6} {'compile s':>9}")
    for name, e in entries.items():
        if isinstance(e, dict):
            print(f"{name:8} {e['candidates']:5d} {e['scored_ok']:3d} {e['seconds_per_candidate']:7.2f} "
                  f"{e['candidates_per_min']:8.1f} {e['median_gpu_stage_s']:6.2f} {e['median_compile_s']:9.2f}")
    print(f"verification: {verify_s:.1f} s of {local_s:.1f} s ({verify_s / local_s:.1%})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
