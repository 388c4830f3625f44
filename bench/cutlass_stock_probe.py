"""CUTLASS's own Hopper GEMM beside cuco's in-kernel build and the libraries (issue #37).

    python bench/cutlass_stock_probe.py --lib bench/stock/build/NAME.so ... [--shape MxNxK ...]
        [--mainloop SPEC ...]

Each ``--lib`` is ``bench/stock/cutlass_gemm.cu`` built for one configuration (GemmUniversal:
the same TMA/wgmma mainloop cuco's kernels take from CUTLASS, with CUTLASS's TMA-store
epilogue and persistent tile scheduler; how each is built is in ``bench/stock/build.sh``).
At each shape (bf16) it times, in one run, the library programs, cuco's default point (and
each ``--mainloop`` point) as built, and each stock kernel at tile-order swizzles 1 and 8, every
output checked on poisoned memory. A probe: it prints a table and writes nothing to
bench/results; it says whether CUTLASS's own kernel (its epilogue, its scheduler) reaches the
library where cuco's does not, not a speedup of cuco's.

On 1 x H200 at 706d255 (bench/logs/gemm_cutlass_stock_probe_w1_h200_706d255.log; ten
configurations, eight GEMMs, bf16): the best stock kernel was slower than cuco's build at
5000x8192x2048, 1536^3 and 1000x5120x5120 (243.05, 13.61 and 80.31 us against 233.38, 13.42
and 74.67), about as fast at 12288x1536x8192 (398.96 against 400.75), and faster at four:
pingpong 128x128 at 4096x1536x8192 (133.98 against 138.24, the same tile and stages as cuco's),
256x144 swapped tiles in clusters of two with 4 stages at 2000x7168x2048 (79.75 against 81.48)
and 2176x2048x8192 (96.67 against 101.26), and 128x256 in clusters of two with 4 stages at
8192x8192x4096 (825.89 against 845.55, the libraries' 830.62). What those have that cuco's
build had not: the tile stored by TMA in small boxes (built since ffbcd9c), and the shared
memory that a small epilogue buffer leaves for a fourth stage or a 256-wide swapped tile
(cuco's staged tile still takes a whole tile). Its tile-order swizzle of 8 ran 2-3x slower than
1 at every shape (its own scheduler's order, not cuco's).
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import gemm_overhead_probe as gop
from cuco.benchmarks import gemm_alone as ga
from cuco.errors import run_script
from cuco.runtime import check_gpus

SWIZZLES = (1, 8)


def stock_program(lib: ctypes.CDLL, a, b, c, m: int, n: int, k: int, swizzle: int):
    """One call of the stock kernel on the current stream; a RuntimeError if it refuses."""
    import cupy

    def call() -> None:
        rc = lib.stock_gemm(ctypes.c_void_p(a.data.ptr), ctypes.c_void_p(b.data.ptr), ctypes.c_void_p(c.data.ptr),
                            m, n, k, swizzle, ctypes.c_void_p(cupy.cuda.get_current_stream().ptr))
        if rc:
            raise RuntimeError(f"stock_gemm returned {rc}")
    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", action="append", required=True, type=Path, help="a built stock kernel (repeatable)")
    ap.add_argument("--shape", action="append", type=lambda s: tuple(int(x) for x in s.split("x")))
    ap.add_argument("--mainloop", action="append", default=[], type=gop.mainloop_spec,
                    help="also this cuco mainloop beside the default point (repeatable)")
    args = ap.parse_args(argv)
    check_gpus(1, None, need_p2p=False)
    import cupy
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    libs = {}
    for path in args.lib:
        lib = ctypes.CDLL(str(path.resolve()))
        lib.stock_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
        libs[path.stem] = lib
        print(f"{path.stem}: {lib.stock_stages()} stages, {lib.stock_smem()} bytes of shared memory")
    shapes = args.shape or gop.SHAPES
    built = gop.build(shapes, ("as_is",), sms, tuple(args.mainloop))

    def lines_of(shape):
        m, n, k = shape
        progs, text, ops = gop.programs(shape, built, sms)
        for name, lib in libs.items():
            for sw in SWIZZLES:
                c = ga.dtypes_empty(m, n, "bf16")
                progs[f"stock.{name}.sw{sw}"] = (stock_program(lib, ops["a"], ops["b"], c, m, n, k, sw), c)
        bad, fns = gop.checked(progs, ops, time_wrong=False)
        gpu = gop.gpu_us(fns)
        fastest_lib = min(t for v, t in gpu.items() if not v.startswith(("cuco.", "stock.")))
        for v in progs:
            t = gpu.get(v)
            timing = f"gpu {t:8.2f} us  {fastest_lib / t:6.4f}x the fastest library" if t else "not timed"
            yield f"{'x'.join(map(str, shape)):>16} {v:<34} {timing}  bad {bad[v]}  {text.get(v, '')}"
    return gop.print_table(shapes, lines_of)


if __name__ == "__main__":
    run_script(main)
