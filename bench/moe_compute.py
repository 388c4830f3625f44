"""The MoE layer's expert FFN on one GPU: cuco's grouped GEMM against torch._grouped_mm (issue #37)
-> bench/results/moe_compute.json.

    python bench/moe_compute.py --out bench/results/moe_compute.json
    python bench/moe_compute.py --quick           # two expert shapes, about a minute

The computation: every local expert's rows (expert-major, ``offs`` cumulative) through
gate/up, SwiGLU, down -- ``y = (silu(x Wg) * (x Wu)) Wd`` in bf16 with fp32 accumulation.

* cuco: what the MoE workload runs (:mod:`cuco.workloads.moe.grouped_gemm`, :func:`cuco.workloads.
  moe_host.compute_only`): one CUTLASS grouped GEMM per projection (sizes and pointers in
  device tables, one group per expert) and cuco's SwiGLU kernel between them, in each of the
  grouped GEMM's configurations (``--configs``; tile and schedule, one build each, timed in
  the same interleaved run): a row reports the fastest correct one and every one's time;
* torch: ``torch._grouped_mm`` per projection (the weights in the layout the workload's torch
  host program gives it: ``[E, 2F, H]`` viewed as ``[E, H, 2F]``) and
  ``silu(h[:, :F]) * h[:, F:]``, as a user writes it.

Expert shapes: DeepSeek-V3 (hidden 7168, expert FFN 2048, 32 local experts: 256 at EP=8),
Qwen3-235B-A22B (4096, 1536, 16: 128 at EP=8), Qwen3-30B-A3B (2048, 768, all 128 on one
GPU). Routing is skewed: expert ``i`` of a random order draws rows with probability
``∝ 1 / (i + 1) ** zipf`` (multinomial, a mean of 8 rows per expert for decode, 512 for
prefill), then decode keeps every expert within [1, 16] rows and prefill gives every expert at
least 256 (the issue's "<= 16" and ">= 256" row counts, skewed within them). Inputs N(0, 1), weights
N(0, 1/fan_in). Before timing and after the last timed call both outputs are compared
element by element with an fp32 reference (the same bf16 operands, every step in fp32):
``|y - ref| <= rtol |ref| + atol`` with ``atol`` a fraction of ref's RMS (bf16 rounds h and
the activation: errors scale with the row, not the element), and a relative L2 bound.
Timing: cuco.runtime.timing.time_interleaved (CUDA events, warm-up, then ``--iters`` samples
interleaved, a spin kernel ahead of each so the host's enqueueing is not timed); ``speedup``
is ``torch_ms / cuco_ms`` of the medians, and the minimum over cases is printed last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cuco.runtime import check_gpus
from cuco.workloads.moe.grouped_gemm import CONFIGS, default_config  # name: (tile, schedule), the workload's

NAME = "moe_compute"
#: (hidden, expert FFN width, local experts, where the count comes from)
EXPERT_SHAPES: dict[str, tuple[int, int, int, str]] = {
    "deepseek_v3": (7168, 2048, 32, "256 routed experts at EP=8"),
    "qwen3_235b_a22b": (4096, 1536, 16, "128 experts at EP=8"),
    "qwen3_30b_a3b": (2048, 768, 128, "128 experts on one GPU"),
}
QUICK_SHAPES = ("deepseek_v3", "qwen3_30b_a3b")
#: rows per expert: mean drawn, and the [lo, hi] every expert is kept within (hi None: no cap)
REGIMES: dict[str, dict[str, Any]] = {
    "decode": {"mean": 8, "lo": 1, "hi": 16},
    "prefill": {"mean": 512, "lo": 256, "hi": None},
}
ZIPF = 1.0
#: tolerance: |y - ref| <= RTOL |ref| + ATOL_RMS * rms(ref), and rel. L2 error <= MAX_REL_L2
RTOL, ATOL_RMS, MAX_REL_L2 = 2.0**-6, 2.0**-4, 2.0**-5
VARIANT = "cuco.cutlass_grouped_gemm.{config}+swiglu"
BASELINE = "torch._grouped_mm+silu*up"


# ---- pure parts (tested on the CPU) -------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=f"bench/results/{NAME}.json", help="result file")
    ap.add_argument("--out-dir", help=f"write <OUT_DIR>/{NAME}.json instead (as bench/gpu_session.sh passes)")
    ap.add_argument("--quick", action="store_true", help=f"shapes {QUICK_SHAPES} only (~1 min)")
    ap.add_argument("--shape", action="append", choices=sorted(EXPERT_SHAPES),
                    help="expert shape (repeatable); default: all")
    ap.add_argument("--regime", action="append", choices=sorted(REGIMES),
                    help="row regime (repeatable); default: both")
    ap.add_argument("--iters", type=int, default=30, help="timed samples per variant (>= 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--zipf", type=float, default=ZIPF, help="routing skew exponent (0: uniform)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"grouped GEMM configurations to time, comma-separated (of {', '.join(CONFIGS)})")
    args = ap.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    if not args.configs or set(args.configs) - set(CONFIGS):
        ap.error(f"--configs: some of {', '.join(CONFIGS)}")
    if args.out_dir:
        args.out = str(Path(args.out_dir) / f"{NAME}.json")
    if args.iters < 20:
        ap.error("--iters: the issue asks for the median of >= 20 samples")
    if args.warmup < 0 or args.zipf < 0:
        ap.error("--warmup and --zipf must be >= 0")
    return args


def cases(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(shape, regime)`` pairs in run order."""
    shapes = args.shape or (list(QUICK_SHAPES) if args.quick else list(EXPERT_SHAPES))
    regimes = args.regime or list(REGIMES)
    return [(s, r) for s in shapes for r in regimes]


def skewed_counts(experts: int, regime: str, seed: int, zipf: float = ZIPF) -> np.ndarray:
    """Rows per expert (int64): a Zipf-like routing over a random expert order, kept within
    the regime's [lo, hi]."""
    r = REGIMES[regime]
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** zipf
    rng.shuffle(w)
    counts = rng.multinomial(experts * r["mean"], w / w.sum()).astype(np.int64)
    return np.clip(counts, r["lo"], r["hi"] if r["hi"] is not None else None)


def case_label(shape: str, regime: str) -> str:
    h, f, e, _ = EXPERT_SHAPES[shape]
    return f"moe_ffn/{shape}/E{e}H{h}F{f}/{regime}/bf16"


def make_row(shape: str, regime: str, counts: np.ndarray, m: dict[str, Any]) -> dict[str, Any]:
    """One result row from one case's measurement ``m``: ``cuco`` (per configuration, ms
    samples) and ``torch`` (ms samples, paired by index), checks ``cuco_check`` (per
    configuration) / ``torch_check`` (dicts with ``correct``), or ``error``. The row's ``ms``
    is the fastest correct configuration's (any, where none is correct); ``configs`` has
    every one's."""
    h, f, e, origin = EXPERT_SHAPES[shape]
    total = int(counts.sum())
    row: dict[str, Any] = {
        "case": case_label(shape, regime), "variant": VARIANT.format(config="?"), "baseline": BASELINE,
        "model": shape, "regime": regime, "hidden": h, "ffn": f, "experts": e,
        "experts_origin": origin,
        "rows": {"total": total, "min": int(counts.min()), "mean": round(float(counts.mean()), 2),
                 "max": int(counts.max()), "empty_experts": int((counts == 0).sum())},
        "bound_ms": None, "overlap_eff": None}
    if "error" in m:
        return {**row, "ms": None, "baseline_ms": None, "speedup": None, "correct": False,
                "error": m["error"], "peers": {}}
    torch_ = statistics.median(m["torch"])
    medians = {c: statistics.median(s) for c, s in m["cuco"].items()}
    right = [c for c in medians if m["cuco_check"][c]["correct"]]
    best = min(right or medians, key=medians.__getitem__)
    cuco, samples = medians[best], m["cuco"][best]
    flops = 2.0 * total * h * 3 * f
    weight_bytes = 3.0 * e * h * f * 2
    row.update({
        "variant": VARIANT.format(config=best), "config": best,
        "ms": round(cuco, 4), "baseline_ms": round(torch_, 4),
        "speedup": round(torch_ / cuco, 4),
        "speedup_paired": round(statistics.median(t / c for c, t in zip(samples, m["torch"])), 4),
        "tflops": round(flops / cuco / 1e9, 1),
        "weights_tb_s": round(weight_bytes / cuco / 1e9, 3),
        "cuco_ms_samples": [round(x, 4) for x in samples],
        "torch_ms_samples": [round(x, 4) for x in m["torch"]],
        "configs": {c: {"ms": round(medians[c], 4), "speedup": round(torch_ / medians[c], 4),
                        "correct": bool(m["cuco_check"][c]["correct"])} for c in medians},
        "check": m["cuco_check"][best], "torch_check": m["torch_check"],
        "cuco_vs_torch_max_abs": m.get("cuco_vs_torch_max_abs"),
        "correct": bool(m["cuco_check"][best]["correct"]),
        "peers": {"torch_grouped_mm_ms": round(torch_, 4),
                  "torch_correct": bool(m["torch_check"]["correct"])},
    })
    default = default_config(float(counts.mean()))  # what the layer builds at these rows
    if default in medians:
        row["default"] = {"config": default, "speedup": round(torch_ / medians[default], 4),
                          "correct": bool(m["cuco_check"][default]["correct"])}
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("speedup") is not None]
    by_regime = {g: min((r["speedup"] for r in ok if r["regime"] == g), default=None) for g in REGIMES}
    worst = min(ok, key=lambda r: r["speedup"], default=None)
    return {"min_speedup": worst["speedup"] if worst else None,
            "min_speedup_case": worst["case"] if worst else None,
            "min_speedup_by_regime": by_regime,
            "min_default_speedup": min((r["default"]["speedup"] for r in ok if "default" in r), default=None),
            "meets_1x": bool(ok) and len(ok) == len(rows) and min(r["speedup"] for r in ok) >= 1.0,
            "all_correct": bool(rows) and all(r.get("correct") for r in rows)}


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<44} {'rows min/mean/max':>18} {'cuco ms':>9} {'torch ms':>9} "
            f"{'torch/cuco':>10} {'TFLOP/s':>8} ok  {'fastest configuration'}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rr = r["rows"]
        rs = f"{rr['min']}/{rr['mean']:g}/{rr['max']}"
        if r.get("ms") is None:
            lines.append(f"{r['case']:<44} {rs:>18} ERROR {str(r.get('error', ''))[:80]}")
            continue
        lines.append(f"{r['case']:<44} {rs:>18} {r['ms']:>9.4f} {r['baseline_ms']:>9.4f} "
                     f"{r['speedup']:>10.3f} {r['tflops']:>8.1f} {'yes' if r['correct'] else 'NO ':<3} "
                     f"{r.get('config', '')}")
    return "\n".join(lines)


def write_results(rows: list[dict[str, Any]], out: str | Path, *, device: str,
                  argv: list[str], extra: dict[str, Any] | None = None) -> Path:
    """``out`` in the shape of DESIGN.md's benchmark result files (via cuco.results.write)."""
    import shlex

    from cuco import results
    out = Path(out)
    if out.suffix != ".json":
        raise SystemExit(f"--out {out}: give a .json file path")
    doc_extra: dict[str, Any] = {"summary": summarize(rows),
                                 "tolerance": {"rtol": RTOL, "atol_rms": ATOL_RMS,
                                               "max_rel_l2": MAX_REL_L2}}
    doc_extra.update(extra or {})
    command = "python3 bench/moe_compute.py" + "".join(" " + shlex.quote(a) for a in argv)
    return results.write(out.stem, rows, device=device, world_size=1, emulated=False,
                         command=command, out_dir=out.parent, extra=doc_extra)


# ---- the GPU side ---------------------------------------------------------------------------
def torch_or_error():
    """torch with ``_grouped_mm`` on a CUDA device, or a CucoError saying what is missing."""
    from cuco.errors import EnvironmentProblem
    try:
        import torch
    except ImportError as exc:
        raise EnvironmentProblem(f"torch is needed for the baseline ({exc}); run where torch is "
                                 "installed (the GPU image's /opt/torch/.venv)") from None
    if not torch.cuda.is_available():
        raise EnvironmentProblem(f"torch {torch.__version__} sees no CUDA device")
    if not hasattr(torch, "_grouped_mm"):
        raise EnvironmentProblem(f"torch {torch.__version__} has no torch._grouped_mm (it came "
                                 "in torch 2.8); use torch >= 2.8")
    return torch


def _normal(shape: tuple[int, ...], scale: float, seed: int):
    """bf16 storage (uint16) of N(0, scale^2) values."""
    import cupy

    from cuco.runtime import dtypes
    v = cupy.random.RandomState(seed).standard_normal(shape, dtype=cupy.float32)
    if scale != 1.0:
        v *= cupy.float32(scale)
    out = dtypes.from_float32(v, "bf16")
    del v
    return out


class Case:
    """One expert shape and routing: inputs, both programs and the fp32 reference."""

    def __init__(self, ctx, torch, shape: str, counts: np.ndarray, seed: int, libs: dict[str, Any], sms: int):
        import cupy

        from cuco.runtime import dtypes, torch_bridge
        from cuco.workloads.moe.grouped_gemm import GroupedGemm
        H, F, E, _ = EXPERT_SHAPES[shape]
        self.H, self.F, self.E, self.torch = H, F, E, torch
        self.counts = counts
        total = self.total = int(counts.sum())
        r0 = np.cumsum(counts) - counts
        self.x = _normal((total, H), 1.0, seed + 1)
        self.wgu = _normal((E, 2 * F, H), H ** -0.5, seed + 2)   # gate rows then up rows
        self.wd = _normal((E, H, F), F ** -0.5, seed + 3)
        # flat storage, as the workload keeps it (moe_host.swiglu indexes it flat)
        self.h = dtypes.empty(total * 2 * F, "bf16")
        self.act = dtypes.empty(total * F, "bf16")
        # an output per configuration: each one's last timed call is checked after timing
        self.y = {cfg: dtypes.empty(total * H, "bf16") for cfg in libs}
        self.y_torch = dtypes.empty(total * H, "bf16")
        self.stream = ctx.stream
        ptr = lambda a: int(a.data.ptr)  # noqa: E731
        j = np.arange(E)
        self.gg: dict[str, list] = {}
        for cfg, lib in libs.items():
            self.gg[cfg] = []
            for n, k, a, ak, b, bk, d, dn in ((2 * F, H, self.x, H, self.wgu, 2 * F * H, self.h, 2 * F),
                                              (H, F, self.act, F, self.wd, H * F, self.y[cfg], H)):
                gg = GroupedGemm(lib, ctx.device, E, n, k, sms)
                gg.shapes.set(np.stack([counts, np.full(E, n), np.full(E, k)], 1).astype(np.int32))
                gg.a.set((ptr(a) + r0 * ak * 2).astype(np.uint64))
                gg.b.set((ptr(b) + j * bk * 2).astype(np.uint64))
                gg.d.set((ptr(d) + r0 * dn * 2).astype(np.uint64))
                self.gg[cfg].append(gg)
        # torch's views of the same storage
        self.ts = torch.cuda.ExternalStream(self.stream.ptr)
        self.xt = torch_bridge.tensor(self.x, "bf16", (total, H))
        self.wgu_t = torch_bridge.tensor(self.wgu, "bf16", (E, 2 * F, H)).transpose(1, 2)
        self.wd_t = torch_bridge.tensor(self.wd, "bf16", (E, H, F)).transpose(1, 2)
        self.offs = torch.as_tensor(np.cumsum(counts).astype(np.int32), device="cuda")
        self.kept: dict[str, Any] = {}
        cupy.cuda.Device().synchronize()  # inputs and tables were made on the default stream

    def cuco(self, cfg: str) -> None:
        """Gate/up, SwiGLU, down: the MoE workload's compute (on the current CuPy stream), its
        grouped GEMMs in configuration ``cfg``."""
        from cuco.workloads.moe.host import swiglu
        gate_up, down = self.gg[cfg]
        gate_up(self.stream.ptr)
        swiglu(self.h, self.act, self.total, self.F)
        down(self.stream.ptr)

    def torch_call(self) -> None:
        torch, F = self.torch, self.F
        with torch.cuda.stream(self.ts):
            h = torch._grouped_mm(self.xt, self.wgu_t, offs=self.offs)
            act = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
            self.kept["y"] = torch._grouped_mm(act, self.wd_t, offs=self.offs)

    def reference(self):
        """fp32 ``[total, H]`` (CuPy): the same bf16 operands, every step in fp32, expert by
        expert."""
        import cupy

        from cuco.runtime import torch_bridge
        torch, F = self.torch, self.F
        ref = cupy.empty((self.total, self.H), dtype=cupy.float32)
        rt = torch_bridge.tensor(ref, "fp32", (self.total, self.H))
        torch.backends.cuda.matmul.allow_tf32 = False
        ends = np.cumsum(self.counts)
        with torch.cuda.stream(self.ts):
            for j, (n, end) in enumerate(zip(self.counts, ends)):
                if n == 0:
                    continue
                lo = int(end - n)
                h = self.xt[lo:int(end)].float() @ self.wgu_t[j].float()
                act = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
                rt[lo:int(end)] = act @ self.wd_t[j].float()
        self.stream.synchronize()
        return ref

    def check(self, got, ref, scale: float) -> dict[str, Any]:
        from cuco.runtime.checking import compare
        self.stream.synchronize()
        r = compare(got, ref, "bf16", rtol=RTOL, atol=ATOL_RMS * scale)
        r["correct"] = bool(r["correct"] and r["rel_l2_error"] <= MAX_REL_L2)
        return {k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items()}

    def torch_output(self):
        from cuco.runtime import torch_bridge
        with self.torch.cuda.stream(self.ts):
            torch_bridge.tensor(self.y_torch, "bf16", (self.total, self.H)).copy_(self.kept["y"])
        self.stream.synchronize()
        return self.y_torch


def measure(case: Case, iters: int, warmup: int) -> dict[str, Any]:
    import cupy

    from cuco.runtime import dtypes
    from cuco.runtime.timing import time_interleaved
    ref = case.reference()
    scale = float(cupy.sqrt(cupy.mean(ref * ref)))
    if not np.isfinite(scale) or scale == 0.0:
        raise RuntimeError("the fp32 reference is zero or not finite: refusing to time on it")
    pre = {}
    for cfg in case.gg:
        with case.stream:
            dtypes.poison(case.y[cfg], "bf16")
            case.cuco(cfg)
        pre[cfg] = case.check(case.y[cfg], ref, scale)
    case.torch_call()
    pre_t = case.check(case.torch_output(), ref, scale)
    programs = {f"cuco:{cfg}": (lambda cfg=cfg: case.cuco(cfg)) for cfg in case.gg}
    times = time_interleaved({**programs, "torch": case.torch_call}, case.stream,
                             warmup=warmup, iters=iters, busy_us=100.0)
    both = lambda a, b: {**a, "correct": a["correct"] and b["correct"], "after_timing": b}  # noqa: E731
    checks = {cfg: both(pre[cfg], case.check(case.y[cfg], ref, scale)) for cfg in case.gg}  # last timed calls
    post_t = case.check(case.torch_output(), ref, scale)
    first = next(iter(case.gg))
    diff = cupy.abs(dtypes.to_float32(case.y[first], "bf16") - dtypes.to_float32(case.y_torch, "bf16"))
    return {"cuco": {cfg: times[f"cuco:{cfg}"] for cfg in case.gg}, "torch": times["torch"],
            "cuco_check": checks, "torch_check": both(pre_t, post_t),
            "cuco_vs_torch_max_abs": float(diff.max())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    todo = cases(args)
    check_gpus(1, None, need_p2p=False)  # a clear error, not cupy's, where no GPU is visible
    torch = torch_or_error()
    import cupy

    from cuco.kernels import toolchain
    from cuco.runtime.worker import WorkerContext, WorkerOptions
    from cuco.kernels import Compiler
    from cuco.workloads.moe.grouped_gemm import config_source, load
    dev = cupy.cuda.Device()
    device = f"1 x {cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}"
    sms = int(dev.attributes["MultiProcessorCount"])
    ctx = WorkerContext(0, 1, dev.id, WorkerOptions(gpu=True, nccl=False, arch=toolchain.default_arch()),
                        stream=cupy.cuda.Stream(non_blocking=True))
    t0 = time.perf_counter()
    sources = {cfg: config_source(cfg) for cfg in args.configs}
    built = Compiler().compile_many([(s.name, s.source, s.needs) for s in sources.values()])
    failed = {cfg: str(b) for cfg, b in zip(sources, built) if not hasattr(b, "path")}
    if failed:
        raise SystemExit(f"grouped GEMM configurations that do not build: {failed}")
    libs = {cfg: load(ctx, b.path) for cfg, b in zip(sources, built)}
    compile_s = time.perf_counter() - t0
    print(f"grouped GEMM configurations {', '.join(libs)} built and loaded in {compile_s:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    for i, (shape, regime) in enumerate(todo):
        counts = skewed_counts(EXPERT_SHAPES[shape][2], regime, args.seed + i, args.zipf)
        case = None
        try:
            case = Case(ctx, torch, shape, counts, 1000 * (args.seed + i), libs, sms)
            m = measure(case, args.iters, args.warmup)
        except Exception as exc:  # noqa: BLE001 - a case that fails leaves the others
            m = {"error": f"{type(exc).__name__}: {exc}"}
        rows.append(make_row(shape, regime, counts, m))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        del case
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()
    path = write_results(rows, args.out, device=device, argv=argv,
                         extra={"compile_s": round(compile_s, 1), "zipf": args.zipf, "seed": args.seed,
                                "regimes": REGIMES, "configs": {c: {"tile": list(CONFIGS[c][0]),
                                                                    "schedule": CONFIGS[c][1]}
                                                                for c in args.configs}})
    s = summarize(rows)
    print()
    print(table(rows))
    print(f"min torch/cuco: {s['min_speedup']} ({s['min_speedup_case']}); by regime "
          f"{s['min_speedup_by_regime']}; all correct: {s['all_correct']}; wrote {path}")
    return 0 if s["all_correct"] else 1


if __name__ == "__main__":
    from cuco.errors import run_script
    run_script(main)
