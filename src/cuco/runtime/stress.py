"""Stress for checked calls that the kernel under test cannot see.

A race (a reader that runs ahead of its producer's flag) is wrong only when the
producer happens to be late. Checked calls make it late on purpose, from outside
the kernel: its arguments are the same as in any timed call, so a candidate
cannot tell a checked call from a timed one by looking at them.

* **skew**: one rank, drawn per call, holds its stream before the call, for a time drawn
  log-uniformly from :data:`SKEW_US` (tens of microseconds to milliseconds), so its peers'
  readers meet poison where they skip a wait, even a wait that a whole phase of their own
  work (a local attention block, a first GEMM) would otherwise cover;
* **hog**: a kernel on a second stream occupies some SMs for some microseconds with
  a large shared-memory footprint, so a persistent kernel's CTAs on those SMs start
  late and readers inside one rank (communication CTAs, comm warps) meet poison.

Both end on their own (a clock), so they can delay a call but never deadlock it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.runtime.timing import spin

_HOG_SRC = r"""
extern "C" __global__ void cuco_hog(long long ns) {
  extern __shared__ char hold[];
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (threadIdx.x == 0 && now < 0) hold[0] = 1;  // keeps the shared memory allocated
}
"""
#: Shared memory each hog CTA holds: no CTA of a fused kernel fits beside it.
HOG_SMEM = 160 * 1024
#: Microseconds the stressed stream waits so the hog is resident before the call starts.
HOG_LEAD_US = 5.0
#: The skew's range in microseconds, drawn log-uniformly: a fixed 10-80 us let a reader that
#: skips its wait behind a longer phase of its own go unseen (a CP variant whose compute stream
#: attends a peer's K/V without waiting, behind its local block, scored correct), and every
#: decade between these bounds is drawn as often.
SKEW_US = (10.0, 4000.0)
_hog = None


def _hog_kernel():
    global _hog
    if _hog is None:
        import cupy
        _hog = cupy.RawKernel(_HOG_SRC, "cuco_hog")
        _hog.max_dynamic_shared_size_bytes = HOG_SMEM
    return _hog


@dataclass(frozen=True)
class Stress:
    """One checked call's stress, drawn from the job's schedule (the same on every rank)."""

    skew_rank: int
    skew_us: float
    hog_sms: int
    hog_us: float

    @classmethod
    def draw(cls, rng, world_size: int, sms: int) -> "Stress":
        lo, hi = SKEW_US
        return cls(skew_rank=rng.randrange(world_size), skew_us=lo * (hi / lo) ** rng.random(),
                   hog_sms=rng.randrange(1, max(2, sms // 2)), hog_us=rng.uniform(2 * HOG_LEAD_US, 60.0))

    def before(self, ctx, stream, hog_stream) -> None:
        """Start the hog beside ``stream``, then hold ``stream`` a little (the hog becomes
        resident first) and longer on the skewed rank; :meth:`after` joins the hog."""
        import cupy
        import numpy
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(stream)
        hog_stream.wait_event(ev)
        _hog_kernel()((self.hog_sms,), (128,), (numpy.int64(self.hog_us * 1000),),
                      stream=hog_stream, shared_mem=HOG_SMEM)
        skewed = ctx.rank == self.skew_rank and ctx.world_size > 1
        spin(stream, HOG_LEAD_US + (self.skew_us if skewed else 0.0))

    @staticmethod
    def after(stream, hog_stream) -> None:
        import cupy
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(hog_stream)
        stream.wait_event(ev)
