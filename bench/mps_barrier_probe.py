"""Do W MPS clients on one GPU run their kernels at the same time? An all-to-all flag barrier
through CUDA IPC, timed inside one launch (issue #35).

    python bench/mps_barrier_probe.py --world 8 --rounds 2000

Under the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY), starts W processes; each exports a
flag array through CUDA IPC and maps its peers'. Then every rank launches one kernel (one
thread) that runs ``--rounds`` barriers: it writes its round into its slot of every peer's
array and waits until all peers' slots in its own array reach it (giving up after
``--limit-s``). Prints per rank the microseconds per barrier. Under MPS the ranks' kernels
run together (microseconds); time-sliced, each round costs a slice (milliseconds). The
host takes no part between rounds, so host scheduling cannot enter the figure.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

SRC = r"""
extern "C" __global__ void barriers(unsigned long long* const* peers, volatile unsigned long long* mine,
                                    int world, int rank, long long rounds, long long limit_ns,
                                    long long* done) {
  long long t0, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  long long r = 1;
  for (; r <= rounds; ++r) {
    for (int p = 0; p < world; ++p) {
      volatile unsigned long long* slot = peers[p] + rank;
      *slot = (unsigned long long)r;
    }
    __threadfence_system();
    for (int p = 0; p < world; ++p) {
      while (mine[p] < (unsigned long long)r) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 > limit_ns) { *done = r - 1; return; }
      }
    }
  }
  *done = rounds;
}
"""


def rank_main(rank: int, world: int, rounds: int, limit_s: float, connections: int, handles, barrier, q) -> None:
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    import cupy
    import numpy
    rt = cupy.cuda.runtime
    cupy.cuda.Device(0).use()
    flags = cupy.zeros(64, dtype=cupy.uint64)
    handles[rank] = bytes(rt.ipcGetMemHandle(flags.data.ptr))
    barrier.wait()
    ptrs = [flags.data.ptr if p == rank else rt.ipcOpenMemHandle(handles[p]) for p in range(world)]
    table = cupy.asarray(numpy.array(ptrs, dtype=numpy.uint64))
    done = cupy.zeros(1, dtype=cupy.int64)
    kernel = cupy.RawKernel(SRC, "barriers")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    barrier.wait()
    start.record()
    kernel((1,), (1,), (table, flags, numpy.int32(world), numpy.int32(rank), numpy.int64(rounds),
                        numpy.int64(limit_s * 1e9), done))
    end.record()
    end.synchronize()
    n = int(done.get()[0])
    ms = cupy.cuda.get_elapsed_time(start, end)
    q.put((rank, n, 1000.0 * ms / max(1, n)))
    barrier.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, action="append", required=True)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--limit-s", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    for world in args.world:
        manager = ctx.Manager()
        handles, barrier, q = manager.dict(), ctx.Barrier(world), ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, world, args.rounds, args.limit_s, args.connections,
                                                     handles, barrier, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = sorted(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        worst = max(us for _, _, us in got)
        print(f"W={world}: " + ", ".join(f"rank {r} {n} rounds {us:.1f} us" for r, n, us in got)
              + f"  -> worst {worst:.1f} us per barrier", flush=True)
        manager.shutdown()


if __name__ == "__main__":
    main()
