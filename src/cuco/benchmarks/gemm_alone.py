"""The GEMM alone on one GPU: cuco's in-kernel mainloop against the vendor GEMMs.

Every in-kernel build of the tensor-parallel templates can be rendered without its
communication (``gemm_only``); its time is the fused kernel's mainloop and epilogue
staging. This benchmark times those builds over the mainloops a search sweeps
(:data:`cuco.kernels.tp.MAINLOOPS` x tile orders) on the per-rank GEMMs of the
tensor-parallel benchmark and on a spread of other shapes, against ``torch.matmul``
(cuBLASLt's heuristic pick; when torch is importable) and CuPy's cuBLAS ``gemmEx``, all in
one process, interleaved round by round. Every output is poisoned with NaN, computed and
checked element by element against an fp32 reference before timing and again after the
last timed round.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from cuco import results
from cuco.design import Directives, GemmProblem
from cuco.design.patterns import ALLGATHER_GEMM, TP_PATTERNS
from cuco.kernels import fused_launch
from cuco.kernels.tp import MAINLOOPS, in_kernel, render_tp
from cuco.runtime import dtypes

#: (M, K, N) of the tensor-parallel benchmark (bench/tp_workloads.py); their per-rank GEMMs
#: on 2 ranks are the "nine pairs" whose GEMM issue #21 asks to match cuBLASLt on.
TP_SHAPES = ((8192, 8192, 8192), (4096, 8192, 28672), (2048, 4096, 4096))
#: Per-rank GEMMs (M, N, K) of other layers: Llama-3-70B's attention output and MLP at
#: 6k tokens, a decode-sized M, a narrow N, and a deep K.
SPREAD = ((6144, 5120, 6144), (1024, 8192, 4096), (512, 4096, 8192), (4096, 1536, 8192),
          (3072, 7168, 14336), (16384, 4096, 4096))
RASTER_GROUPS = (1, 8, 16)


def nine_pair_gemms(world_size: int = 2) -> list[tuple[int, int, int]]:
    """The distinct per-rank GEMMs ``(M, N, K)`` of the tensor-parallel benchmark."""
    out: list[tuple[int, int, int]] = []
    for m, k, n in TP_SHAPES:
        for tp in TP_PATTERNS:
            shape = tp.local_gemm(m=m, n=n, k=k, world_size=world_size)
            if shape not in out:
                out.append(shape)
    return out


def mainloop_points() -> list[Directives]:
    """Each searched mainloop in each tile order, the epilogue handed to spare warps."""
    return [in_kernel("epilogue", "nvshmem", "cta", tile_n=tile_n, stages=stages, raster_group=g,
                      comm_warps=3, schedule=schedule)
            for schedule, tile_n, stages in MAINLOOPS for g in RASTER_GROUPS]


def problem_of(m: int, n: int, k: int) -> GemmProblem:
    """A one-rank problem whose local GEMM is ``C[m, n] = A[m, k] B[k, n]``: AllGather's
    kernel on one rank gathers nothing, and ``gemm_only`` leaves its pushes out."""
    return GemmProblem(workload=ALLGATHER_GEMM.name, m=m, n=n, k=k, world_size=1)


@dataclass
class GemmAloneBench:
    shapes: tuple[tuple[int, int, int], ...] = field(
        default_factory=lambda: tuple(nine_pair_gemms()) + SPREAD)
    rounds: int = 15
    calls: int = 20
    name: str = "gemm_mainloop"
    out_dir: Any = results.RESULTS_DIR
    console: Console = field(default_factory=Console)

    def build(self) -> dict[tuple[tuple[int, int, int], str], tuple[str, int]]:
        """Every (shape, point) gemm_only build, compiled on all cores; ``{key: (library,
        raster group)}``."""
        from cuco.kernels import Compiler
        items, keys = [], []
        for shape in self.shapes:
            for d in mainloop_points():
                try:
                    src, _ = render_tp(problem_of(*shape), d, gemm_only=True)
                except Exception as exc:  # noqa: BLE001 - a point that cannot tile this shape
                    self.console.print(f"[dim]{shape} {d.full_name}: {exc}[/dim]")
                    continue
                items.append((src.name, src.source, src.needs))
                keys.append((shape, d.full_name, d.raster_group))
        built = Compiler().compile_many(items)
        out = {}
        for (shape, name, raster), b in zip(keys, built):
            if hasattr(b, "path"):
                out[(shape, name)] = (str(b.path), raster)
            else:
                self.console.print(f"[red]{shape} {name}: {b}[/red]")
        return out

    def run(self) -> Any:
        import cupy
        built = self.build()
        dev = cupy.cuda.Device()
        sms = int(dev.attributes["MultiProcessorCount"])
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
        rows: list[dict[str, Any]] = []
        for shape in self.shapes:
            rows += self._case(shape, {d: p for (s, d), p in built.items() if s == shape}, sms)
            self.console.print(f"{shape}: {self._line(rows, shape)}")
        summary = self._summary(rows)
        path = results.write(self.name, rows, device=f"1 x {name}", world_size=1, emulated=False,
                             out_dir=self.out_dir, extra={"summary": summary})
        self._print(summary)
        self.console.print(f"wrote {path}")
        return path

    def _case(self, shape: tuple[int, int, int], libs: dict[str, tuple[str, int]], sms: int) -> list[dict]:
        import cupy
        m, n, k = shape
        rng = cupy.random.default_rng(m * 7 + n * 5 + k)
        a = (rng.standard_normal((m, k), dtype=cupy.float32) / k ** 0.25).astype(cupy.float32)
        b = (rng.standard_normal((k, n), dtype=cupy.float32) / k ** 0.25).astype(cupy.float32)
        a16, b16 = dtypes.from_float32(a, "bf16"), dtypes.from_float32(b, "bf16")
        del a, b
        ref = cupy.empty((m, n), dtype=cupy.float32)  # bf16 products are exact in fp32; fp32 sums
        _cublas(a16, b16, ref, "fp32")
        cands: dict[str, tuple[Callable[[], None], Any]] = {}
        torch_fn = _torch_matmul(a16, b16, m, n)
        if torch_fn is not None:
            cands["torch_matmul"] = torch_fn
        c = cupy.empty((m, n), dtype=cupy.uint16)
        cands["cublas_gemmex"] = (lambda c=c: _cublas(a16, b16, c, "bf16"), c)
        # the arena this one rank's kernel sees: an XF buffer (its descriptor needs one), then
        # the kernel's call state (zeroed: the first call's epoch is 1)
        gathered = cupy.zeros(m * k + CALL_STATE_ELEMS, dtype=cupy.uint16)
        for variant, (path, raster) in libs.items():
            c = cupy.empty((m, n), dtype=cupy.uint16)
            cands[variant] = (_launcher(path, raster, a16, b16, c, gathered, sms), c)
        checks = {v: self._check(fn, c, ref) for v, (fn, c) in cands.items()}
        times: dict[str, list[float]] = {v: [] for v in cands}
        for v, (fn, _) in cands.items():
            for _ in range(3):
                fn()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(self.rounds):
            for v, (fn, _) in cands.items():
                start.record()
                for _ in range(self.calls):
                    fn()
                end.record()
                end.synchronize()
                times[v].append(cupy.cuda.get_elapsed_time(start, end) / self.calls)
        after = {v: _bad(c, ref) for v, (_, c) in cands.items()}  # the last timed call's output
        base = "torch_matmul" if "torch_matmul" in cands else "cublas_gemmex"
        med = {v: statistics.median(t) for v, t in times.items()}
        flops = 2.0 * m * n * k
        case = f"gemm/M{m}N{n}K{k}/bf16"
        return [{"case": case, "variant": v, "ms": round(med[v], 5),
                 "rounds_ms": [round(t, 5) for t in times[v]],
                 "baseline": base, "baseline_ms": round(med[base], 5),
                 "speedup": round(med[base] / med[v], 4),
                 # the same ratio round by round (both timed back to back), then the median:
                 # clock drift between rounds cancels
                 "speedup_paired": round(statistics.median(
                     b / t for b, t in zip(times[base], times[v])), 4),
                 "tflops": round(flops / med[v] / 1e9, 1),
                 "correct": checks[v] == 0 and after[v] == 0,
                 "bad_elements": checks[v] + after[v],
                 "role": "peer" if v in ("torch_matmul", "cublas_gemmex") else "cuco",
                 "nine_pair": shape in nine_pair_gemms(), "peers": {}}
                for v in cands]

    @staticmethod
    def _check(fn: Callable[[], None], out, ref) -> int:
        dtypes.poison(out, "bf16")  # an element the call does not write fails
        fn()
        return _bad(out, ref)

    @staticmethod
    def _line(rows: list[dict], shape) -> str:
        mine = [r for r in rows if r["case"].startswith(f"gemm/M{shape[0]}N{shape[1]}K{shape[2]}/")]
        return " ".join(f"{r['variant'].split('.chunk.')[-1] if r['role'] == 'cuco' else r['variant']}="
                        f"{r['speedup']:.3f}{'' if r['correct'] else '(WRONG)'}"
                        for r in sorted(mine, key=lambda r: r["ms"])[:6])

    @staticmethod
    def _summary(rows: list[dict]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for r in rows:
            s = out.setdefault(r["case"], {"nine_pair": r["nine_pair"], "baseline": r["baseline"],
                                           "baseline_ms": r["baseline_ms"]})
            if r["role"] == "peer":
                s[f"{r['variant']}_ms"] = r["ms"]
            elif r["correct"] and ("best_ms" not in s or r["ms"] < s["best_ms"]):
                s.update(best=r["variant"], best_ms=r["ms"], speedup=r["speedup"],
                         speedup_paired=r.get("speedup_paired"))
        ratios = [s["speedup"] for s in out.values() if s["nine_pair"] and "speedup" in s]
        return {"cases": out, "min_speedup_nine_pair": min(ratios) if ratios else None,
                "min_speedup_all": min((s["speedup"] for s in out.values() if "speedup" in s),
                                       default=None)}

    def _print(self, summary: dict[str, Any]) -> None:
        t = Table(title="GEMM alone: cuco's best in-kernel mainloop vs torch.matmul (same run)")
        for col in ("case", "best", "ms", "torch ms", "cuBLAS ms", "speedup"):
            t.add_column(col)
        for case, s in summary["cases"].items():
            t.add_row(case + (" *" if s["nine_pair"] else ""), str(s.get("best", "-")).split(".chunk.")[-1],
                      f"{s.get('best_ms', 0):.4f}", f"{s.get('torch_matmul_ms', 0):.4f}",
                      f"{s.get('cublas_gemmex_ms', 0):.4f}", f"{s.get('speedup', 0):.3f}")
        self.console.print(t)
        self.console.print(f"min speedup over the nine-pair GEMMs (*): {summary['min_speedup_nine_pair']}")


def _bad(out, ref) -> int:
    from cuco.runtime.checking import compare
    k_scale = float(abs(ref).max()) if ref.size else 1.0
    return compare(out, ref, "bf16", rtol=2 ** -7, atol=2 ** -8 * k_scale)["bad_elements"]


def _cublas(a16, b16, c, out_dtype: str) -> None:
    """cuBLAS ``gemmEx`` (default algorithm), bf16 operands, C in ``out_dtype``."""
    import cupy
    from cuco.runtime.cublas import gemm
    (m, k), n = a16.shape, b16.shape[1]
    gemm(a16.data.ptr, b16.data.ptr, c.data.ptr, m, n, k, "bf16", cupy.cuda.get_current_stream(),
         out_dtype=out_dtype)


def _torch_matmul(a16, b16, m: int, n: int):
    try:
        import torch
    except ImportError:
        return None
    a = torch.as_tensor(a16, device="cuda").view(torch.bfloat16)
    b = torch.as_tensor(b16, device="cuda").view(torch.bfloat16)
    import cupy
    c = cupy.empty((m, n), dtype=cupy.uint16)
    ct = torch.as_tensor(c, device="cuda").view(torch.bfloat16)
    return (lambda: torch.matmul(a, b, out=ct)), c


#: uint16 elements of the call state a fused kernel keeps on the device (two 8-byte slots).
CALL_STATE_ELEMS = 8


def _launcher(path: str, raster: int, a16, b16, c, gathered, sms: int) -> Callable[[], None]:
    """One call of a gemm_only in-kernel build on the current stream (one rank: no peers,
    the arena is the XF buffer its descriptor is built over)."""
    import cupy
    from cuco.runtime.worker import load_launcher
    dev = cupy.cuda.Device().id
    lib = load_launcher(path, dev)
    peers = (ctypes.c_void_p * 1)(gathered.data.ptr)
    calls_off = (gathered.size - CALL_STATE_ELEMS) * gathered.itemsize

    def call() -> None:
        (m, n), k = c.shape, a16.shape[1]
        rc = lib.cuco_fused_launch(*fused_launch.pack(
            device=dev, stream=cupy.cuda.get_current_stream().ptr, grid=sms, m=m, n=n, k=k, raster_group=raster,
            x=a16.data.ptr, w=b16.data.ptr, out=c.data.ptr, a0=None, a1=None, peers=peers, me=0,
            data_off=0, stage_off=0, out_off=0, flag_off=0, calls_off=calls_off))
        if rc:
            raise RuntimeError(f"{path}: launch failed (CUDA error {rc})")
    return call
