"""Collective cases run inside the worker group: cuco's LSA / NVSHMEM kernels
against the host-launched NCCL collective, checked and timed in one job.

A :class:`CollectiveCase` is sent to every rank. Each rank draws its own
random input from ``seed + rank``, poisons every output with NaN, runs the
host NCCL reference in fp32 and every variant, compares every element, then
times all variants interleaved, and returns a typed
:class:`~cuco.runtime.records.RankResult`. The parent merges the ranks
(:func:`cuco.runtime.records.merge_ranks`: the max time over ranks). Its timed calls
are not verified: it is a benchmark of cuco's own collectives, not a candidate's score.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuco.runtime import dtypes
from cuco.runtime.checking import compare
from cuco.runtime.records import ProgramRecord, RankResult
from cuco.runtime.timing import median, time_interleaved

OPS = ("allreduce", "allgather", "reducescatter")

#: Variant names per op (host baseline first). Backend prefix per DESIGN.md.
VARIANTS = {
    "allreduce": ("host_nccl", "lsa_oneshot", "lsa_twoshot", "lsa_staged", "lsa_ll"),
    "allgather": ("host_nccl", "lsa_push", "lsa_staged", "nvshmem_putsignal"),
    "reducescatter": ("host_nccl", "lsa_pull", "lsa_staged", "lsa_ll"),
}

#: Staged (one-barrier) variants use 2 x world x size of staging memory: small sizes only.
STAGED_MAX_BYTES = 16 << 20
#: LL variants double the traffic (a flag per 4 bytes): latency-bound sizes only.
LL_MAX_BYTES = 4 << 20

THREADS = 512


def ulp_tolerance(dtype: str) -> float:
    """Relative tolerance of one rounding to ``dtype`` (fp32 accumulation, one final rounding)."""
    return {"bf16": 2.0**-7, "fp16": 2.0**-10, "fp32": 2.0**-20}[dtype]


@dataclass
class CollectiveCase:
    """One op at one size (bytes of each rank's input) on every rank."""

    op: str
    nbytes: int
    dtype: str = "bf16"
    variants: tuple[str, ...] = ()
    ctas: tuple[int, ...] = (8, 16, 32, 64)
    seed: int = 0
    warmup: int = 10
    iters: int = 50
    check: bool = True
    time: bool = True
    lsa_cubin: str = ""
    nvshmem_cubin: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op {self.op!r} is not one of {OPS}")
        if not self.variants:
            self.variants = tuple(v for v in VARIANTS[self.op] if self._offered(v))

    def _offered(self, variant: str) -> bool:
        """Whether a variant applies at this size (LL needs 16-byte blocks per rank)."""
        if variant == "lsa_staged":
            return self.nbytes <= STAGED_MAX_BYTES
        if variant == "lsa_ll":  # and 16-byte blocks per rank, checked on the worker
            return self.nbytes <= LL_MAX_BYTES
        return True

    # ------------------------------------------------------------------ worker side
    def __call__(self, ctx) -> RankResult:
        import cupy

        W, me, dt = ctx.world_size, ctx.rank, self.dtype
        esz = dtypes.ITEMSIZE[dt]
        n = self.nbytes // esz  # elements of this rank's input
        s = ctx.stream
        comm = ctx.comm
        nout = {"allreduce": n, "allgather": n * W, "reducescatter": n // W}[self.op]
        if self.op == "reducescatter" and n % W:
            raise ValueError(f"reducescatter input of {n} elements does not split over {W} ranks")
        with s:
            x = dtypes.random(n, dt, self.seed * 1000 + me)
            x32 = dtypes.to_float32(x, dt)
            ref = cupy.empty(nout, dtype=cupy.float32)
            ptr = lambda a: int(a.data.ptr)  # noqa: E731
            if self.op == "allreduce":
                comm.all_reduce(ptr(x32), ptr(ref), n, "fp32", s.ptr)
            elif self.op == "allgather":
                comm.all_gather(ptr(x32), ptr(ref), n, "fp32", s.ptr)
            else:
                comm.reduce_scatter(ptr(x32), ptr(ref), nout, "fp32", s.ptr)
            # buffers: the window holds [input | output] so peers can read or push
            win = ctx.scratch.get("window")
            page = lambda b: -(-b // 4096) * 4096  # noqa: E731
            slot_elems = n // W if self.op == "reducescatter" else n
            slot_bytes = page(slot_elems * esz)
            in_off, out_off = 0, page(self.nbytes)
            stage_off = out_off + page(nout * esz)
            staged = "lsa_staged" in self.variants
            variants = [v for v in self.variants
                        if v != "lsa_ll" or (slot_elems * esz) % 16 == 0]
            ll_off = stage_off + (2 * W * slot_bytes if staged else 0)
            ll_bytes = 4 * W * slot_bytes if "lsa_ll" in variants else 0
            need = ll_off + ll_bytes
            if win is None or win.size < need:
                if win is not None:
                    ctx.comm.free_window(win)
                win = ctx.comm.alloc_window(need)
                ctx.scratch["window"] = win
            win_in = _view(win.ptr + in_off, n, dt, win)
            win_out = _view(win.ptr + out_off, nout, dt, win)
            win_in[...] = x
            if ll_bytes:  # no stale word may look like a flag of this run's epochs
                cupy.cuda.runtime.memsetAsync(win.ptr + ll_off, 0, ll_bytes, s.ptr)
            host_in = x.copy()
            out = dtypes.empty(nout, dt)
            nv = self._nvshmem_buffers(ctx, n, nout) if "nvshmem_putsignal" in self.variants else None
            if nv is not None:
                nv["src"][...] = x
            s.synchronize()

        launches = {}
        for v in variants:
            if v == "host_nccl":
                launches[v] = (self._host(comm, host_in, out, n, nout, s), out)
            elif v == "lsa_staged":
                for c in self.ctas:
                    launches[f"{v}@{c}"] = self._staged(ctx, c, win, in_off, stage_off, slot_bytes,
                                                        out, slot_elems)
            elif v == "lsa_ll":
                for c in self.ctas:
                    launches[f"{v}@{c}"] = self._ll(ctx, c, win, in_off, ll_off, 2 * slot_bytes,
                                                    out, slot_elems)
            elif v.startswith("lsa"):
                for c in self.ctas:
                    launches[f"{v}@{c}"] = self._lsa(ctx, v, c, win, in_off, out_off, out, win_out, n)
            elif v == "nvshmem_putsignal":
                for c in self.ctas:
                    launches[f"{v}@{c}"] = (self._nvshmem(ctx, nv, c), nv["dst_view"])

        programs: dict[str, ProgramRecord] = {}
        for name, (fn, target) in launches.items():
            rec = programs[name] = ProgramRecord(verified=self.check)
            if self.check:
                with s:
                    dtypes.poison(target, dt)
                    fn()
                    if name == "host_nccl" and self.op != "allgather" and W > 2:
                        got = self._ring_check(comm, x32, target, ref, nout, s, W)
                    else:
                        got = compare(target, ref, dt, ulp_tolerance(dt), 1e-6)
                s.synchronize()
                rec.correct, rec.bad_elements = got["correct"], got["bad_elements"]
                rec.rel_l2_error = rec.checked_l2 = got["rel_l2_error"]
                rec.calls_verified = rec.calls_checked = 1
        if self.time:
            samples = time_interleaved({k: f for k, (f, _) in launches.items()}, s,
                                       warmup=self.warmup, iters=self.iters)
            for name, ms in samples.items():
                programs[name].median_ms, programs[name].samples = median(ms), len(ms)
        return RankResult(me, programs)

    def _ring_check(self, comm, x32, got, ref, nout: int, s, world: int) -> dict[str, Any]:
        """NCCL's own reduction, checked as what it is: its ring adds in the data type and
        rounds after each of its W - 1 steps, each rounding relative to a partial sum, not to
        the result (4 ranks' bf16 all-reduce missed a one-rounding bound in 32700 of 100003
        elements). So each element may be off by (W - 1) roundings of sum_i |x_i| (fp32,
        from a second all-reduce of |x|); a wrong or unwritten element still fails."""
        import cupy
        mag = cupy.empty(nout, dtype=cupy.float32)
        ax = cupy.abs(x32)
        p_in, p_out = int(ax.data.ptr), int(mag.data.ptr)
        if self.op == "allreduce":
            comm.all_reduce(p_in, p_out, nout, "fp32", s.ptr)
        else:
            comm.reduce_scatter(p_in, p_out, nout, "fp32", s.ptr)
        got32 = dtypes.to_float32(got, self.dtype)
        err = cupy.abs(got32 - ref)
        bad = ~(err <= (world - 1) * ulp_tolerance(self.dtype) * mag + 1e-6)  # NaN fails
        n_bad = int(bad.sum())
        l2 = float(cupy.linalg.norm(cupy.nan_to_num(got32 - ref, nan=1e30)) / (cupy.linalg.norm(ref) or 1.0))
        return {"correct": n_bad == 0, "bad_elements": n_bad, "rel_l2_error": l2,
                "max_abs_error": float(cupy.nan_to_num(err, nan=float("inf")).max())}

    def _host(self, comm, x, out, n, nout, s):
        p_in, p_out = int(x.data.ptr), int(out.data.ptr)
        if self.op == "allreduce":
            return lambda: comm.all_reduce(p_in, p_out, n, self.dtype, s.ptr)
        if self.op == "allgather":
            return lambda: comm.all_gather(p_in, p_out, n, self.dtype, s.ptr)
        return lambda: comm.reduce_scatter(p_in, p_out, nout, self.dtype, s.ptr)

    def _lsa(self, ctx, variant, ctas, win, in_off, out_off, out, win_out, n):
        dc = ctx.devcomm
        if ctas > dc.lsa_barriers:
            raise ValueError(f"{ctas} CTAs need >= {ctas} LSA barriers (have {dc.lsa_barriers})")
        u64 = np.uint64
        kname = {"lsa_oneshot": "allreduce_oneshot", "lsa_twoshot": "allreduce_twoshot",
                 "lsa_push": "allgather_push", "lsa_pull": "reducescatter_pull"}[variant]
        fn = ctx.function(self.lsa_cubin, kname)
        s = ctx.stream
        if variant in ("lsa_oneshot", "lsa_pull"):
            args = (u64(dc.ptr), u64(win.handle), u64(in_off), out, u64(n if variant == "lsa_oneshot" else n // ctx.world_size))
            target = out
        else:
            args = (u64(dc.ptr), u64(win.handle), u64(in_off), u64(out_off), u64(n))
            target = win_out
        return (lambda: fn((ctas,), (THREADS,), args, stream=s)), target

    def _staged(self, ctx, ctas, win, in_off, stage_off, slot_bytes, out, n):
        # one counter for every staged launch on this rank: the staging halves must alternate
        return self._counted(ctx, ctas, win, "staged", "stage_calls", np.int32,
                             lambda c: c & 1, (in_off, stage_off, slot_bytes), out, n)

    def _ll(self, ctx, ctas, win, in_off, ll_off, slot_bytes, out, n):
        # one epoch counter for every LL launch on this rank: flags and halves follow it
        return self._counted(ctx, ctas, win, "ll", "ll_epoch", np.uint32,
                             lambda c: c & 0xFFFFFFFF, (in_off, ll_off, slot_bytes), out, n)

    def _counted(self, ctx, ctas, win, suffix, counter, ctype, value, offsets, out, n):
        """A launch whose last scalar comes from a per-rank counter shared by its kind."""
        dc = ctx.devcomm
        fn = ctx.function(self.lsa_cubin, f"{self.op}_{suffix}")
        u64 = np.uint64

        def launch():
            c = ctx.scratch[counter] = ctx.scratch.get(counter, 0) + 1
            fn((ctas,), (THREADS,), (u64(dc.ptr), u64(win.handle), *map(u64, offsets),
                                     ctype(value(c)), out, u64(n)), stream=ctx.stream)
        return launch, out

    def _nvshmem_buffers(self, ctx, n, nout):
        import cupy
        if ctx.nvshmem is None:
            raise RuntimeError("nvshmem variants need WorkerGroup(nvshmem=True)")
        key = ("nvshmem", self.nbytes, self.dtype)
        bufs = ctx.scratch.get(key)
        if bufs is None:
            for old in [k for k in ctx.scratch if isinstance(k, tuple) and k[0] == "nvshmem"]:
                for a in ("src", "dst", "sig"):
                    ctx.nvshmem.free(int(ctx.scratch[old][a].data.ptr))
                del ctx.scratch[old]
            st = dtypes.STORAGE[self.dtype]
            bufs = {"src": ctx.nvshmem.array((n,), st), "dst": ctx.nvshmem.array((nout,), st),
                    "sig": ctx.nvshmem.array((2 * ctx.world_size * 1024,), cupy.uint64)}
            bufs["sig"].fill(0)
            bufs["dst_view"] = bufs["dst"]
            ctx.scratch[key] = bufs
            ctx.scratch.setdefault("nvshmem_epoch", 0)
            cupy.cuda.runtime.deviceSynchronize()
            ctx.nvshmem.barrier_all()
        return bufs

    def _nvshmem(self, ctx, bufs, ctas):
        fn = ctx.function(self.nvshmem_cubin, "allgather_putsignal")
        u64 = np.uint64

        def launch():
            ctx.scratch["nvshmem_epoch"] += 1
            fn((ctas,), (THREADS,), (bufs["src"], bufs["dst"], u64(self.nbytes), bufs["sig"],
                                     u64(ctx.scratch["nvshmem_epoch"])), stream=ctx.stream)
        return launch


def _view(ptr: int, n: int, dtype: str, owner):
    import cupy
    nbytes = n * dtypes.ITEMSIZE[dtype]
    mem = cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), owner)
    return cupy.ndarray((n,), dtype=dtypes.STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0))
