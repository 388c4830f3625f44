"""Pipeline workloads: compute on one stream, device-initiated communication on another.

KV-cache transfer, MoE dispatch-compute-combine and context-parallel attention
are not one GEMM and one collective: each is a sequence of compute steps whose
inputs or outputs cross ranks piece by piece. Their fused variants share one
shape: the compute steps are enqueued on the compute stream and raise (or wait
for) per-chunk flags; one persistent communication kernel on a second stream
moves each piece as soon as it exists, by LSA stores or NVSHMEM puts. Buffers
that peers touch live in the symmetric arena (:mod:`cuco.runtime.arena`).

:class:`PipelineWorkload` is what such a workload implements; :class:`PipelineCase`
checks (NaN-poisoned outputs and arena, every element against a higher-precision
reference, guard pages, input fingerprints, a stalled compute stream) and times
(interleaved with the host-driven program, the compute alone, the communication
alone and any extra baselines) every variant in one job on every rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from cuco.design import Directives
from cuco.errors import DirectiveError
from cuco.kernels.collectives import KernelSource
from cuco.runtime.arena import ArenaLayout, prepare_arenas
from cuco.runtime.checking import compare
from cuco.workloads.base import EPS, Buffers
from cuco.workloads.jobs import (
    N_CHECKED, STRESS_US, Program, VariantSpec, first_epoch, fresh_seed, host_program, input_sets,
    judge, variant_program,
)

#: Threads per CTA of every pipeline communication kernel.
THREADS = 512
#: Flag slots a pipeline arena holds (chunks x ranks of the finest plan allowed).
MAX_FLAGS = 1 << 16
#: Where every variant's "rank r started this call" flags live: the same slots for all
#: variants, since a peer may already be in its next call (with another variant) when it
#: raises it; every other slot is written only after this handshake.
OPEN_SLOT = MAX_FLAGS - 8
#: Baselines every pipeline job times besides the variants.
BASELINES = ("host_nccl", "compute_only", "comm_only")


class Runner(ABC):
    """One fused call of one variant on ``ctx.stream``; ``output`` is where it lands."""

    output: Any
    #: > 0 in correctness runs: the compute stream sleeps this long before every step
    #: that produces or consumes a chunk, so a consumer that runs ahead of its flag
    #: meets NaN poison every time.
    stress_us: float = 0.0

    @abstractmethod
    def __call__(self) -> None: ...


class PipelineWorkload(ABC):
    """A compute + communication pipeline with its shape (a pydantic model), world size
    and dtype. Subclasses set :attr:`family` and implement the abstract methods."""

    family: ClassVar[str]

    def __init__(self, shape: BaseModel, world_size: int):
        self.shape = shape
        self.world_size = world_size
        self.dtype: str = getattr(shape, "dtype", "bf16")

    # ---- description (CPU) ------------------------------------------------------------
    @property
    @abstractmethod
    def label(self) -> str:
        """Case label of result files, e.g. ``kv_transfer/L32T4096H8192KV2048/bf16``."""

    @abstractmethod
    def layout(self) -> ArenaLayout:
        """Where the buffers peers touch live in the arena."""

    @abstractmethod
    def render(self, d: Directives) -> KernelSource:
        """The fused kernel for ``d``; raises :class:`DirectiveError` with the fix."""

    @abstractmethod
    def grid(self) -> list[Directives]:
        """The directive points a benchmark sweeps (all valid for this shape)."""

    def grid_of(self, chunk_bytes: list[int], points) -> list[Directives]:
        """Side-stream directives for every chunk size and ``(backend, issuer, comm_ctas)``
        point, less those this shape cannot render."""
        out = []
        for chunk in chunk_bytes:
            for backend, issuer, ctas in points:
                d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                               issuer=issuer, chunk_bytes=chunk, comm_ctas=ctas)
                try:
                    self.render(d)
                except DirectiveError:
                    continue
                out.append(d)
        return out

    def tolerance(self) -> tuple[float, float]:
        """``(rtol, atol_factor)`` as in :meth:`cuco.workloads.Workload.tolerance`."""
        eps = EPS[self.dtype]
        return 2 * eps, 2 * eps

    def check_directives(self, d: Directives) -> None:
        """What every pipeline template shares: a side stream driven by chunk flags."""
        bad = []
        if d.placement.in_kernel:
            bad.append(f"placement: {self.family} has a fused template for placement=side_stream "
                       f"only (a compute sequence and a communication kernel), not "
                       f"{d.placement.value}")
        if d.backend.value == "gin":
            bad.append(f"backend: {self.family} is rendered for lsa and nvshmem (ranks on one "
                       "host); gin needs ranks on different hosts")
        if bad:
            raise DirectiveError(bad)

    # ---- GPU side (inside a worker) -------------------------------------------------
    @abstractmethod
    def make_inputs(self, ctx, seed: int) -> Buffers:
        """This rank's inputs (CuPy arrays) drawn from ``seed``."""

    @abstractmethod
    def reference(self, ctx, inputs: Buffers):
        """This rank's expected output in fp32 (host NCCL moves fp32 data)."""

    @abstractmethod
    def output_elems(self) -> int:
        """Elements of this rank's output."""

    @abstractmethod
    def host_sequence(self, ctx, inputs: Buffers, out) -> Callable[[], None]:
        """The host-driven program: compute, then NCCL from the host, one after the other."""

    @abstractmethod
    def compute_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The compute steps alone (one half of the bound)."""

    @abstractmethod
    def comm_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The host NCCL communication alone (the other half)."""

    @abstractmethod
    def fused(self, ctx, d: Directives, cubin: str, arena, inputs: Buffers, out) -> Runner:
        """The fused call of variant ``d`` (compiled to ``cubin``) on ``arena``; it may
        write its result to ``out`` (the host program's output, checked in turn)."""

    def baselines(self, ctx, inputs: Buffers) -> dict[str, tuple[Callable[[], None], Any]]:
        """Extra programs to check and time beside the variants: ``{name: (fn, output)}``
        (e.g. the host-driven program overlapped by hand on two streams)."""
        return {}

    def compare(self, got, ref) -> dict[str, Any]:
        """Every element of ``got`` against ``ref`` (fp32)."""
        rtol, atol_f = self.tolerance()
        return compare(got, ref, self.dtype, rtol, atol_f * float(abs(ref).max()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label}, world_size={self.world_size})"


def flag_plan_check(n_flags: int, what: str) -> None:
    if n_flags > OPEN_SLOT:
        raise DirectiveError([f"chunk_bytes: {what} needs {n_flags} flags, more than "
                              f"{OPEN_SLOT}; choose a larger chunk_bytes"])


@dataclass
class PipelineCase:
    """Verify and time a pipeline workload's variants on every rank (one job; see
    :func:`cuco.workloads.jobs.judge`)."""

    workload: PipelineWorkload
    variants: list[VariantSpec] = field(default_factory=list)
    seed: int = 1
    #: False: a check-only job (every program once per input set, every call checked)
    time: bool = True
    warmup: int = 3
    iters: int = 20
    n_checked: int = N_CHECKED
    busy_us: float = 40.0
    stress_us: float = STRESS_US
    schedule_seed: int = field(default_factory=fresh_seed)

    def __call__(self, ctx) -> dict[str, Any]:
        wl, s = self.workload, ctx.stream
        rtol, atol_f = wl.tolerance()
        with s:
            sets = input_sets(ctx, wl, type(wl), self.seed, atol_f)
            directives = {v.name: Directives.from_json(v.directives) for v in self.variants}
            layout = wl.layout()
            arenas = prepare_arenas(ctx, layout, {d.backend.value for d in directives.values()},
                                    first_epoch(self.schedule_seed)) if self.variants else {}
            programs = {"host_nccl": host_program(lambda x, o: wl.host_sequence(ctx, x, o), sets,
                                                  wl.output_elems(), wl.dtype)}
            per_set = [wl.baselines(ctx, st.inputs) for st in sets]
            for name in per_set[0]:
                programs[name] = Program([b[name][0] for b in per_set], [b[name][1] for b in per_set])
            for v in self.variants:
                d = directives[v.name]
                arena = arenas[d.backend.value]
                programs[v.name] = variant_program(
                    lambda x, o, d=d, v=v, a=arena: wl.fused(ctx, d, v.cubin, a, x, o),
                    arena, sets, wl.output_elems(), wl.dtype)
        extras = {"compute_only": lambda: wl.compute_only(ctx, sets[0].inputs),
                  "comm_only": lambda: wl.comm_only(ctx, sets[0].inputs)}
        return judge(ctx, self, programs, extras, sets, rtol, wl.dtype, layout)
