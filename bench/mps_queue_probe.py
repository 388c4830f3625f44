"""Do W MPS clients on one GPU each get work queues of their own for their streams? (issue #35)

    python bench/mps_queue_probe.py --world 4 --connections 8 --streams 4

Starts W processes under the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY), each with its share
of the SMs and ``CUDA_DEVICE_MAX_CONNECTIONS``, all connected before any test. Each then, for
every ordered pair (a, b) of its ``--streams`` streams, launches on stream b a kernel that spins
until a flag is set (giving up after ``--timeout-ms``), and after it, on stream a, the kernel
that sets the flag. Where both streams sit on one hardware work queue the setter runs only
after the waiter gave up: a false dependency, the way a spinning communication kernel holds back
the GEMM chunk it waits for. Prints one line per rank: SMs seen, pairs tested, pairs that
stalled. A probe: its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os

SRC = r"""
extern "C" __global__ void waiter(volatile unsigned int* flag, int* out, long long timeout_ns) {
  long long t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*flag == 0u) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - t0 > timeout_ns) { *out = 1; return; }
  }
  *out = 0;
}
extern "C" __global__ void setter(volatile unsigned int* flag) { __threadfence_system(); *flag = 1u; }
"""


def rank_main(rank: int, world: int, connections: int, streams: int, timeout_ms: float, barrier, q) -> None:
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 // world))
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    import cupy
    import numpy
    dev = cupy.cuda.Device(0)
    dev.use()
    sms = dev.attributes["MultiProcessorCount"]
    mod = cupy.RawModule(code=SRC)
    waiter, setter = mod.get_function("waiter"), mod.get_function("setter")
    ss = [cupy.cuda.Stream(non_blocking=True) for _ in range(streams)]
    flag = cupy.zeros(1, dtype=cupy.uint32)
    out = cupy.zeros(1, dtype=cupy.int32)
    cupy.cuda.runtime.deviceSynchronize()
    barrier.wait()  # every client connected (its queues allocated) before any test
    stalled = []
    for a in range(streams):
        for b in range(streams):
            if a == b:
                continue
            flag.fill(0)
            out.fill(-1)
            cupy.cuda.runtime.deviceSynchronize()
            waiter((1,), (1,), (flag, out, numpy.int64(timeout_ms * 1e6)), stream=ss[b])
            setter((1,), (1,), (flag,), stream=ss[a])
            cupy.cuda.runtime.deviceSynchronize()
            if int(out.get()[0]) != 0:
                stalled.append([a, b])
    barrier.wait()
    q.put({"rank": rank, "sms": sms, "pairs": streams * (streams - 1), "stalled": stalled})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--timeout-ms", type=float, default=200.0)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(a.world), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.world, a.connections, a.streams, a.timeout_ms, barrier, q))
             for r in range(a.world)]
    for p in procs:
        p.start()
    rows = sorted((q.get(timeout=300) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    for r in rows:
        print(json.dumps({"world": a.world, "connections": a.connections, **r}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
