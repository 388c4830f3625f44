"""What one call's poison costs -> bench/results/poison.json (issue #39).

    python bench/poison.py                      # 8192 x 8192 bf16: GEMM+AllReduce 8192^3's output
    python bench/poison.py --elems 1048576

Every verified call poisons its output and its arena's data regions (three of the output's
size for GEMM+AllReduce), and a host program's output again once verified: about 120 poisons
per side-stream candidate in ``bench/evaluator.py --world-size 1``. For each kind (``nan``;
``bytes``: keyed noise, one kernel; ``bytes_curand``: the former bytes poison, a CuPy
``RandomState`` per call, kept here to compare) this times, on one GPU in this process:
``ms``, the device time of one poison (CUDA events around ``--reps`` of them); ``host_ms``,
the host's time to enqueue one while a long spin kernel keeps the stream busy; and
``blocks_host``, whether that enqueue waited for the spin to end (a device-wide wait, which
stalls the schedule's Python behind the GPU). It also checks the keyed bytes on the device
against :func:`cuco.runtime.sealed.keyed_bytes_host`.
"""

from __future__ import annotations

import argparse
import time

from cuco import results
from cuco.errors import run_script
from cuco.runtime import check_gpus

SPIN_MS = 200.0


def _bytes_curand(x, seed: int) -> None:
    """The bytes poison before keyed noise (commit 35bfa97's ``Poison.apply``)."""
    import cupy
    raw = cupy.random.RandomState(seed).randint(0, 256, size=x.nbytes, dtype=cupy.uint8)
    x.view(cupy.uint8)[...] = raw.reshape(x.view(cupy.uint8).shape)


def _poisons(dtype: str):
    import random

    from cuco.runtime.dtypes import Poison
    rng = random.Random(1)
    nan = next(p for p in iter(lambda: Poison.draw(rng, dtype), None) if p.kind == "nan")
    keyed = next(p for p in iter(lambda: Poison.draw(rng, dtype), None) if p.kind == "bytes")
    return {"nan": nan.apply, "bytes": keyed.apply,
            "bytes_curand": lambda x: _bytes_curand(x, rng.randrange(1 << 31))}


def _measure(apply, x, stream, reps: int) -> dict:
    import cupy

    from cuco.runtime.timing import spin
    with stream:
        apply(x)  # first use: module loads, pool growth
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(reps):
            apply(x)
        end.record(stream)
        end.synchronize()
        ms = cupy.cuda.get_elapsed_time(start, end) / reps
        spin(stream, SPIN_MS * 1000)
        t0 = time.perf_counter()
        apply(x)
        host_ms = (time.perf_counter() - t0) * 1e3
        stream.synchronize()
    return {"ms": round(ms, 4), "host_ms": round(host_ms, 3), "blocks_host": host_ms > SPIN_MS / 2}


def _keyed_bytes_agree() -> bool:
    import cupy
    import numpy

    from cuco.runtime.sealed import fill_keyed_bytes, keyed_bytes_host
    key = (0xFEEDFACE << 96) | 12345
    buf = cupy.zeros(1 << 12, dtype=cupy.uint8)
    ok = True
    for start, n in ((0, 4096), (3, 1001), (8, 37)):
        buf.fill(0xA5)
        fill_keyed_bytes(buf[start:start + n], key)
        got = buf.get()
        ok &= numpy.array_equal(got[start:start + n], keyed_bytes_host(n, key))
        ok &= bool((got[start + n:] == 0xA5).all() and (got[:start] == 0xA5).all())
    return bool(ok)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elems", type=int, default=8192 * 8192)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--name", default="poison")
    a = ap.parse_args(argv)
    check_gpus(1, None, need_p2p=False)  # a clear error, not cupy's, where no GPU is visible
    import cupy

    from cuco.runtime import dtypes
    x = dtypes.empty(a.elems, a.dtype)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = [{"case": f"poison/{a.elems}/{a.dtype}", "variant": kind, **_measure(apply, x, stream, a.reps)}
            for kind, apply in _poisons(a.dtype).items()]
    agree = _keyed_bytes_agree()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    path = results.write(a.name, rows, device=f"1 x {name}", world_size=1, emulated=False, out_dir=a.out_dir,
                         extra={"elems": a.elems, "dtype": a.dtype, "reps": a.reps,
                                "keyed_bytes_match_host": agree})
    for r in rows:
        print(f"{r['variant']:13} {r['ms']:8.4f} ms on the device  host {r['host_ms']:8.3f} ms  "
              f"{'waits for the device' if r['blocks_host'] else 'no wait'}")
    print(f"keyed bytes on the device match keyed_bytes_host: {agree}")
    print(f"wrote {path}")
    return 0 if agree else 1


if __name__ == "__main__":
    run_script(main)
