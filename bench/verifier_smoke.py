"""The verifier process end to end, quickly, with every stage timed: the first thing to run
on a GPU after changing it (no pytest).

    PYTHONPATH=src python3 bench/verifier_smoke.py                 # one rank, one GPU
    CUCO_EMULATE=2 PYTHONPATH=src python3 bench/verifier_smoke.py  # two ranks on one GPU (MPS)
    PYTHONPATH=src python3 bench/verifier_smoke.py --verifier inline   # the old way, to compare

Starts one worker group (each worker starts its verifier process), runs one honest
side-stream candidate of GEMM+ReduceScatter through ``Evaluator.evaluate``, and prints the
verdict and where the time went. Exits 1 with the traceback on any failure, 2 if the verdict
is not ``ok`` or the checks did not run where asked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verifier", default="process", choices=("process", "inline"))
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--k", type=int, default=2048)
    args = ap.parse_args()
    from cuco.runtime.emulated import requested
    world = requested() or 1
    stages: dict[str, float] = {}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        stages[name] = round(now - t, 3)
        print(f"[smoke] {name}: {stages[name]:.2f} s", flush=True)
        t = now

    group = None
    try:
        import cuco.workloads as wl
        from cuco import Directives
        from cuco.evaluate import Evaluator, StageTimeouts
        from cuco.runtime import WorkerGroup
        mark("import")
        print(f"[smoke] world {world}{' (emulated: CUCO_EMULATE)' if requested() else ''}, "
              f"verifier={args.verifier}", flush=True)
        group = WorkerGroup(world, verifier=args.verifier).start()
        mark("group start (workers + verifiers)")
        for info in group.infos:
            print(f"[smoke]   rank {info['rank']}: worker pid {info['pid']}, verifier "
                  f"{info.get('verifier')} pid {info.get('verifier_pid')}, {info.get('device_name')}", flush=True)
        ev = Evaluator(wl.GemmReduceScatter(m=args.m, n=args.n, k=args.k, world_size=world), group=group,
                       timing_iters=10, timeouts=StageTimeouts(small=180, full=240, timing=300))
        ev.warm_up()
        mark("warm-up job (host program, references handed over)")
        d = Directives(placement="side_stream", sync_scope="chunk", comm_ctas=8, chunk_bytes=256 << 10)
        r = ev.evaluate(d)
        mark("evaluate (compile, small, full, timing)")
        print(json.dumps({"status": r.status, "stage": r.stage_reached, "error": r.error,
                          "speedup": r.speedup, "time_ms": r.time_ms, "baseline_ms": r.baseline_ms,
                          "verifier": r.extra.get("verifier"), "stage_s": r.extra.get("stage_s"),
                          "verify_s": round(ev.verify_s, 3), "smoke_stages_s": stages}, indent=1, default=str))
        if r.status != "ok":
            print(f"[smoke] FAILED: verdict {r.status} at {r.stage_reached}: {r.error}", file=sys.stderr)
            return 2
        if r.extra.get("verifier") != args.verifier:
            print(f"[smoke] FAILED: checks ran '{r.extra.get('verifier')}', asked '{args.verifier}'", file=sys.stderr)
            return 2
        print("[smoke] OK", flush=True)
        return 0
    except BaseException:  # noqa: BLE001 - the lead reads this first
        traceback.print_exc()
        return 1
    finally:
        if group is not None:
            group.close()
            mark("group close")


if __name__ == "__main__":
    sys.exit(main())
