"""The 1 % rule of separate compilation (issue #39), on the GEMM alone: every in-kernel point's
time as built by separate compilation (the frozen unit and the candidate's unit linked by
nvJitLink) against the same point built whole-program (``CUCO_WHOLE_PROGRAM=1``), from two
runs of ``bench/gemm_mainloop.py`` on one machine -> bench/results/gemm_link_vs_whole.json.

    python bench/link_vs_whole.py SEPARATE.json WHOLE.json [--name gemm_link_vs_whole]

No GPU: it reads the two result files (each names its commit and device; both must name the
same device). ``ratio = separate_ms / whole_ms`` per (case, point) and for each case's best
point; the libraries' own run-to-run ratio between the two files is the noise floor beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from cuco import results
from cuco.errors import run_script

#: the issue's bound: the linked kernel within 1 % of the whole-program build
LIMIT = 1.01


def compare(sep: dict, whole: dict) -> tuple[list[dict], dict]:
    """Rows per (case, point) timed in both files, and the summary."""
    by_case = {r["case"]: r for r in whole["rows"]}
    rows, best, noise = [], [], []
    for r in sep["rows"]:
        w = by_case.get(r["case"])
        if w is None or not r.get("cuco") or not w.get("cuco"):
            continue
        for point, ms in r["cuco"].items():
            if point in w["cuco"]:
                rows.append({"case": r["case"], "point": point, "separate_ms": ms,
                             "whole_ms": w["cuco"][point], "ratio": round(ms / w["cuco"][point], 4)})
        if r.get("ms") and w.get("ms"):
            best.append(round(r["ms"] / w["ms"], 4))
        if r.get("baseline_ms") and w.get("baseline_ms"):
            noise.append(round(r["baseline_ms"] / w["baseline_ms"], 4))
    ratios = [x["ratio"] for x in rows]
    summary = {"points": len(rows), "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
               "best_per_case_min": min(best, default=None), "best_per_case_max": max(best, default=None),
               "library_noise": [min(noise, default=None), max(noise, default=None)],
               "limit": LIMIT,
               "met": bool(best) and max(best) <= LIMIT and statistics.median(ratios) <= LIMIT}
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("separate", help="bench/gemm_mainloop.py's file, separate compilation")
    ap.add_argument("whole", help="the same with CUCO_WHOLE_PROGRAM=1, same machine")
    ap.add_argument("--name", default="gemm_link_vs_whole")
    ap.add_argument("--out-dir", default="bench/results")
    a = ap.parse_args(argv)
    sep, whole = results.load(a.separate), results.load(a.whole)
    if sep["device"] != whole["device"]:
        print(f"the two files name different devices ({sep['device']!r}, {whole['device']!r}): "
              "time both builds on one machine", file=sys.stderr)
        return 2
    rows, summary = compare(sep, whole)
    path = results.write(a.name, rows, device=sep["device"], world_size=1, emulated=False,
                         commit=sep["commit"], out_dir=a.out_dir,
                         extra={"separate": {"command": sep["command"], "commit": sep["commit"],
                                             "created": sep["created"]},
                                "whole_program": {"command": whole["command"], "commit": whole["commit"],
                                                  "created": whole["created"]},
                                "summary": summary})
    print(f"{summary['points']} points: separate / whole median {summary['median_ratio']}, best per "
          f"case {summary['best_per_case_min']}..{summary['best_per_case_max']} (libraries between "
          f"the runs {summary['library_noise'][0]}..{summary['library_noise'][1]}); within "
          f"{LIMIT:.2f}: {summary['met']}; wrote {path}")
    return 0


if __name__ == "__main__":
    run_script(main)
