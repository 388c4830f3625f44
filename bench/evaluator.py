"""Evaluator throughput -> bench/results/evaluator.json (top-level ``candidates_per_min``,
``candidates_per_min_in_kernel``, ``candidates_per_min_side_stream``, ``compile_s_per_candidate``).

    python bench/evaluator.py                       # GEMM+AllReduce 8192^3, 2 GPUs, 24 + 24 candidates
    python bench/evaluator.py --ray                 # and the mixed batch through the Ray backend
    python bench/evaluator.py --world-size 1 --name evaluator_w1   # one GPU (no peers)
    python bench/evaluator.py --world-size 1 --kinds side_stream    # one batch only (less GPU time)

Three batches: in-kernel evolved ones (``--evolved-configs`` configurations, each the
template of one in-kernel point with one EVOLVE-BLOCK body edited per candidate, the way a
search's evolved candidates differ: every candidate a source of its own, so none is a cache
hit, while candidates of one configuration share its frozen unit under separate compilation,
issue #39; ``--warm-configs`` builds each configuration before the batch, uncounted, as a
running search has, so the batch measures the steady state), and two whose candidates are
each a distinct directive point, one per kind: in-kernel ones (``epilogue``/``dedicated_ctas``:
a CUTLASS build each, the GEMM's shape a launch argument, so the small-shape check runs
the same binary) and side-stream ones (light cubins); ``compile_s_per_candidate`` is the
median nvcc seconds of an in-kernel candidate inside its batch (all cores busy).
``--kinds`` runs only the named batches (the others' figures are then absent).
Every candidate is a directive point of a build of its own compiled from scratch (an empty
compile cache for its own source; a configuration's host part is built once; a space with
fewer builds than ``--candidates`` gives fewer candidates, said on the console), then
checked (small shape, two seeds at full shape) and timed against the host-driven
program in the same run. Every call of every stage is verified
(timed calls on the device, after their closing event); ``verification_overhead`` is
the share of the local batch's wall time spent verifying (checked calls in full on the
host, device counts of every other call). The batch API compiles on all
cores while the GPUs check the candidates already built. With ``--ray`` the
same candidates go through :class:`cuco.cluster.RayBackend` (one actor owning
the GPUs, its own empty compile cache), for the time per candidate of both.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from cuco import CandidateDB, results
from cuco.agents.api import gpu_space
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import CHECK_BATCH, TIMING_BATCH, Candidate
from cuco.kernels import Compiler, evolve
from cuco.runtime import WorkerGroup, visible_gpus
from cuco.workloads import get
from cuco.errors import run_script


def _candidates(problem, n: int, seed: int) -> dict[str, list]:
    """Up to ``n`` points of each kind (shuffled), no two of one build, and one more to warm a
    fresh group up (not counted, nor any point of its build). Points that differ only in what
    their kernels take per launch (:meth:`~cuco.design.Directives.build_point`: an in-kernel
    tile order, a side-stream chunk size) render one source, so a second would be a cache
    hit: each kind keeps one point per build, and every candidate is built from scratch."""
    points = list(gpu_space(problem).enumerate())
    random.Random(seed).shuffle(points)
    builds: dict[str, object] = {}
    for d in points:
        builds.setdefault(d.build_point().full_name, d)
    distinct = list(builds.values())
    in_kernel = [d for d in distinct if d.placement.in_kernel]
    side = [d for d in distinct if not d.placement.in_kernel]
    return {"warm_up": side[:1], "in_kernel": in_kernel, "side_stream": side[1:n + 1]}


#: the no-op each evolved candidate's first EVOLVE block gains (a tag of its own, so its
#: source, and only its source, is new: the compiler folds the statement away)
EDIT = "\n    {{ const int cuco_edit_tag = {tag}; (void)cuco_edit_tag; }}"


def _evolved(ev: Evaluator, points: list, configs: int, n: int) -> list[Candidate]:
    """``n`` candidates over ``configs`` in-kernel points: each point's template with its
    first EVOLVE block's body edited by a distinct no-op (:data:`EDIT`)."""
    out: list[Candidate] = []
    for i in range(n):
        d = points[i % configs]
        template = ev.template(ev.problem, d)[0]
        name, body = next(iter(evolve.blocks(template).items()))
        out.append(Candidate(d, evolve.splice(template, {name: EDIT.format(tag=i) + body})))
    return out


def _summary(verdicts, seconds: float) -> dict:
    ok = [v for v in verdicts if v.status == "ok"]
    return {"candidates": len(verdicts), "scored_ok": len(ok), "seconds": round(seconds, 2),
            "seconds_per_candidate": round(seconds / len(verdicts), 3),
            "candidates_per_min": round(60 * len(verdicts) / seconds, 2),
            "statuses": {s: sum(v.status == s for v in verdicts) for s in {v.status for v in verdicts}},
            "median_gpu_stage_s": round(statistics.median(v.extra.get("seconds", 0) for v in verdicts), 3),
            "median_compile_s": round(statistics.median(v.extra.get("compile_s", 0) or 0 for v in verdicts), 3),
            # where a candidate's GPU time goes: each stage's job (dispatch, set-up, calls, checks)
            "median_stage_s": {stage: round(statistics.median(v.extra.get("stage_s", {}).get(stage, 0.0)
                                                              for v in verdicts), 3)
                               for stage in ("small", "full", "timing")},
            "best_speedup": max((v.speedup for v in ok), default=None),
            # where each verdict's checks ran (the verifier process, or inline in the worker)
            "verifiers": sorted({str(v.extra.get("verifier")) for v in verdicts})}


#: The batches, in the order they run.
KINDS = ("in_kernel_evolved", "in_kernel", "side_stream")


def _make_evaluator(family, m, n, k, w, cache, timing_batch=TIMING_BATCH, check_batch=CHECK_BATCH):
    def make():
        return Evaluator(get(family)(m=m, n=n, k=k, world_size=w), group=WorkerGroup(w, nvshmem=True).start(),
                         compiler=Compiler(cache_dir=cache), timing_batch=timing_batch, check_batch=check_batch)
    return make


def _per_kind(entries: dict) -> dict:
    """The result file's top-level figures of the batches that ran."""
    keys = {"in_kernel": ("candidates_per_min_in_kernel", "compile_s_per_candidate"),
            "in_kernel_evolved": ("candidates_per_min_in_kernel_evolved", "compile_s_per_candidate_evolved"),
            "side_stream": ("candidates_per_min_side_stream", "compile_s_per_candidate_side_stream")}
    out = {}
    for kind, (per_min, compile_s) in keys.items():
        if kind in entries:
            out[per_min] = entries[kind]["candidates_per_min"]
            out[compile_s] = entries[kind]["median_compile_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="gemm_allreduce")
    ap.add_argument("--shape", default="8192x8192x8192", help="MxKxN")
    ap.add_argument("--candidates", type=int, default=24, help="per kind (in-kernel, side-stream)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evolved-configs", type=int, default=4,
                    help="in-kernel configurations the evolved batch's candidates edit (0: no such batch)")
    ap.add_argument("--warm-configs", action="store_true",
                    help="judge each evolved configuration's unedited template first (not counted), as a "
                         "search past its first candidates of each has: the batch then times steady state")
    ap.add_argument("--timing-batch", type=int, default=TIMING_BATCH,
                    help="candidates that share one timing job (the host programs and the bound are "
                         "timed once per job)")
    ap.add_argument("--check-batch", type=int, default=CHECK_BATCH,
                    help="candidates built by the time the GPUs are free that share one job per check stage")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated batches to run, of {', '.join(KINDS)}")
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--name", default="evaluator", help="result file bench/results/<name>.json")
    a = ap.parse_args(argv)
    if a.timing_batch < 1 or a.check_batch < 1:
        ap.error("--timing-batch, --check-batch: at least 1")
    kinds = [k for k in a.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--kinds: some of {', '.join(KINDS)}")
    m, k, n = (int(v) for v in a.shape.split("x"))
    w = a.world_size
    if visible_gpus() < w:
        print(f"{visible_gpus()} GPU(s) visible: this benchmark needs {w}")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="cuco-evalbench-"))
    wl = get(a.family)(m=m, n=n, k=k, world_size=w)
    batches = _candidates(wl.problem, a.candidates, a.seed)
    for kind in ("in_kernel", "side_stream"):
        if kind in kinds and len(batches[kind]) < a.candidates:
            print(f"{kind}: {len(batches[kind])} candidates, one a build: the space has no more builds")
    db = CandidateDB(workdir / "bench.db")
    make = _make_evaluator(a.family, m, n, k, w, workdir / "cache-local", a.timing_batch, a.check_batch)
    ev = make()
    ev.db = db
    device = results.device_label(ev.group.infos)
    t0 = time.perf_counter()
    ev.evaluate(batches["warm_up"][0])
    warm_s = time.perf_counter() - t0
    verify0 = ev.verify_s
    entries, rows, done, local_s = {}, [], [], 0.0
    # the evolved batch's configurations are points the directive batch does not build
    evolved = a.evolved_configs if "in_kernel_evolved" in kinds else 0
    configs = batches["in_kernel"][a.candidates:a.candidates + evolved] if evolved else []
    cands = {"in_kernel_evolved": _evolved(ev, configs, len(configs), a.candidates) if configs else [],
             "in_kernel": [Candidate(d) for d in batches["in_kernel"][:a.candidates]],
             "side_stream": [Candidate(d) for d in batches["side_stream"]]}
    if a.warm_configs and configs:  # each configuration's first build, outside the timed batch
        ev.evaluate_many([Candidate(d) for d in configs])
    for kind in [k for k, c in cands.items() if c and k in kinds]:
        t0 = time.perf_counter()
        verdicts = ev.evaluate_many(cands[kind])
        seconds = time.perf_counter() - t0
        local_s += seconds
        entries[kind] = _summary(verdicts, seconds)
        points = [c.directives for c in cands[kind]]
        done += list(zip(points, verdicts))
        rows += [{"case": wl.label, "kind": kind, "variant": d.full_name, "status": v.status,
                  "stage": v.stage_reached, "ms": v.time_ms, "baseline_ms": v.baseline_ms,
                  "bound_ms": v.bound_ms, "speedup": v.speedup, "overlap_eff": v.overlap_eff,
                  "gpu_stage_s": v.extra.get("seconds"), "compile_s": v.extra.get("compile_s")}
                 for d, v in zip(points, verdicts)]
    verify_s = ev.verify_s - verify0
    ev.group.close()
    entries["local"] = _summary([v for _, v in done], local_s)
    entries["local"]["first_candidate_s_with_warm_up"] = round(warm_s, 2)
    every = [Candidate(batches["warm_up"][0]), *(c for kind, batch in cands.items() if kind in kinds for c in batch)]
    if a.ray:
        from cuco.cluster import RayBackend
        backend = RayBackend(_make_evaluator(a.family, m, n, k, w, workdir / "cache-ray", a.timing_batch,
                                             a.check_batch),
                             problem=wl.problem, hosts=1, actor_options={"num_gpus": w, "num_cpus": 1})
        backend.evaluate_many(every[:1])  # the actor's warm-up, as above
        t0 = time.perf_counter()
        remote = backend.evaluate_many(every[1:])
        ray_s = time.perf_counter() - t0
        backend.close()
        entries["ray"] = _summary(remote, ray_s)
        entries["ray_over_local_time_per_candidate"] = round(ray_s / local_s, 3)
    path = results.write(a.name, rows, device=device, world_size=w, emulated=False, out_dir=a.out_dir,
                         extra={"workload": wl.label, "fresh_compile_each": True,
                                "candidates_per_min": entries["local"]["candidates_per_min"],
                                "kinds": kinds,
                                **_per_kind(entries),
                                **({"evolved_configs": len(configs),
                                    "evolved_configs_warmed": bool(a.warm_configs)} if configs else {}),
                                "whole_program": os.environ.get("CUCO_WHOLE_PROGRAM", "") not in ("", "0"),
                                "cpu_cores": os.cpu_count(),
                                "timing_batch": a.timing_batch,
                                "check_batch": a.check_batch,
                                "verification_overhead": round(verify_s / local_s, 4),
                                "verify_s": round(verify_s, 2),
                                "backends": entries})
    print(f"{'batch':17} {'cands':>5} {'ok':>3} {'s/cand':>7} {'cand/min':>8} {'gpu s':>6} {'compile s':>9}")
    for name, e in entries.items():
        if isinstance(e, dict):
            print(f"{name:17} {e['candidates']:5d} {e['scored_ok']:3d} {e['seconds_per_candidate']:7.2f} "
                  f"{e['candidates_per_min']:8.1f} {e['median_gpu_stage_s']:6.2f} {e['median_compile_s']:9.2f}")
    for name, e in entries.items():
        if isinstance(e, dict):
            print(f"{name:17} GPU stages (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in e["median_stage_s"].items()))
    print(f"verification: {verify_s:.1f} s of {local_s:.1f} s ({verify_s / local_s:.1%})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
