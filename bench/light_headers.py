"""Build seconds of side-stream candidates with cuco's light library headers against the
whole ones -> bench/results/light_headers.json (issue #39; no GPU needed).

    python bench/light_headers.py                   # 6 candidates a backend, interleaved A/B
    python bench/light_headers.py --candidates 10 --jobs 16

The builds are :func:`cuco.benchmarks.light_headers.build_both`'s. Each candidate is a distinct side-stream point of GEMM+AllReduce 8192^3 (the
evaluator bench's workload), built from an empty cache both ways, the order of the two
alternating from one candidate to the next; ``--jobs`` builds run at once (a search's
batch compiles on every core). Every pair's device code is compared: the headers change
build time only.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuco import results
from cuco.agents.api import gpu_space
from cuco.errors import run_script
from cuco.benchmarks.light_headers import build_both
from cuco.workloads import get


def _points(per_backend: int, seed: int):
    wl = get("gemm_allreduce")(m=8192, n=8192, k=8192, world_size=1)
    points = [d for d in gpu_space(wl.problem).enumerate() if not d.placement.in_kernel]
    random.Random(seed).shuffle(points)
    picked = []
    for backend in ("lsa", "nvshmem"):
        picked += [d for d in points if d.backend.value == backend][:per_backend]
    return wl, picked


def _build(i: int, wl, d, root: Path, arch: str) -> dict:
    b = build_both(wl.render(d), root / str(i), arch, full_first=i % 2 == 1)
    return {"case": wl.problem.label, "variant": d.full_name, "backend": d.backend.value,
            "light_s": round(b.light_s, 3), "full_s": round(b.full_s, 3),
            "same_device_code": b.same_device_code}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=6, help="per backend (lsa, nvshmem)")
    ap.add_argument("--jobs", type=int, default=1, help="builds at once")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--name", default="light_headers")
    a = ap.parse_args(argv)
    wl, points = _points(a.candidates, a.seed)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        rows = list(pool.map(lambda item: _build(item[0], wl, item[1], Path(tmp), a.arch), enumerate(points)))
    summary = {}
    for backend in ("lsa", "nvshmem"):
        mine = [r for r in rows if r["backend"] == backend]
        light, full = statistics.median(r["light_s"] for r in mine), statistics.median(r["full_s"] for r in mine)
        summary[backend] = {"median_light_s": light, "median_full_s": full, "speedup": round(full / light, 3)}
        print(f"{backend:8} light {light:6.2f} s   whole headers {full:6.2f} s   {full / light:5.2f}x")
    same = all(r["same_device_code"] for r in rows)
    cpu = f"CPU only: {os.cpu_count()} cores"
    path = results.write(a.name, rows, device=cpu, world_size=1, emulated=False, out_dir=a.out_dir,
                         extra={"jobs": a.jobs, "arch": a.arch, "per_backend": summary,
                                "all_same_device_code": same,
                                "load_average": list(os.getloadavg())})
    print(f"same device code in every pair: {same}\nwrote {path}")
    return 0 if same else 1


if __name__ == "__main__":
    run_script(main)
