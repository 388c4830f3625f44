"""The fastest honest host collective: NCCL on plain buffers or on buffers registered as
symmetric windows (``ncclCommWindowRegister``), chosen once per size.

Registration lets NCCL use its symmetric kernels; on 2 GPUs without multicast it did not
help at large sizes (DEVICE.md), small ones may differ, so both are timed for the size
at hand (interleaved, CUDA events, median, the slowest rank's time) and the faster is
used. Registered buffers are NCCL windows kept per size in the worker (the two most
recent sizes; older ones are freed, collectively, when a new size comes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuco.runtime import dtypes
from cuco.runtime.host_gemm import TIME_ITERS, TIME_WARMUP, UNUSABLE_MS, agree, fastest

PLAIN = "nccl_plain"
REGISTERED = "nccl_registered"
#: Sizes whose windows a worker keeps (an evaluator alternates a small and a full shape).
KEPT_SIZES = 2


def elements(kind: str, count: int, world_size: int) -> tuple[int, int]:
    """``(send, recv)`` elements of a collective of ``count`` (NCCL's count: all-reduce the
    elements, reduce-scatter those received, all-gather those sent)."""
    if kind == "all_reduce":
        return count, count
    if kind == "reduce_scatter":
        return count * world_size, count
    if kind == "all_gather":
        return count, count * world_size
    raise ValueError(f"unknown collective {kind!r}; one of all_reduce, reduce_scatter, all_gather")


def launch(ctx, kind: str, send: int, recv: int, count: int, dtype: str) -> None:
    """One NCCL collective on the worker's stream."""
    getattr(ctx.comm, kind)(send, recv, count, dtype, ctx.stream.ptr)


def window_array(ctx, tag: str, role: str, elems: int, dtype: str):
    """``elems`` of ``dtype`` in a registered window of this worker, named ``role`` among the
    windows of ``tag`` (a size); a new tag frees the windows of the oldest beyond
    :data:`KEPT_SIZES`. Collective: every rank asks for the same windows in the same order."""
    import cupy
    kept: OrderedDict[str, dict[str, Any]] = ctx.scratch.setdefault("host_windows", OrderedDict())
    if tag not in kept:
        while len(kept) >= KEPT_SIZES:
            for w in kept.popitem(last=False)[1].values():
                ctx.comm.free_window(w)
        kept[tag] = {}
    kept.move_to_end(tag)
    nbytes = elems * dtypes.ITEMSIZE[dtype]
    w = kept[tag].get(role)
    if w is None or w.size < nbytes:
        if w is not None:
            ctx.comm.free_window(w)
        w = kept[tag][role] = ctx.comm.alloc_window(nbytes)
    mem = cupy.cuda.UnownedMemory(w.ptr, nbytes, w)
    return cupy.ndarray((elems,), dtype=dtypes.STORAGE[dtype], memptr=cupy.cuda.MemoryPointer(mem, 0))


@dataclass
class HostCollective:
    """The chosen way to run one collective of one size: ``name`` is :data:`PLAIN` or
    :data:`REGISTERED`; ``times_ms`` each way's time (max over ranks)."""

    kind: str
    count: int
    dtype: str
    name: str
    times_ms: dict[str, float]
    rejected: dict[str, str]

    @property
    def registered(self) -> bool:
        return self.name == REGISTERED

    @property
    def tag(self) -> str:
        return f"{self.kind}/{self.count}/{self.dtype}"

    def buffer(self, ctx, role: str, plain):
        """Where the data of ``role`` (``"send"`` or ``"recv"``) lives: ``plain`` (a CuPy
        array) when NCCL runs on plain buffers, else a window of the same size."""
        return window_array(ctx, self.tag, role, plain.size, self.dtype) if self.registered else plain

    def holding(self, ctx, data):
        """``data`` (an input that never changes) where the collective may send it from: itself
        on plain buffers, else a window holding a copy (what a user whose producer writes into
        symmetric memory has), made once per input buffer."""
        if not self.registered:
            return data
        win = window_array(ctx, self.tag, f"input@{int(data.data.ptr):x}", data.size, self.dtype)
        win[...] = data.reshape(-1)
        return win

    def bind(self, ctx, send, recv) -> Callable[[], None]:
        """The collective from ``send`` to ``recv`` (CuPy arrays) as a call, which keeps both
        alive (a call replayed after its buffers were freed would write the pool's next block)."""
        s, r, kind, count, dtype = int(send.data.ptr), int(recv.data.ptr), self.kind, self.count, self.dtype

        def call() -> None:
            launch(ctx, kind, s, r, count, dtype)
        call.keepalive = (send, recv)  # type: ignore[attr-defined]
        return call

    def notes(self) -> dict[str, Any]:
        return {"collective": self.name,
                "collective_ms": {n: t for n, t in self.times_ms.items() if t < UNUSABLE_MS},
                "collective_rejected": self.rejected}


def select(ctx, kind: str, count: int, dtype: str) -> HostCollective:
    """The faster of NCCL on plain and on registered buffers for this collective and size
    (cached per worker). Collective: every rank calls it in the same job."""
    cache = ctx.scratch.setdefault("host_collective", {})
    key = (kind, count, dtype)
    if key not in cache:
        cache[key] = _measure(ctx, kind, count, dtype)
    return cache[key]


def _measure(ctx, kind: str, count: int, dtype: str) -> HostCollective:
    import cupy
    from cuco.runtime.timing import median, time_interleaved
    n_send, n_recv = elements(kind, count, ctx.world_size)
    s = ctx.stream
    rejected: dict[str, str] = {}
    with s:
        send = dtypes.random(n_send, dtype, 5 + ctx.rank)
        recv = send if kind == "all_reduce" else dtypes.empty(n_recv, dtype)
        calls = {PLAIN: HostCollective(kind, count, dtype, PLAIN, {}, {}).bind(ctx, send, recv)}
        reg = HostCollective(kind, count, dtype, REGISTERED, {}, {})
        try:
            wsend = reg.buffer(ctx, "send", send)
            wsend[...] = send
            wrecv = wsend if kind == "all_reduce" else reg.buffer(ctx, "recv", recv)
            calls[REGISTERED] = reg.bind(ctx, wsend, wrecv)
        except Exception as exc:  # noqa: BLE001 - e.g. an NCCL without symmetric windows
            rejected[REGISTERED] = f"{type(exc).__name__}: {exc}"
        tick = cupy.ones(1, dtype=cupy.float32)
        p = int(tick.data.ptr)
        samples = time_interleaved(calls, s, warmup=TIME_WARMUP, iters=TIME_ITERS,
                                   align=lambda: ctx.comm.all_reduce(p, p, 1, "fp32", s.ptr))
    mine = {name: median(samples[name]) if name in samples else UNUSABLE_MS for name in (PLAIN, REGISTERED)}
    times = agree(ctx, mine)
    if times[REGISTERED] >= UNUSABLE_MS:
        rejected.setdefault(REGISTERED, "failed on another rank")
    return HostCollective(kind, count, dtype, fastest(times), times, rejected)
