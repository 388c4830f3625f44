"""One GIN side-stream call at a time in an emulated world, with the emulated GIN's state read
back when a call does not finish: where a GIN kernel waits (diagnosis, not evidence).

    python bench/gin_probe.py [--world 2] [--calls 3] [--wait 8]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from cuco.benchmarks import gin
from cuco.design import Directives
from cuco.errors import run_script
from cuco.kernels import Compiler
from cuco.runtime import WorkerGroup
from cuco.workloads.base import for_problem


def _u64(ptr: int, n: int, stream):
    import cupy
    mem = cupy.cuda.UnownedMemory(ptr, n * 8, None)
    return cupy.ndarray((n,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0)).get(stream=stream).tolist()


@dataclass
class GinProbe:
    family: str
    directives: str
    cubin: str
    calls: int
    wait_s: float

    def __call__(self, ctx) -> dict:
        import cupy
        from cuco.runtime import dtypes
        from cuco.runtime.arena import prepare_arenas
        from cuco.evaluate.programs import input_sets
        wl = for_problem(gin.problem(self.family, ctx.world_size))
        d = Directives.from_json(self.directives)
        s = ctx.stream
        side = cupy.cuda.Stream(non_blocking=True)
        out_log = []
        with s:
            _, atol_f = wl.tolerance()
            st = input_sets(ctx, wl, type(wl), 11, atol_f)[0]
            layout = wl.layout()
            arena = prepare_arenas(ctx, layout, {"gin"}, 5)["gin"]
            out = cupy.empty(wl.output_elems(), dtype=dtypes.STORAGE[wl.dtype])
            runner = wl.runner(ctx, d, self.cubin, arena, st.inputs, out)
            s.synchronize()
            for call in range(self.calls):
                t0 = time.perf_counter()
                runner()
                ev = cupy.cuda.Event()
                ev.record(s)
                while not ev.done and time.perf_counter() - t0 < self.wait_s:
                    time.sleep(0.01)
                g = ctx.gin
                state = {"call": call, "done": ev.done, "s": round(time.perf_counter() - t0, 3),
                         "ctl": g.ctl.get(stream=side).tolist(),
                         "issued": g.issued[:12].get(stream=side).tolist(),
                         "completed": g.completed[:12].get(stream=side).tolist(),
                         "signals": _u64(g.signals.ptr, 24, side),
                         "shadows": g.shadows[:24].get(stream=side).tolist(),
                         "flags": _u64(arena.ptr + layout.flags, 12, side)}
                out_log.append(state)
                if not ev.done:
                    break
        return {"rank": ctx.rank, "log": out_log}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--wait", type=float, default=8.0)
    ap.add_argument("--issuer", default="cta")
    ap.add_argument("--family", default=",".join(gin.FAMILIES))
    args = ap.parse_args()
    comp = Compiler()
    t0 = time.perf_counter()
    built = {}
    for family in args.family.split(","):
        wl = for_problem(gin.problem(family, args.world))
        src = wl.render(gin.directives(args.issuer))
        built[family] = comp.compile(src.source, needs=src.needs, name=src.name)
        print(f"built {family} at {time.perf_counter() - t0:.0f} s", flush=True)
    with WorkerGroup(args.world, emulate=True) as group:
        print(f"group up at {time.perf_counter() - t0:.0f} s", flush=True)
        for family in built:
            d = gin.directives(args.issuer)
            res = group.run(GinProbe(family, d.to_json(), str(built[family].path), args.calls, args.wait),
                            timeout=args.wait * args.calls + 60)
            print(f"== {family}: {res.status} {res.errors if not res.ok else ''}"[:2000], flush=True)
            for r in res.results or []:
                if r:
                    for line in r["log"]:
                        print(f"  rank {r['rank']}: {json.dumps(line)}", flush=True)
            if not res.ok:
                break


if __name__ == "__main__":
    run_script(main)
