"""What this machine can do, and the least time a call's work can take on it.

Rates are measured once per worker: ``gemm_tflops``, the best bf16 GEMM rate cuBLAS
reaches at 8192^3 on random data; ``hbm_gbs``, a device-to-device copy of 1 GiB (bytes
read + written); ``link_gbs``, NCCL all-gather bus bandwidth at 256 MiB per rank (0 on
one GPU).

The physical floor under a call's time is what the hardware cannot beat: a kernel faster than the work it must do allows (its per-rank GEMM at the measured
peak GEMM rate, its bytes through HBM at the measured copy rate, the bytes it must
receive over the links at the measured link rate) did less than the workload asks and
is ``suspect``. Each rate gets headroom (an honest kernel is never flagged): GEMM and
HBM 1.15x what cuBLAS and a copy reach; links 2x NCCL's all-gather bus bandwidth
(NCCL reaches about half of NVLink's rate at 256 MiB; cuco's own kernels beat NCCL by
up to 1.85x). The old rule (0.98 x the vendor GEMM or NCCL alone) flagged honest
in-kernel GEMMs that beat cuBLAS and missed a kernel that skips its communication; it
stays a reported number (``bound_ms``, for overlap efficiency), not a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuco.runtime.records import ProgramResult


@dataclass(frozen=True)
class Work:
    """What one rank must do in one call: floating-point operations, bytes through HBM
    (each operand and result once), bytes it must receive from its peers."""

    flops: float
    hbm_bytes: float
    link_bytes: float


#: Headroom over the measured rates.
COMPUTE_HEADROOM = 1.15
LINK_HEADROOM = 2.0


def physical_floor_ms(work: Work | None, peaks: dict[str, float]) -> float:
    """Milliseconds below which no honest call can run (0 when the work is unknown)."""
    if work is None or not peaks:
        return 0.0
    terms = [work.flops / (peaks["gemm_tflops"] * COMPUTE_HEADROOM * 1e9),
             work.hbm_bytes / (peaks["hbm_gbs"] * COMPUTE_HEADROOM * 1e6)]
    if work.link_bytes and peaks.get("link_gbs"):
        terms.append(work.link_bytes / (peaks["link_gbs"] * LINK_HEADROOM * 1e6))
    return max(terms)


def below_floor(rec: ProgramResult) -> bool:
    """Whether a merged record (``ms`` max over ranks, ``floor_ms`` least over ranks) ran
    faster than its physical floor: it did less than its workload asks."""
    return bool(rec.floor_ms) and rec.ms is not None and rec.ms < rec.floor_ms


def _best_ms(fn, stream, reps: int = 5) -> float:
    import cupy
    fn()
    best = float("inf")
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(a, b))
    return best


@dataclass
class MeasurePeaks:
    """A job: this rank's measured peaks (cached in the worker)."""

    gemm_size: int = 8192
    copy_bytes: int = 1 << 30
    gather_bytes: int = 256 << 20

    def __call__(self, ctx) -> dict[str, Any]:
        cached = ctx.scratch.get("peaks")
        if cached is not None:
            return cached
        s = ctx.stream
        with s:  # each measurement's buffers are freed before the next one allocates
            rates = {"gemm_tflops": self._gemm_tflops(s), "hbm_gbs": self._copy_gbs(s),
                     "link_gbs": self._gather_gbs(ctx, s) if ctx.world_size > 1 else 0.0}
        ctx.scratch["peaks"] = rates
        return rates

    def _gemm_tflops(self, s) -> float:
        from cuco.runtime import dtypes
        from cuco.runtime.cublas import gemm
        n = self.gemm_size
        a, b = dtypes.random(n * n, "bf16", 11), dtypes.random(n * n, "bf16", 12)
        c = dtypes.empty(n * n, "bf16")
        ms = _best_ms(lambda: gemm(int(a.data.ptr), int(b.data.ptr), int(c.data.ptr), n, n, n, "bf16", s), s)
        return 2 * n ** 3 / ms / 1e9

    def _copy_gbs(self, s) -> float:
        import cupy
        src = cupy.ones(self.copy_bytes, dtype=cupy.uint8)
        dst = cupy.empty_like(src)
        return 2 * self.copy_bytes / _best_ms(lambda: dst.__setitem__(Ellipsis, src), s) / 1e6

    def _gather_gbs(self, ctx, s) -> float:
        import cupy
        w, count = ctx.world_size, self.gather_bytes // 2
        send = cupy.ones(count, dtype=cupy.uint16)
        recv = cupy.empty(count * w, dtype=cupy.uint16)
        ms = _best_ms(lambda: ctx.comm.all_gather(int(send.data.ptr), int(recv.data.ptr), count, "bf16", s.ptr), s)
        return (w - 1) * self.gather_bytes / ms / 1e6
