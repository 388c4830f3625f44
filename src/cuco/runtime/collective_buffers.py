"""The buffers cuco's own collective kernels work in on one rank, for one job.

The LSA window (:class:`WindowLayout`: an input region per input set, which peers read; the
output region between two guard pages, which peers push into; the staged and LL variants'
halves), kept per worker and grown when a job needs more, and NVSHMEM's symmetric buffers
(:class:`NvshmemBuffers`: a source per input set, the guarded output, the signals).
:class:`CollectiveBuffers` fills them for a job; :mod:`cuco.runtime.collective_launch`
launches the kernels on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuco.runtime import dtypes
from cuco.runtime.arena import CANARY, GUARD_BYTES, PAGE

#: Signal slots per PE of the put-with-signal kernel (``kSigStride``: one per CTA).
SIG_STRIDE = 1024


def page(n: int) -> int:
    """``n`` bytes rounded up to whole pages."""
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True)
class Extent:
    """One rank's side of a collective, in elements of ``dtype``: its input, its output and
    what it sends each peer (NCCL's count)."""

    dtype: str
    in_elems: int
    out_elems: int
    count: int

    def nbytes(self, elems: int) -> int:
        return elems * dtypes.ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class WindowLayout:
    """Byte offsets of one job's buffers in the LSA window: an input region per input set
    (peers read them), the output region between two guard pages (peers push into it), the
    staged variants' two halves and the LL variants' two halves (a slot per rank each)."""

    inputs: tuple[int, ...]
    guards: tuple[int, int]
    out: int
    stage: int
    ll: int
    slot_bytes: int
    ll_bytes: int
    size: int

    @classmethod
    def build(cls, in_bytes: int, out_bytes: int, slot_bytes: int, world_size: int, n_sets: int,
              staged: bool, ll: bool) -> "WindowLayout":
        inputs = tuple(i * page(in_bytes) for i in range(n_sets))
        before = n_sets * page(in_bytes)
        out = before + GUARD_BYTES
        after = out + page(out_bytes)
        stage = after + GUARD_BYTES
        ll_at = stage + (2 * world_size * slot_bytes if staged else 0)
        ll_bytes = 4 * world_size * slot_bytes if ll else 0
        return cls(inputs, (before, after), out, stage, ll_at, slot_bytes, ll_bytes, ll_at + ll_bytes)


@dataclass
class NvshmemBuffers:
    """The put-with-signal variant's symmetric buffers: a source per input set, the output
    between two guard pages, the signals (their epoch only grows, so they are never reset)."""

    key: tuple
    srcs: list
    dst: Any
    guards: tuple
    sig: Any
    owned: list
    epoch: int = 0

    @classmethod
    def allocate(cls, ctx, key: tuple, n_sets: int, n: int, nout: int, dtype: str) -> "NvshmemBuffers":
        import cupy
        if ctx.nvshmem is None:
            raise RuntimeError("nvshmem variants need WorkerGroup(nvshmem=True)")
        st, out_bytes = dtypes.STORAGE[dtype], nout * dtypes.ITEMSIZE[dtype]
        srcs = [ctx.nvshmem.array((n,), st) for _ in range(n_sets)]
        raw = ctx.nvshmem.array((2 * GUARD_BYTES + page(out_bytes),), cupy.uint8)
        sig = ctx.nvshmem.array((2 * ctx.world_size * SIG_STRIDE,), cupy.uint64)
        sig.fill(0)
        guards = (raw[:GUARD_BYTES], raw[GUARD_BYTES + page(out_bytes):])
        dst = raw[GUARD_BYTES:GUARD_BYTES + out_bytes].view(st)
        return cls(key, srcs, dst, guards, sig, [*srcs, raw, sig])

    def free(self, ctx) -> None:
        for a in self.owned:
            ctx.nvshmem.free(int(a.data.ptr))


@dataclass
class CollectiveBuffers:
    """One job's buffers on this rank: the local output (with its guards) the job gives,
    the window (kept per worker, grown when a job needs more) and NVSHMEM's buffers."""

    extent: Extent
    out: Any
    out_guards: tuple
    layout: WindowLayout
    window: Any = None
    window_out: Any = None
    window_guards: tuple = ()
    nvshmem: NvshmemBuffers | None = None
    cubins: dict[str, str] = field(default_factory=dict)

    @classmethod
    def prepare(cls, ctx, extent: Extent, inputs: list, out, out_guards: tuple, cubins: dict[str, str], *,
                backends: set[str], staged: bool, ll: bool) -> "CollectiveBuffers":
        """The buffers of ``backends`` (``lsa``: the window, with the staged and LL halves
        where asked; ``nvshmem``), each input set's input copied in, guards filled, LL flags
        zeroed; collective (every rank in step), on the job's stream."""
        e = extent
        layout = WindowLayout.build(e.nbytes(e.in_elems), e.nbytes(e.out_elems), page(e.nbytes(e.count)),
                                    ctx.world_size, len(inputs), staged, ll)
        bufs = cls(extent, out, out_guards, layout, cubins=cubins)
        if "lsa" in backends:
            bufs._fill_window(ctx, inputs)
        if "nvshmem" in backends:
            bufs._fill_nvshmem(ctx, inputs)
        # no peer may read or push into our buffers before they are filled: a collective orders that
        one = dtypes.empty(1, "fp32")
        one.fill(1)
        ctx.comm.all_reduce(int(one.data.ptr), int(one.data.ptr), 1, "fp32", ctx.stream.ptr)
        ctx.stream.synchronize()
        if "nvshmem" in backends:
            ctx.nvshmem.barrier_all()
        return bufs

    def _fill_window(self, ctx, inputs: list) -> None:
        import cupy
        lay, s = self.layout, ctx.stream
        win = ctx.scratch.get("collective_window")
        if win is None or win.size < lay.size:
            if win is not None:
                ctx.comm.free_window(win)
            win = ctx.scratch["collective_window"] = ctx.comm.alloc_window(lay.size)
        self.window = win
        for off, x in zip(lay.inputs, inputs):
            window_view(win, off, x.size, self.extent.dtype)[...] = x
        for g in lay.guards:
            cupy.cuda.runtime.memsetAsync(win.ptr + g, CANARY, GUARD_BYTES, s.ptr)
        if lay.ll_bytes:  # no stale word may look like a flag of this run's epochs
            cupy.cuda.runtime.memsetAsync(win.ptr + lay.ll, 0, lay.ll_bytes, s.ptr)
        self.window_out = window_view(win, lay.out, self.extent.out_elems, self.extent.dtype)
        self.window_guards = tuple(window_bytes(win, g, GUARD_BYTES) for g in lay.guards)
        ctx.devcomm  # noqa: B018  (made collectively, after the window: every rank is in step here)

    def _fill_nvshmem(self, ctx, inputs: list) -> None:
        import cupy
        e = self.extent
        key = (len(inputs), e)
        held = ctx.scratch.get("collective_nvshmem")
        if held is None or held.key != key:
            if held is not None:
                held.free(ctx)
            held = ctx.scratch["collective_nvshmem"] = NvshmemBuffers.allocate(
                ctx, key, len(inputs), e.in_elems, e.out_elems, e.dtype)
            cupy.cuda.runtime.deviceSynchronize()
            ctx.nvshmem.barrier_all()
        for src, x in zip(held.srcs, inputs):
            src[...] = x
        for g in held.guards:
            g.fill(CANARY)
        self.nvshmem = held

    def lsa_args(self, ctx, ctas: int) -> tuple:
        dc = ctx.devcomm
        if ctas > dc.lsa_barriers:
            raise ValueError(f"{ctas} CTAs need >= {ctas} LSA barriers (have {dc.lsa_barriers})")
        return (np.uint64(dc.ptr), np.uint64(self.window.handle))


def window_view(win, offset: int, n: int, dtype: str):
    """``n`` elements of ``dtype`` at byte ``offset`` of ``win``, as a CuPy array that keeps
    the window alive."""
    return _window_array(win, offset, n, dtypes.STORAGE[dtype], dtypes.ITEMSIZE[dtype])


def window_bytes(win, offset: int, n: int):
    """``n`` bytes at byte ``offset`` of ``win`` (a guard page)."""
    return _window_array(win, offset, n, "uint8", 1)


def _window_array(win, offset: int, n: int, storage: str, itemsize: int):
    import cupy
    mem = cupy.cuda.UnownedMemory(win.ptr + offset, max(n * itemsize, 1), win)
    return cupy.ndarray((n,), dtype=storage, memptr=cupy.cuda.MemoryPointer(mem, 0))
