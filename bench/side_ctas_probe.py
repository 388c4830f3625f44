"""Which side-stream communication grids an emulated world can run (diagnosis, #35).

    CUCO_EMULATE=4 python bench/side_ctas_probe.py --ctas 8,16,32

Evaluates one side-stream GEMM+AllReduce point per ``comm_ctas`` value in an emulated world
(W ranks under one MPS daemon) with short stage limits, and prints each verdict and its
seconds: a grid whose W copies, spinning, leave the GEMMs too few SMs shows as ``hang``.
Correctness only; no time here is a speedup.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cuco import CandidateDB, Directives
from cuco.evaluate import Evaluator
from cuco.evaluate.evaluator import StageTimeouts
from cuco.runtime import WorkerGroup
from cuco.workloads import GemmAllReduce


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctas", default="8,16,32")
    ap.add_argument("--shape", default="2048,4096,4096", help="m,n,k")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds a stage may take")
    a = ap.parse_args()
    world = int(os.environ.get("CUCO_EMULATE", "2"))
    m, n, k = (int(v) for v in a.shape.split(","))
    db = CandidateDB(Path(tempfile.mkdtemp()) / "c.db")
    rows = []
    with WorkerGroup(world, emulate=True) as group:
        print("sms per rank:", [i.get("sms") for i in group.infos], flush=True)
        for ctas in (int(c) for c in a.ctas.split(",")):
            d = Directives(backend="lsa", placement="side_stream", sync_scope="chunk", comm_ctas=ctas,
                           chunk_bytes=4 << 20)
            wl = GemmAllReduce(m=m, n=n, k=k, world_size=world)
            ev = Evaluator(wl, group=group, db=db, timing_iters=5, peers=False,
                           timeouts=StageTimeouts(small=a.limit, full=a.limit, timing=a.limit))
            t0 = time.perf_counter()
            r = ev.evaluate(d)
            rows.append((ctas, r.status, r.stage_reached, time.perf_counter() - t0))
            print(f"comm_ctas={ctas:<3} {r.status:<6} {r.stage_reached:<8} {rows[-1][3]:6.1f}s "
                  f"{(r.error or '').splitlines()[0][:100] if r.error else ''}", flush=True)
    pct = os.environ.get("CUCO_MPS_THREAD_PERCENTAGE", "default")
    print(f"W={world} MPS share {pct}: " + "  ".join(f"{c}:{s}" for c, s, _, _ in rows))


if __name__ == "__main__":
    main()
