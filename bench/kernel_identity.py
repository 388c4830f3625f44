"""The machine code of kernels rendered from today's kernel layer against those of an earlier
commit, without a GPU -> bench/results/kernel_identity.json.

    python bench/kernel_identity.py --before-rev 3f9bdae
    python bench/kernel_identity.py --before-rev 3f9bdae --cases tp_fused --cache-dir ~/.cache/cuco-identity
    python bench/kernel_identity.py --before-rev 3f9bdae --cases tp_fused --only ag.epilogue.pingpong --out-dir /tmp

A refactor of the templates or of the device headers must not change a kernel: this is how
such a change is shown to keep the machine code. Each case is rendered twice with the same
arguments by today's Python: once from the kernel layer of ``--before-rev`` (its templates,
built against its own device headers: ``git archive`` of ``src/cuco/kernels``, see
:mod:`cuco.benchmarks.kernels_at`) and once from the working tree's. Each side is built by its
own commit's ``compiler.py`` over its own headers (``sm_90a``; its flags and build steps, so
a change of how kernels are built is shown not to change them too), and the two builds are
compared with :func:`cuco.kernels.compiler.device_code`: every section of the CUDA images that hold
kernels (SASS ``.text.*``, resources, launch attributes, symbols). ``tp_fused`` covers every
in-kernel family x placement x schedule x issuer x backend, comm_warps 0 and > 0, a world of
4 and the ``gemm_only`` profile build; the other groups are the shipped catalog's kernels
(:mod:`cuco.workloads.catalog`) of every other template: ``side_stream`` (every pattern x
backend, GIN included, x issuer), ``pipelines`` (KV transfer, MoE, CP attention: every
backend x issuer, the MoE grouped GEMM, the KV layer chain, the CP attention core),
``collectives`` (LSA and NVSHMEM, every dtype) and ``probes``; ``kv_modes`` adds KV transfer's
kernel-per-chunk and copy-engine renders, which the catalog leaves out. A CUTLASS build takes 90-125 s
on two shared cores (cubins 5-35 s): keep ``--cache-dir`` between runs (each side's key holds
a digest of its own headers). Exit status 1 when any pair differs.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from cuco import results
from cuco.benchmarks.kernels_at import kernels_at, rendering_from
from cuco.design import GemmProblem
from cuco.errors import run_script
from cuco.kernels import Compiler
from cuco.kernels.collectives import KernelSource
from cuco.kernels.compiler import device_code
from cuco.kernels.tp import in_kernel, render_tp

SMALL = dict(m=1024, n=1024, k=1024, world_size=2)
PP = dict(tile_n=128, stages=6, schedule="pingpong")  # the pingpong mainloop's tile
#: A case renders its kernels (one, or a catalog group's); the case's name is a kernel's own
#: name unless the group names its cases.
Render = Callable[[], list[KernelSource]]


def _tp(family: str, placement: str, backend: str, issuer: str, *, gemm_only: bool = False,
        world_size: int = 2, **kw) -> Render:
    problem = GemmProblem(workload=family, **{**SMALL, "world_size": world_size})
    d = in_kernel(placement, backend, issuer, **kw)
    return lambda: [render_tp(problem, d, gemm_only=gemm_only)[0]]


def _catalog(group: str) -> Render:
    """One group of the shipped catalog (what ``cuco kernels check`` compiles), less the
    in-kernel placements (the ``tp_fused`` group's, with more variants)."""
    def render() -> list[KernelSource]:
        from cuco.kernels import catalog
        from cuco.kernels.collectives import all_sources
        from cuco.workloads.catalog import pipeline_sources
        return {"side_stream": catalog.tp_sources, "pipelines": pipeline_sources,
                "collectives": all_sources, "probes": lambda: [catalog.probe_source()]}[group]()
    return render


def _kv(backend: str, issuer: str, comm_ctas: int = 4) -> Render:
    """KV transfer's other modes (the catalog renders its persistent one): a kernel per
    chunk (sync_scope=stream), or the copy engine (issuer copy_engine)."""
    def render() -> list[KernelSource]:
        from cuco.design import Directives
        from cuco.workloads.kv import KVTransfer
        d = Directives(backend=backend, placement="side_stream", sync_scope="stream", issuer=issuer,
                       chunk_bytes=64 << 10, comm_ctas=comm_ctas)
        return [KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256).render(d)]
    return render


AR, RS, AG = "gemm_allreduce", "gemm_reducescatter", "allgather_gemm"
CASES: dict[str, dict[str, Render]] = {
    "tp_fused": {
        "ar.epilogue.coop.cta.lsa.cw0": _tp(AR, "epilogue", "lsa", "cta"),
        "ar.epilogue.coop.warp.nvshmem.cw3.g8": _tp(AR, "epilogue", "nvshmem", "warp", comm_warps=3, raster_group=8),
        "ar.epilogue.pingpong.thread.lsa.cw2": _tp(AR, "epilogue", "lsa", "thread", comm_warps=2, **PP),
        "ar.epilogue.coop.cta.lsa.cw0.w4": _tp(AR, "epilogue", "lsa", "cta", world_size=4),
        "ar.dedicated.coop.cta.lsa.cw0": _tp(AR, "dedicated_ctas", "lsa", "cta", comm_ctas=4),
        "ar.dedicated.pingpong.warp.nvshmem.cw1": _tp(AR, "dedicated_ctas", "nvshmem", "warp", comm_ctas=4,
                                                      comm_warps=1, **PP),
        "ar.epilogue.coop.cta.lsa.cw0.gemm_only": _tp(AR, "epilogue", "lsa", "cta", gemm_only=True),
        "rs.epilogue.coop.thread.nvshmem.cw0": _tp(RS, "epilogue", "nvshmem", "thread"),
        "rs.epilogue.pingpong.cta.lsa.cw3": _tp(RS, "epilogue", "lsa", "cta", comm_warps=3, **PP),
        "rs.dedicated.coop.warp.lsa.cw2": _tp(RS, "dedicated_ctas", "lsa", "warp", comm_ctas=4, comm_warps=2),
        "rs.dedicated.coop.thread.nvshmem.cw0": _tp(RS, "dedicated_ctas", "nvshmem", "thread", comm_ctas=4),
        "rs.dedicated.pingpong.cta.lsa.cw0.gemm_only": _tp(RS, "dedicated_ctas", "lsa", "cta", comm_ctas=4,
                                                           gemm_only=True, **PP),
        "ag.epilogue.coop.cta.lsa.cw0": _tp(AG, "epilogue", "lsa", "cta"),
        "ag.epilogue.pingpong.warp.nvshmem.cw3": _tp(AG, "epilogue", "nvshmem", "warp", comm_warps=3, **PP),
        "ag.epilogue.coop.thread.lsa.cw1": _tp(AG, "epilogue", "lsa", "thread", comm_warps=1),
        "ag.dedicated.coop.thread.lsa.cw0": _tp(AG, "dedicated_ctas", "lsa", "thread", comm_ctas=4),
        "ag.dedicated.pingpong.cta.nvshmem.cw2": _tp(AG, "dedicated_ctas", "nvshmem", "cta", comm_ctas=4,
                                                     comm_warps=2, **PP),
        "ag.epilogue.coop.warp.lsa.cw3.gemm_only": _tp(AG, "epilogue", "lsa", "warp", comm_warps=3,
                                                       gemm_only=True),
    },
    **{group: {"": _catalog(group)} for group in ("side_stream", "pipelines", "collectives", "probes")},
    "kv_modes": {**{f"kv.launch.nvshmem.{i}": _kv("nvshmem", i) for i in ("thread", "warp", "cta")},
                 "kv.launch.lsa.warp": _kv("lsa", "warp"),
                 "kv.copy_engine.lsa": _kv("lsa", "copy_engine", comm_ctas=1)},
}


def rendered(cases: dict[str, Render]) -> dict[str, KernelSource]:
    """Every case's kernels by case name (a catalog group's under their own names)."""
    out: dict[str, KernelSource] = {}
    for case, render in cases.items():
        for src in render():
            out[case or src.name] = src
    return out


def progress(name: str, result) -> None:
    if not hasattr(result, "path"):
        print(f"  FAILED {name}: {result}", flush=True)
    else:
        print(f"  built {name} ({'cached' if result.cached else f'{result.seconds:.0f} s'})", flush=True)


def build(comp: Compiler, sources: list[KernelSource]) -> list:
    """``sources`` built by ``comp`` on all cores (a CompileError in place of a failed one); a
    source that two cases share is built once."""
    items = [(s.name, s.source, tuple(sorted(s.needs))) for s in sources]
    unique = list(dict.fromkeys(items))
    done = dict(zip(unique, comp.compile_many(unique, on_done=progress)))
    return [done[item] for item in items]


def compare(case: str, group: str, old: KernelSource, new: KernelSource, built_old, built_new) -> dict:
    """One row: whether the two builds' device code (every kernel section) is the same."""
    row = {"case": case, "group": group, "kernel": new.name}
    if not (hasattr(built_old, "path") and hasattr(built_new, "path")):
        return {**row, "identical": False,
                "error": str(built_old if not hasattr(built_old, "path") else built_new)[:2000]}
    a_code, b_code = device_code(built_old.path.read_bytes()), device_code(built_new.path.read_bytes())
    differ = sorted(k for k in a_code.keys() | b_code.keys() if a_code.get(k) != b_code.get(k))
    print(f"{case}: {'identical' if not differ else 'DIFFERS in ' + ', '.join(differ)} "
          f"({len(a_code)} sections{', same source' if old.source == new.source else ''})", flush=True)
    return {**row, "identical": not differ, "same_source": old.source == new.source,
            "sections": len(a_code), "text_sections": sum(".text." in k for k in a_code),
            "differing_sections": differ}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before-rev", required=True, help="commit whose kernel layer (templates and "
                    "headers) is 'before'")
    ap.add_argument("--cases", default=",".join(CASES), help=f"groups of cases: {', '.join(CASES)}")
    ap.add_argument("--only", default="", help="comma-separated parts of case names: only the cases "
                    "whose name holds one (one case at a time while a refactor is under way)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "cuco-identity"))
    ap.add_argument("--separate", action="store_true", help="build today's side by separate compilation "
                    "(frozen unit + candidate unit, linked by nvJitLink) instead of as one unit")
    ap.add_argument("--name", default="kernel_identity")
    ap.add_argument("--out-dir", default="bench/results")
    a = ap.parse_args(argv)
    groups = [g for g in a.cases.split(",") if g]
    if any(g not in CASES for g in groups):
        raise SystemExit(f"--cases: choose among {', '.join(CASES)}")
    only = [part for part in a.only.split(",") if part]
    t0 = time.perf_counter()
    with kernels_at(a.before_rev) as tree:
        with rendering_from(tree.environment()):
            before = {(g, n): s for g in groups for n, s in rendered(CASES[g]).items()}
        after = {(g, n): s for g in groups for n, s in rendered(CASES[g]).items()}
        if before.keys() != after.keys():
            raise SystemExit(f"the two sides render different cases: {sorted(before.keys() ^ after.keys())}")
        keys = [key for key in after if not only or any(part in key[1] for part in only)]
        if not keys:
            raise SystemExit(f"no case of {a.cases} holds any of {only}")
        for key in keys:  # the same name: nvcc names internal symbols after the source file
            assert (before[key].name, sorted(before[key].needs)) == (after[key].name, sorted(after[key].needs)), key
        # one side after the other: a side shares no build with the other (its headers differ)
        built_old = build(tree.compiler(arch="sm_90a", cache_dir=a.cache_dir), [before[k] for k in keys])
        # today's side as one unit (whole program) unless --separate: the separately compiled
        # build is linked by nvJitLink, whose optimiser and ptxas are another version's
        built_new = build(Compiler(arch="sm_90a", cache_dir=a.cache_dir, whole_program=not a.separate),
                          [after[k] for k in keys])
        rows = [compare(key[1], key[0], before[key], after[key], o, n)
                for key, o, n in zip(keys, built_old, built_new)]
    seconds = time.perf_counter() - t0
    n_same = sum(r["identical"] for r in rows)
    extra = {"before_rev": a.before_rev, "kernels_compared": len(rows), "kernels_identical": n_same,
             "all_identical": n_same == len(rows), "build_s": round(seconds, 1), "cores": os.cpu_count()}
    path = results.write(a.name, rows, device="CPU only (nvcc, sm_90a; no GPU)", world_size=2, emulated=False,
                         out_dir=a.out_dir, extra=extra)
    print(f"wrote {path}: {n_same}/{len(rows)} kernels identical to {a.before_rev}")
    return 0 if n_same == len(rows) else 1


if __name__ == "__main__":
    run_script(main)
