"""CUDA-event timing inside a worker: warm-up, many samples, interleaved variants.

Variants are timed interleaved within one loop, in a balanced order that changes
every round (:func:`balanced_order`), so that clock and thermal drift, and what one
variant leaves behind for the next, hit all of them alike; every rank runs the same
order, since collective kernels wait for their peers.

Before each sample a short spin kernel keeps the GPU busy while the host
enqueues the timed call, so the events measure device time and not the host's
launch latency (what a CUDA graph or a host running ahead would see). Without
it, a microsecond-scale kernel's time is mostly the CPU's enqueue cost.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


_SPIN_SRC = r"""
extern "C" __global__ void cuco_spin(long long ns) {
  long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  long long now = start;
  while (now - start < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}
"""
_spin = None


def _spin_kernel():
    global _spin
    if _spin is None:
        import cupy
        _spin = cupy.RawKernel(_SPIN_SRC, "cuco_spin")
    return _spin


def balanced_order(names: list[str], i: int) -> list[str]:
    """Round ``i``'s order of ``names``: row ``i`` of a Williams design (a Latin square whose
    rows put every variant right after each of the others exactly once over ``len(names)``
    rounds, and in every position once). An odd count takes the design of one more with the
    extra left out: over ``len(names) + 1`` rounds every variant then follows each other
    once or twice. What a call leaves behind for the next one (clocks lowered by a
    power-hungry kernel, a warm or cold cache) so weighs on every variant about alike; a
    fixed or merely rotated order (A B C, B C A, ...) would put each variant after the same
    neighbour in almost every round."""
    n = len(names)
    if n == 0:
        return []
    m = design_rounds(n)
    first, lo, hi = [0], 1, m - 1
    while len(first) < m:  # 0, 1, m-1, 2, m-2, ...
        first.append(lo)
        lo += 1
        if len(first) < m:
            first.append(hi)
            hi -= 1
    k = i % m
    return [names[j] for j in ((x + k) % m for x in first) if j < n]


def design_rounds(n: int) -> int:
    """Rounds of :func:`balanced_order`'s design for ``n`` variants: ``n``, or ``n + 1``
    when odd (a Williams square needs an even order)."""
    return n + (n % 2)


def spin(stream, us: float) -> None:
    """Keep ``stream`` busy for ``us`` microseconds (a one-thread clock spin)."""
    import numpy
    _spin_kernel()((1,), (1,), (numpy.int64(us * 1000),), stream=stream)


def time_interleaved(fns: dict[str, Callable[[], None]], stream, *, warmup: int = 5,
                     iters: int = 30, l2_flush_bytes: int = 0, busy_us: float = 40.0,
                     align: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call for each variant: ``iters`` samples after ``warmup`` rounds.

    ``busy_us`` > 0 runs a spin kernel of that length before each sample (see module doc).
    ``align`` (e.g. a one-element all-reduce) is enqueued before each sample so
    every rank starts it together: a variant without a closing barrier would
    otherwise leave the ranks skewed and charge the skew to whatever comes next.
    """
    import cupy

    if iters < 1:
        raise ValueError("iters must be >= 1")
    names = list(fns)
    flush = cupy.empty(l2_flush_bytes, dtype=cupy.uint8) if l2_flush_bytes else None
    with stream:
        for _ in range(warmup):
            for name in names:
                fns[name]()
        marks: dict[str, list[tuple]] = {n: [] for n in names}
        for i in range(iters):
            for name in balanced_order(names, i):
                if flush is not None:
                    flush.fill(i & 0xFF)
                if align is not None:
                    align()
                if busy_us > 0:
                    spin(stream, busy_us)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                fns[name]()
                end.record(stream)
                marks[name].append((start, end))
        stream.synchronize()
    return {n: [cupy.cuda.get_elapsed_time(s, e) for s, e in marks[n]] for n in names}


def median(samples: list[float]) -> float:
    return float(statistics.median(samples))
