"""The machine code of kernels rendered from today's templates against those of an earlier
commit, without a GPU -> bench/results/kernel_identity.json.

    python bench/kernel_identity.py --before-rev 9f0bf34
    python bench/kernel_identity.py --before-rev 9f0bf34 --cases tp_fused --cache-dir ~/.cache/cuco-identity
    python bench/kernel_identity.py --before-rev 9f0bf34 --cases tp_fused --only ag.epilogue.pingpong --out-dir /tmp

A refactor of the templates or of the device headers must not change a kernel (issue #19
asks for ``tp_fused.cu.j2``'s arena, epoch flags and per-pattern epilogues as header
primitives: this is how such a change is shown to keep the machine code). Each case is
rendered twice with the same arguments, once from the templates as of ``--before-rev``
(read with git, rendered as cuco renders) and once from the working tree; both are built in
one ``Compiler.compile_many`` call (``sm_90a``; launchers in two pieces: host part and the
candidate's own cubin; a source that did not change is built once) and compared with
:func:`cuco.kernels.compiler.device_code`: every section of the CUDA images that hold
kernels (SASS ``.text.*``, resources, launch attributes, symbols). The ``tp_fused`` cases
cover every in-kernel family x placement x schedule x issuer x backend, comm_warps 0 and
> 0, a world of 4 and the ``gemm_only`` profile build; ``side_stream`` and ``pipelines``
cover the templates that share ``_arena.cu.j2``. Only the templates come from
``--before-rev``: both builds read the working tree's headers, so an edit inside a header
that the old templates include is not compared (new headers are). A CUTLASS build takes
90-125 s on two shared cores (side-stream cubins 5-35 s): keep ``--cache-dir`` between
runs; the cache key holds a digest of the headers, so a header edit rebuilds both sides.
Exit status 1 when any pair differs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jinja2

from cuco import results
from cuco.design import Directives, GemmProblem
from cuco.errors import run_script
from cuco.kernels import Compiler
from cuco.kernels.compiler import device_code
from cuco.kernels.tp import in_kernel, render_tp

SMALL = dict(m=1024, n=1024, k=1024, world_size=2)
render_module = importlib.import_module("cuco.kernels.render")  # the module (cuco.kernels.render is its function)
PP = dict(tile_n=128, stages=6, schedule="pingpong")  # the pingpong mainloop's tile


def _tp(family: str, placement: str, backend: str, issuer: str, *, gemm_only: bool = False,
        world_size: int = 2, **kw) -> Callable[[], tuple[str, str, tuple[str, ...]]]:
    problem = GemmProblem(workload=family, **{**SMALL, "world_size": world_size})
    d = in_kernel(placement, backend, issuer, **kw)

    def render() -> tuple[str, str, tuple[str, ...]]:
        src = render_tp(problem, d, gemm_only=gemm_only)[0]
        return src.name, src.source, tuple(sorted(src.needs))
    return render


def _side(family: str, backend: str, issuer: str) -> Callable[[], tuple[str, str, tuple[str, ...]]]:
    problem = GemmProblem(workload=family, **SMALL)
    d = Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                   chunk_bytes=256 << 10, comm_ctas=8)

    def render() -> tuple[str, str, tuple[str, ...]]:
        src = render_tp(problem, d)[0]
        return src.name, src.source, tuple(sorted(src.needs))
    return render


def _pipeline(kind: str, backend: str, issuer: str) -> Callable[[], tuple[str, str, tuple[str, ...]]]:
    def render() -> tuple[str, str, tuple[str, ...]]:
        from cuco.workloads.cp import CPAttention
        from cuco.workloads.kv import KVTransfer
        from cuco.workloads.moe import MoE
        workload = {"kv_transfer": lambda: KVTransfer(2, layers=2, tokens=256, hidden=512, kv_dim=256),
                    "moe": lambda: MoE(2, tokens=64, hidden=512, ffn=256, experts=8, topk=2),
                    "cp_attention": lambda: CPAttention(2, seq=1024, heads=4, head_dim=128, causal=True),
                    }[kind]()
        d = Directives(backend=backend, placement="side_stream", sync_scope="chunk", issuer=issuer,
                       chunk_bytes=64 << 10, comm_ctas=4)
        src = workload.render(d)
        return src.name, src.source, tuple(sorted(src.needs))
    return render


AR, RS, AG = "gemm_allreduce", "gemm_reducescatter", "allgather_gemm"
CASES: dict[str, dict[str, Callable[[], tuple[str, str, tuple[str, ...]]]]] = {
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
    "side_stream": {
        "ar.side.lsa.cta": _side(AR, "lsa", "cta"),
        "rs.side.nvshmem.warp": _side(RS, "nvshmem", "warp"),
        "ag.side.nvshmem.cta": _side(AG, "nvshmem", "cta"),
    },
    "pipelines": {
        "moe.lsa.warp": _pipeline("moe", "lsa", "warp"),
        "moe.nvshmem.cta": _pipeline("moe", "nvshmem", "cta"),
        "kv.nvshmem.warp": _pipeline("kv_transfer", "nvshmem", "warp"),
        "cp.lsa.cta": _pipeline("cp_attention", "lsa", "cta"),
    },
}


def old_environment(rev: str) -> jinja2.Environment:
    """The templates as they were at ``rev`` (read with git), rendered as cuco renders."""
    def load(name: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:src/cuco/kernels/templates/{name}"], check=True,
                              capture_output=True, text=True).stdout
    now = render_module.environment()
    return jinja2.Environment(loader=jinja2.FunctionLoader(load), undefined=jinja2.StrictUndefined,
                              trim_blocks=now.trim_blocks, lstrip_blocks=now.lstrip_blocks,
                              keep_trailing_newline=now.keep_trailing_newline)


@contextlib.contextmanager
def templates_of(env: jinja2.Environment) -> Iterator[None]:
    """Every ``render(...)`` inside renders from ``env`` (the renderers of tp and the
    workloads go through :func:`cuco.kernels.render.render`)."""
    saved = render_module.environment
    render_module.environment = lambda template_dirs=(): env  # type: ignore[assignment]
    try:
        yield
    finally:
        render_module.environment = saved


def progress(name: str, result) -> None:
    if not hasattr(result, "path"):
        print(f"  FAILED {name}: {result}", flush=True)
    else:
        print(f"  built {name} ({'cached' if result.cached else f'{result.seconds:.0f} s'})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before-rev", required=True, help="commit whose templates are 'before'")
    ap.add_argument("--cases", default=",".join(CASES), help=f"groups of cases: {', '.join(CASES)}")
    ap.add_argument("--only", default="", help="comma-separated parts of case names: only the cases "
                    "whose name holds one (one case at a time while a refactor is under way)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "cuco-identity"))
    ap.add_argument("--name", default="kernel_identity")
    ap.add_argument("--out-dir", default="bench/results")
    a = ap.parse_args(argv)
    only = [part for part in a.only.split(",") if part]
    cases = {name: f for group in a.cases.split(",") for name, f in CASES[group].items()
             if not only or any(part in name for part in only)}
    if not cases:
        raise SystemExit(f"no case of {a.cases} holds any of {only}")
    old_env = old_environment(a.before_rev)
    items, meta = [], []
    for case, render in cases.items():
        with templates_of(old_env):
            name, before, needs = render()
        name2, after, needs2 = render()
        assert (name, needs) == (name2, needs2), (case, name, name2)
        # the same name: nvcc names internal symbols after the source file
        items += [(name, before, needs), (name, after, needs)]
        meta.append((case, name, before == after))
    comp = Compiler(arch="sm_90a", cache_dir=a.cache_dir)
    t0 = time.perf_counter()
    unique = list(dict.fromkeys(items))  # a source that did not change is built once
    done = dict(zip(unique, comp.compile_many(unique, on_done=progress)))
    built = [done[item] for item in items]
    seconds = time.perf_counter() - t0
    rows, same_all = [], True
    for (case, name, same_source), old, new in zip(meta, built[0::2], built[1::2]):
        if not (hasattr(old, "path") and hasattr(new, "path")):
            rows.append({"case": case, "kernel": name, "identical": False, "error": str(old if not
                         hasattr(old, "path") else new)[:2000]})
            same_all = False
            continue
        a_code, b_code = device_code(old.path.read_bytes()), device_code(new.path.read_bytes())
        differ = sorted(k for k in a_code.keys() | b_code.keys() if a_code.get(k) != b_code.get(k))
        rows.append({"case": case, "kernel": name, "identical": not differ, "same_source": same_source,
                     "sections": len(a_code), "text_sections": sum(".text." in k for k in a_code),
                     "differing_sections": differ})
        same_all &= not differ
        print(f"{case}: {'identical' if not differ else 'DIFFERS in ' + ', '.join(differ)} "
              f"({len(a_code)} sections{', same source' if same_source else ''})", flush=True)
    n_same = sum(r["identical"] for r in rows)
    extra = {"before_rev": a.before_rev, "kernels_compared": len(rows), "kernels_identical": n_same,
             "all_identical": same_all, "build_s": round(seconds, 1), "cores": os.cpu_count()}
    path = results.write(a.name, rows, device="CPU only (nvcc, sm_90a; no GPU)", world_size=2, emulated=False,
                         out_dir=a.out_dir, extra=extra)
    print(f"wrote {path}: {n_same}/{len(rows)} kernels identical to {a.before_rev}")
    return 0 if same_all else 1


if __name__ == "__main__":
    run_script(main)
