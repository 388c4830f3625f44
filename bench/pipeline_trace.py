"""Where a pipeline workload's call stops: every program of one case of bench/pipelines.py
alone, each compute-stream kernel of a fused call waited for (with a time limit) before the
next is launched, then each fused call's output compared with the reference.

    python bench/pipeline_trace.py --only moe [--case 0] [--small] [--variants 0,2] [--limit 20]

Each rank appends one line per step to ``$OUT/trace_r<rank>.txt`` (flushed at once, so a hang
leaves the last step that finished), and the script prints both ranks' lines. A step that does
not finish within ``--limit`` seconds is reported as ``HUNG`` and the rank stops there. A
diagnostic, not a benchmark: it times nothing and writes no result file. (On 2 x H200 it found
the MoE combine waiting for flag slots no rank raised: bench/logs/moe_trace_w2_0e67cfc.log.)
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cuco.errors import run_script

OUT = Path(os.environ.get("OUT", "/tmp"))


class Hung(Exception):
    pass


class Waited:
    """A grouped GEMM that waits for its launch to finish."""

    def __init__(self, gg, after):
        self.gg, self.after = gg, after

    def table_ptrs(self):
        return self.gg.table_ptrs()

    def __call__(self, p, *a):
        self.gg(p, *a)
        self.after(a)


@dataclass
class TraceJob:
    wl: object
    variants: list  # (Directives, cubin path)
    limit: float
    programs: bool = True  # the host programs and both halves too

    def __call__(self, ctx):
        import cupy
        from cuco.runtime import dtypes
        from cuco.runtime.arena import prepare_arenas
        path = OUT / f"trace_r{ctx.rank}.txt"
        log = path.open("a")
        st = ctx.stream

        def note(msg: str) -> None:
            log.write(f"{time.strftime('%H:%M:%S')} r{ctx.rank} {msg}\n")
            log.flush()
            os.fsync(log.fileno())

        def wait(stream, what: str) -> None:
            t0 = time.time()
            while not stream.done:
                if time.time() - t0 > self.limit:
                    note(f"HUNG after {what}")
                    raise Hung(what)
                time.sleep(0.0005)
            note(f"done {what} ({1e3 * (time.time() - t0):.2f} ms)")

        wl = self.wl
        try:
            inputs = wl.make_inputs(ctx, 5)
            ref = wl.reference(ctx, inputs)
            wait(st, "inputs and reference")
            for d, cubin in self.variants:
                name = wl.kernel_name(d)
                arena = prepare_arenas(ctx, wl.layout(), {d.backend.value}, 17)[d.backend.value]
                out = dtypes.empty(wl.output_elems(), wl.dtype)
                out.fill(0x7FC1)
                run = wl.runner(ctx, d, cubin, arena, inputs, out)
                note(f"runner {name}")
                cs = getattr(run, "comm_stream", st)
                for k, f in list(run.f.items()):
                    def traced(grid, block, args, stream=None, _f=f, _k=k):
                        _f(grid, block, args, stream=stream)
                        if stream is cs:
                            note(f"launched {_k} on the side stream")
                        else:
                            wait(stream, _k)
                    run.f[k] = traced
                for g in ("gu", "dn"):  # MoE's grouped GEMMs
                    if hasattr(run, g):
                        setattr(run, g, Waited(getattr(run, g), lambda a, _g=g: wait(st, f"grouped GEMM {_g} {a}")))
                for call in range(2):
                    run()
                    wait(cs, f"call {call}: side stream")
                    wait(st, f"call {call}: compute stream")
                    note(f"call {call}: {wl.compare(getattr(run, 'output', out), ref)}")
            if not self.programs:
                return "finished"
            host = {"host_sequence": wl.host_sequence(ctx, inputs, dtypes.empty(wl.output_elems(), wl.dtype))}
            host.update({k: v[0] for k, v in wl.baselines(ctx, inputs).items()})
            host["compute_only"] = wl.compute_only(ctx, inputs)
            host["comm_only"] = wl.comm_only(ctx, inputs)
            wait(st, "host programs bound")
            for k, fn in host.items():
                fn()
                wait(st, k)
        except Hung as exc:
            return f"hung after {exc}"
        finally:
            log.close()
        return "finished"


def main(argv: list[str] | None = None) -> int:
    import importlib.util
    from cuco.kernels import Compiler
    from cuco.runtime import WorkerGroup
    from cuco.benchmarks.pipelines import HEAP_BYTES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", required=True, choices=("moe", "kv_transfer", "cp_attention"))
    ap.add_argument("--case", type=int, default=0, help="index into bench/pipelines.py's cases")
    ap.add_argument("--small", action="store_true", help="bench/pipelines.py's small cases")
    ap.add_argument("--variants", default="0", help="indices into the case's grid")
    ap.add_argument("--no-programs", action="store_true", help="fused variants only")
    ap.add_argument("--limit", type=float, default=20.0)
    args = ap.parse_args(argv)
    spec = importlib.util.spec_from_file_location("pipelines_bench", Path(__file__).with_name("pipelines.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    wl = bench.configs(2, args.small)[args.only][args.case]
    grid = wl.grid()
    variants = []
    for i in (int(v) for v in args.variants.split(",")):
        s = wl.render(grid[i])
        variants.append((grid[i], str(Compiler().compile(s.source, needs=s.needs, name=s.name).path)))
    for r in range(2):
        (OUT / f"trace_r{r}.txt").unlink(missing_ok=True)
    group = WorkerGroup(2, nvshmem=True, env={"NVSHMEM_SYMMETRIC_SIZE": str(HEAP_BYTES)})
    group.start()
    try:
        res = group.run(TraceJob(wl, variants, args.limit, not args.no_programs),
                        timeout=30 * args.limit + 180)
        print(res.status, res.results if res.ok else res.error_text()[-3000:])
    finally:
        group.close()
        for r in range(2):
            p = OUT / f"trace_r{r}.txt"
            print(p.read_text() if p.exists() else f"(no trace of rank {r})")
    return 0


if __name__ == "__main__":
    run_script(main)
