"""The Python a job's verification does per call, on the CPU -> bench/results/schedule_overhead.json.

    python bench/schedule_overhead.py                 # GEMM+AllReduce's jobs, 8 candidates a job

For each job ``bench/evaluator.py`` runs (the small and the full check, the timing job; for
``--candidates`` side-stream candidates sharing it, as in a batch), this times the pure-Python
steps a rank takes around the GPU's: drawing the schedule (order, input sets, poison, stress;
:func:`cuco.evaluate.schedule.make_schedule`) and, after the schedule, turning the device
counts into verdicts (the tags' check, :func:`cuco.runtime.checking.untampered`, and
:func:`cuco.evaluate.verification.tally_device_counts`). No GPU: what it leaves out is the
per-call CUDA API work (launches, events, the checked calls' waits), which only a GPU run
measures (``bench/poison.py``, ``bench/evaluator.py``). Both figures are per call and per
candidate of the job, each the fastest of ``--reps`` repetitions.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy

from cuco import results
from cuco.errors import run_script
from cuco.evaluate.jobs import Case
from cuco.evaluate.schedule import N_SETS, make_schedule
from cuco.evaluate.verification import tally_device_counts
from cuco.runtime.checking import untampered
from cuco.runtime.records import ProgramRecord

TRUSTED = ("host_nccl", "host_nccl_default", "torch_fused")
EXTRAS = ["compute_only", "comm_only", "torch_gemm"]


def _job(kind: str, k: int) -> tuple[dict[str, tuple[str, ...]], list[str], dict]:
    """The verified programs (with what they share), the only-timed ones, and the schedule's
    settings of one job of ``kind`` with ``k`` candidates."""
    cands = {f"candidate{j}": ("arena:lsa",) for j in range(k)}
    job = Case.__dataclass_fields__
    timing = {"check_only": False, "warmup": job["warmup"].default, "iters": job["iters"].default,
              "n_checked": job["n_checked"].default}
    if kind == "timing":
        return {**dict.fromkeys(TRUSTED, ()), **cands}, EXTRAS, {**timing, "n_sets": N_SETS}
    check = {"check_only": True, "warmup": 0, "iters": 1, "n_checked": 0}
    return {"host_nccl": (), **cands}, [], {**check, "n_sets": N_SETS * (2 if kind == "full" else 1)}


def _time(kind: str, k: int, reps: int) -> dict:
    verified, extras, settings = _job(kind, k)
    # the fastest of the repetitions: Python time on a shared CPU is the floor plus whatever
    # else ran (a mean let one stall on a busy 2-core machine make 8 candidates look slower
    # than one)
    draws = []
    for seed in range(reps):
        t0 = time.perf_counter()
        schedule = make_schedule(verified, extras, seed=seed, world_size=1, sms=132, dtype="bf16", **settings)
        draws.append(time.perf_counter() - t0)
    draw_s = min(draws)
    n = len(schedule)
    counts, sums, tags = numpy.zeros(n, numpy.uint64), numpy.ones((n, 2)), numpy.zeros(n, numpy.uint64)
    tallies = []
    for _ in range(reps):
        t0 = time.perf_counter()
        intact = untampered(range(n), counts, sums, tags, 0x1234)
        tally_device_counts({p: ProgramRecord() for p in verified}, {}, schedule, counts, sums, intact)
        tallies.append(time.perf_counter() - t0)
    tally_s = min(tallies)
    return {"case": f"{kind}/{k}_candidates", "variant": "python", "calls": n,
            "draw_us_per_call": round(draw_s / n * 1e6, 2), "tally_us_per_call": round(tally_s / n * 1e6, 2),
            "ms_per_candidate": round((draw_s + tally_s) / k * 1e3, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=8, help="candidates sharing each job")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--name", default="schedule_overhead")
    a = ap.parse_args(argv)
    rows = [_time(kind, k, a.reps) for kind in ("small", "full", "timing") for k in sorted({1, a.candidates})]
    path = results.write(a.name, rows, device=f"CPU ({os.cpu_count()} cores)", world_size=1, emulated=False,
                         out_dir=a.out_dir, extra={"reps": a.reps})
    for r in rows:
        print(f"{r['case']:22} {r['calls']:5d} calls  draw {r['draw_us_per_call']:6.2f} us/call  "
              f"tally {r['tally_us_per_call']:6.2f} us/call  {r['ms_per_candidate']:7.3f} ms/candidate")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
