"""cuco's own collectives (its LSA and NVSHMEM kernels) and NCCL's, as one rank runs them.

The evaluator's verification job judges them like any program
(:class:`cuco.evaluate.collective_job.CollectiveCase`); this module is what runs on a worker:
the ops (:class:`CollectiveOp`) and the kernel variants each has (:data:`KERNEL_VARIANTS`),
each rank's input and its fp32 reference (:class:`CollectiveInputs`), the buffers the
kernels work in (:class:`CollectiveBuffers`: the LSA window laid out by
:class:`WindowLayout`, NVSHMEM's symmetric buffers) and one launch per variant, CTA count and
input set (:func:`kernel_call`, :func:`host_call`). A launch takes the same arguments in
every call of a job, checked or timed; the staged, LL and put-with-signal kernels' per-call
scalar comes from a per-rank counter that every rank advances in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuco.design.patterns import Collective
from cuco.runtime import dtypes
from cuco.runtime.arena import CANARY, GUARD_BYTES, PAGE
from cuco.runtime.host_collective import elements, launch

#: Staged (one-barrier) variants use 2 x world x size of staging memory: small sizes only.
STAGED_MAX_BYTES = 16 << 20
#: LL variants double the traffic (a flag per 4 bytes): latency-bound sizes only.
LL_MAX_BYTES = 4 << 20
THREADS = 512
#: Signal slots per PE of the put-with-signal kernel (``kSigStride``: one per CTA).
SIG_STRIDE = 1024


def _page(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True)
class CollectiveOp:
    """One collective: its name (the benchmark's and the kernels' spelling), NCCL's call,
    and cuco's kernel variants of it (:data:`KERNEL_VARIANTS`)."""

    name: str
    collective: Collective
    kernels: tuple[str, ...]

    def count(self, n: int, world_size: int) -> int:
        """NCCL's count for ``n`` input elements per rank: also what each rank sends each
        peer (a reduce-scatter's block)."""
        return n // world_size if self.collective is Collective.REDUCE_SCATTER else n

    def out_elems(self, n: int, world_size: int) -> int:
        return elements(self.collective.value, self.count(n, world_size), world_size)[1]

    def check_split(self, n: int, world_size: int) -> None:
        """A reduce-scatter's input must split into one block per rank."""
        if self.collective is Collective.REDUCE_SCATTER and n % world_size:
            raise ValueError(f"{self.name} input of {n} elements does not split over {world_size} ranks")


ALL_REDUCE = CollectiveOp("allreduce", Collective.ALL_REDUCE,
                          ("lsa_oneshot", "lsa_twoshot", "lsa_staged", "lsa_ll"))
ALL_GATHER = CollectiveOp("allgather", Collective.ALL_GATHER,
                          ("lsa_push", "lsa_staged", "nvshmem_putsignal"))
REDUCE_SCATTER = CollectiveOp("reducescatter", Collective.REDUCE_SCATTER,
                              ("lsa_pull", "lsa_staged", "lsa_ll"))
COLLECTIVE_OPS = {op.name: op for op in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)}
OPS = tuple(COLLECTIVE_OPS)


def collective_op(name: str) -> CollectiveOp:
    try:
        return COLLECTIVE_OPS[name]
    except KeyError:
        raise ValueError(f"op {name!r} is not one of {OPS}") from None


@dataclass(frozen=True)
class CollectiveInputs:
    """Each rank's input of one collective (``nbytes`` of ``dtype``, normal values from a
    seed) and its fp32 reference (NCCL's collective in fp32): what a job's input sets are
    drawn from, as they are from a workload."""

    op: CollectiveOp
    nbytes: int
    dtype: str

    @property
    def elems(self) -> int:
        return self.nbytes // dtypes.ITEMSIZE[self.dtype]

    @property
    def label(self) -> str:
        return f"{self.op.name}/{self.nbytes}B/{self.dtype}"

    def make_inputs(self, ctx, seed: int) -> dict[str, Any]:
        return {"x": dtypes.random(self.elems, self.dtype, 1000 * seed + ctx.rank)}

    def reference(self, ctx, inputs: dict[str, Any]):
        import cupy
        n, w = self.elems, ctx.world_size
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        ref = cupy.empty(self.op.out_elems(n, w), dtype=cupy.float32)
        launch(ctx, self.op.collective.value, int(x32.data.ptr), int(ref.data.ptr), self.op.count(n, w), "fp32")
        return ref


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
        inputs = tuple(i * _page(in_bytes) for i in range(n_sets))
        before = n_sets * _page(in_bytes)
        out = before + GUARD_BYTES
        after = out + _page(out_bytes)
        stage = after + GUARD_BYTES
        ll_at = stage + (2 * world_size * slot_bytes if staged else 0)
        ll_bytes = 4 * world_size * slot_bytes if ll else 0
        return cls(inputs, (before, after), out, stage, ll_at, slot_bytes, ll_bytes, ll_at + ll_bytes)


@dataclass(frozen=True)
class KernelVariant:
    """How one of cuco's collective kernels runs as a variant: its kernel in its backend's
    cubin (``{op}``: the op's name), the largest input it is offered for by default, and
    the alignment each rank's slot needs (else it is not run at that size)."""

    kernel: str
    backend: str  # "lsa" (the window) or "nvshmem" (the symmetric heap)
    make: Callable[..., "KernelCall"]
    max_bytes: int | None = None
    slot_align: int = 1

    @property
    def shares(self) -> tuple[str, ...]:
        """The buffers every variant of its backend shares (inputs, output, staging)."""
        return (f"{self.backend}:buffers",)

    def offered(self, nbytes: int) -> bool:
        return self.max_bytes is None or nbytes <= self.max_bytes

    def fits(self, op: CollectiveOp, n: int, world_size: int, dtype: str) -> bool:
        return (op.count(n, world_size) * dtypes.ITEMSIZE[dtype]) % self.slot_align == 0


@dataclass(frozen=True)
class KernelCall:
    """One variant's call on one input set, where its result lands and the guard pages
    around it."""

    call: Callable[[], None]
    output: Any
    guards: tuple


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
        raw = ctx.nvshmem.array((2 * GUARD_BYTES + _page(out_bytes),), cupy.uint8)
        sig = ctx.nvshmem.array((2 * ctx.world_size * SIG_STRIDE,), cupy.uint64)
        sig.fill(0)
        guards = (raw[:GUARD_BYTES], raw[GUARD_BYTES + _page(out_bytes):])
        dst = raw[GUARD_BYTES:GUARD_BYTES + out_bytes].view(st)
        return cls(key, srcs, dst, guards, sig, [*srcs, raw, sig])

    def free(self, ctx) -> None:
        for a in self.owned:
            ctx.nvshmem.free(int(a.data.ptr))


@dataclass
class CollectiveBuffers:
    """One job's buffers on this rank: the local output (with its guards) the job gives,
    the window (kept per worker, grown when a job needs more) and NVSHMEM's buffers."""

    data: CollectiveInputs
    world_size: int
    out: Any
    out_guards: tuple
    layout: WindowLayout
    window: Any = None
    window_out: Any = None
    window_guards: tuple = ()
    nvshmem: NvshmemBuffers | None = None
    cubins: dict[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.data.op.count(self.data.elems, self.world_size)

    @classmethod
    def prepare(cls, ctx, data: CollectiveInputs, inputs: list, variants: list[str], out, out_guards: tuple,
                cubins: dict[str, str]) -> "CollectiveBuffers":
        """Every buffer ``variants`` need, each input set's input copied in, guards filled,
        LL flags zeroed; collective (every rank in step), on the job's stream."""
        w, esz = ctx.world_size, dtypes.ITEMSIZE[data.dtype]
        n, op = data.elems, data.op
        layout = WindowLayout.build(data.nbytes, op.out_elems(n, w) * esz, _page(op.count(n, w) * esz), w,
                                    len(inputs), "lsa_staged" in variants, "lsa_ll" in variants)
        bufs = cls(data, w, out, out_guards, layout, cubins=cubins)
        backends = {KERNEL_VARIANTS[v].backend for v in variants}
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
            window_view(win, off, x.size, self.data.dtype)[...] = x
        for g in lay.guards:
            cupy.cuda.runtime.memsetAsync(win.ptr + g, CANARY, GUARD_BYTES, s.ptr)
        if lay.ll_bytes:  # no stale word may look like a flag of this run's epochs
            cupy.cuda.runtime.memsetAsync(win.ptr + lay.ll, 0, lay.ll_bytes, s.ptr)
        self.window_out = window_view(win, lay.out, self.data.op.out_elems(self.data.elems, self.world_size),
                                      self.data.dtype)
        self.window_guards = tuple(window_bytes(win, g, GUARD_BYTES) for g in lay.guards)
        ctx.devcomm  # noqa: B018  (made collectively, after the window: every rank is in step here)

    def _fill_nvshmem(self, ctx, inputs: list) -> None:
        import cupy
        d = self.data
        key = (len(inputs), d.nbytes, d.dtype, self.world_size)
        held = ctx.scratch.get("collective_nvshmem")
        if held is None or held.key != key:
            if held is not None:
                held.free(ctx)
            held = ctx.scratch["collective_nvshmem"] = NvshmemBuffers.allocate(
                ctx, key, len(inputs), d.elems, d.op.out_elems(d.elems, self.world_size), d.dtype)
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


def host_call(ctx, op: CollectiveOp, x, out, dtype: str) -> Callable[[], None]:
    """NCCL's collective from the host, ``x`` into ``out``, on the job's stream."""
    count, p_in, p_out = op.count(int(x.size), ctx.world_size), int(x.data.ptr), int(out.data.ptr)
    return lambda: launch(ctx, op.collective.value, p_in, p_out, count, dtype)


def kernel_call(ctx, variant: str, ctas: int, bufs: CollectiveBuffers, input_set: int) -> KernelCall:
    """``variant`` on ``ctas`` CTAs, reading input set ``input_set``."""
    kv = KERNEL_VARIANTS[variant]
    fn = ctx.function(bufs.cubins[kv.backend], kv.kernel.format(op=bufs.data.op.name))
    return kv.make(ctx, fn, ctas, bufs, input_set)


def _on_stream(ctx, fn, ctas: int, args: tuple) -> Callable[[], None]:
    s = ctx.stream
    return lambda: fn((ctas,), (THREADS,), args, stream=s)


def _barriers_to_local(ctx, fn, ctas, bufs, j) -> KernelCall:
    """A two-barrier kernel that reads every peer's input and writes a local output."""
    args = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), bufs.out, np.uint64(bufs.count))
    return KernelCall(_on_stream(ctx, fn, ctas, args), bufs.out, bufs.out_guards)


def _barriers_to_window(ctx, fn, ctas, bufs, j) -> KernelCall:
    """A two-barrier kernel that pushes into every peer's output region of the window."""
    args = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), np.uint64(bufs.layout.out),
            np.uint64(bufs.count))
    return KernelCall(_on_stream(ctx, fn, ctas, args), bufs.window_out, bufs.window_guards)


def _counted(ctx, fn, ctas, bufs, j, counter: str, scalar, area: int, slot_bytes: int) -> KernelCall:
    """A kernel whose last scalar comes from a per-rank counter shared by every launch of its
    kind (the halves it alternates between follow it)."""
    head = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), np.uint64(area), np.uint64(slot_bytes))
    tail = (bufs.out, np.uint64(bufs.count))
    s = ctx.stream

    def call() -> None:
        c = ctx.scratch[counter] = ctx.scratch.get(counter, 0) + 1
        fn((ctas,), (THREADS,), (*head, scalar(c), *tail), stream=s)
    return KernelCall(call, bufs.out, bufs.out_guards)


def _staged(ctx, fn, ctas, bufs, j) -> KernelCall:
    return _counted(ctx, fn, ctas, bufs, j, "collective_stage_calls", lambda c: np.int32(c & 1),
                    bufs.layout.stage, bufs.layout.slot_bytes)


def _ll(ctx, fn, ctas, bufs, j) -> KernelCall:
    return _counted(ctx, fn, ctas, bufs, j, "collective_ll_epoch", lambda c: np.uint32(c & 0xFFFFFFFF),
                    bufs.layout.ll, 2 * bufs.layout.slot_bytes)


def _put_signal(ctx, fn, ctas, bufs, j) -> KernelCall:
    nv, s = bufs.nvshmem, ctx.stream
    nbytes = np.uint64(bufs.data.elems * dtypes.ITEMSIZE[bufs.data.dtype])
    assert nv is not None

    def call() -> None:
        nv.epoch += 1
        fn((ctas,), (THREADS,), (nv.srcs[j], nv.dst, nbytes, nv.sig, np.uint64(nv.epoch)), stream=s)
    return KernelCall(call, nv.dst, nv.guards)


#: Every kernel variant of every op (an op lists the ones it has).
KERNEL_VARIANTS = {
    "lsa_oneshot": KernelVariant("allreduce_oneshot", "lsa", _barriers_to_local),
    "lsa_twoshot": KernelVariant("allreduce_twoshot", "lsa", _barriers_to_window),
    "lsa_push": KernelVariant("allgather_push", "lsa", _barriers_to_window),
    "lsa_pull": KernelVariant("reducescatter_pull", "lsa", _barriers_to_local),
    "lsa_staged": KernelVariant("{op}_staged", "lsa", _staged, STAGED_MAX_BYTES),
    "lsa_ll": KernelVariant("{op}_ll", "lsa", _ll, LL_MAX_BYTES, slot_align=16),
    "nvshmem_putsignal": KernelVariant("allgather_putsignal", "nvshmem", _put_signal),
}
