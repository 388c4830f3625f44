"""cuco's own collectives (its LSA and NVSHMEM kernels) and NCCL's, as one rank runs them.

The evaluator's verification job judges them like any program
(:class:`cuco.evaluate.collective_job.CollectiveCase`); this module is what runs on a worker:
the ops (:class:`CollectiveOp`) and the kernel variants each has (:data:`KERNEL_VARIANTS`),
each rank's input and its fp32 reference (:class:`CollectiveInputs`), the buffers a job's
variants need (:func:`prepare_buffers`, :mod:`cuco.runtime.collective_buffers`) and one
launch per variant, CTA count and input set (:func:`kernel_call`, :func:`host_call`). A
launch takes the same arguments in every call of a job, checked or timed; the staged, LL and
put-with-signal kernels' per-call scalar comes from a per-rank counter that every rank
advances in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuco.design.patterns import Collective
from cuco.runtime import dtypes
from cuco.runtime.collective_buffers import CollectiveBuffers, Extent
from cuco.runtime.host_collective import elements, launch

#: Staged (one-barrier) variants use 2 x world x size of staging memory: small sizes only.
STAGED_MAX_BYTES = 16 << 20
#: LL variants double the traffic (a flag per 4 bytes): latency-bound sizes only.
LL_MAX_BYTES = 4 << 20
THREADS = 512


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

    def extent(self, world_size: int) -> Extent:
        n = self.elems
        return Extent(self.dtype, n, self.op.out_elems(n, world_size), self.op.count(n, world_size))

    def reference(self, ctx, inputs: dict[str, Any]):
        import cupy
        n, w = self.elems, ctx.world_size
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        ref = cupy.empty(self.op.out_elems(n, w), dtype=cupy.float32)
        launch(ctx, self.op.collective.value, int(x32.data.ptr), int(ref.data.ptr), self.op.count(n, w), "fp32")
        return ref


@dataclass(frozen=True)
class KernelVariant:
    """How one of cuco's collective kernels runs as a variant: its kernel in its backend's
    cubin (``{op}``: the op's name), its launch, the largest input it is offered for by
    default, the alignment each rank's slot needs (else it is not run at that size) and the
    window halves it alternates between."""

    kernel: str
    backend: str  # "lsa" (the window) or "nvshmem" (the symmetric heap)
    make: Callable[..., "KernelCall"]
    max_bytes: int | None = None
    slot_align: int = 1
    halves: str = ""  # "stage", "ll" or none

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


def prepare_buffers(ctx, data: CollectiveInputs, inputs: list, variants: list[str], out, out_guards: tuple,
                    cubins: dict[str, str]) -> CollectiveBuffers:
    """The buffers ``variants`` need, filled with each input set's input (collective: every
    rank in step); ``out``: the local output the job gives, between ``out_guards``."""
    kinds = [KERNEL_VARIANTS[v] for v in variants]
    return CollectiveBuffers.prepare(ctx, data.extent(ctx.world_size), inputs, out, out_guards, cubins,
                                     backends={k.backend for k in kinds},
                                     staged=any(k.halves == "stage" for k in kinds),
                                     ll=any(k.halves == "ll" for k in kinds))


def host_call(ctx, op: CollectiveOp, x, out, dtype: str) -> Callable[[], None]:
    """NCCL's collective from the host, ``x`` into ``out``, on the job's stream."""
    count, p_in, p_out = op.count(int(x.size), ctx.world_size), int(x.data.ptr), int(out.data.ptr)
    return lambda: launch(ctx, op.collective.value, p_in, p_out, count, dtype)


def kernel_call(ctx, op: CollectiveOp, variant: str, ctas: int, bufs: CollectiveBuffers, input_set: int) -> KernelCall:
    """``op``'s ``variant`` on ``ctas`` CTAs, reading input set ``input_set``."""
    kv = KERNEL_VARIANTS[variant]
    fn = ctx.function(bufs.cubins[kv.backend], kv.kernel.format(op=op.name))
    return kv.make(ctx, fn, ctas, bufs, input_set)


def _on_stream(ctx, fn, ctas: int, args: tuple) -> Callable[[], None]:
    s = ctx.stream
    return lambda: fn((ctas,), (THREADS,), args, stream=s)


def _barriers_to_local(ctx, fn, ctas, bufs, j) -> KernelCall:
    """A two-barrier kernel that reads every peer's input and writes a local output."""
    args = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), bufs.out, np.uint64(bufs.extent.count))
    return KernelCall(_on_stream(ctx, fn, ctas, args), bufs.out, bufs.out_guards)


def _barriers_to_window(ctx, fn, ctas, bufs, j) -> KernelCall:
    """A two-barrier kernel that pushes into every peer's output region of the window."""
    args = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), np.uint64(bufs.layout.out),
            np.uint64(bufs.extent.count))
    return KernelCall(_on_stream(ctx, fn, ctas, args), bufs.window_out, bufs.window_guards)


def _counted(ctx, fn, ctas, bufs, j, counter: str, scalar, area: int, slot_bytes: int) -> KernelCall:
    """A kernel whose last scalar comes from a per-rank counter shared by every launch of its
    kind (the halves it alternates between follow it)."""
    head = (*bufs.lsa_args(ctx, ctas), np.uint64(bufs.layout.inputs[j]), np.uint64(area), np.uint64(slot_bytes))
    tail = (bufs.out, np.uint64(bufs.extent.count))
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
    nbytes = np.uint64(bufs.extent.nbytes(bufs.extent.in_elems))
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
    "lsa_staged": KernelVariant("{op}_staged", "lsa", _staged, STAGED_MAX_BYTES, halves="stage"),
    "lsa_ll": KernelVariant("{op}_ll", "lsa", _ll, LL_MAX_BYTES, slot_align=16, halves="ll"),
    "nvshmem_putsignal": KernelVariant("allgather_putsignal", "nvshmem", _put_signal),
}
