"""Do W MPS clients on one GPU run their kernels at the same time? An all-to-all flag barrier
through CUDA IPC, timed inside one launch, so host scheduling cannot enter the figure.

    barrier_us(8)          (bench/mps_barrier_probe.py prints it for several W)

Under the running MPS daemon (CUDA_MPS_PIPE_DIRECTORY, or ``env``), starts W processes; each exports a
flag array through CUDA IPC and maps its peers'. Then every rank launches one kernel (one
thread) that runs ``rounds`` barriers: it writes its round into its slot of every peer's array and waits
until all peers' slots in its own array reach it (giving up after ``limit_s``). Under MPS
the ranks' kernels run together (microseconds a barrier); time-sliced, each round costs a
slice (milliseconds). A job's per-call time in an emulated world also holds the skew of W
hosts' launches (8-12 ms a call at W = 8 on 1 x H200, where this barrier took 20 us:
bench/logs/mps_barrier_probe_h200_a25b474.log), so this is the test of concurrency.
"""

from __future__ import annotations

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


def _rank(rank: int, world: int, rounds: int, limit_s: float, env: dict[str, str], handles, barrier, q) -> None:
    try:
        _barriers(rank, world, rounds, limit_s, env, handles, barrier, q)
    except Exception as exc:  # noqa: BLE001 - reported, and the peers' waits broken, not hung
        barrier.abort()
        q.put((rank, 0, float("inf"), f"{type(exc).__name__}: {exc}"[:200]))


def _barriers(rank: int, world: int, rounds: int, limit_s: float, env: dict[str, str], handles, barrier, q) -> None:
    os.environ.update(env)
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
    q.put((rank, n, 1000.0 * ms / max(1, n), None))
    barrier.wait()


def barrier_us(world: int, rounds: int = 2000, limit_s: float = 5.0,
               env: dict[str, str] | None = None) -> list[tuple[int, int, float]]:
    """``(rank, rounds done, microseconds per barrier)`` of each of ``world`` processes that
    meet in ``rounds`` barriers within one launch each (``env``: added to theirs, e.g. a
    group's :attr:`~cuco.runtime.WorkerGroup.mps_env`)."""
    # one stream each: MPS clients own their work queues out of one pool, which a group's
    # workers beside these already draw on (bench/mps_clients_probe.py)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", **(env or {})}
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    try:
        handles, barrier, q = manager.dict(), ctx.Barrier(world), ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, world, rounds, limit_s, env, handles, barrier, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        got = sorted(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        errors = [f"rank {r}: {e}" for r, _, _, e in got if e]
        if errors:
            raise RuntimeError("MPS barrier probe: " + "; ".join(errors))
        return [(r, n, us) for r, n, us, _ in got]
    finally:
        manager.shutdown()
