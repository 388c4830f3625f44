"""Pipeline workloads: compute on one stream, device-initiated communication on another.

KV-cache transfer, MoE dispatch-compute-combine and context-parallel attention
are not one GEMM and one collective: each is a sequence of compute steps whose
inputs or outputs cross ranks piece by piece. Their fused variants share one
shape: the compute steps are enqueued on the compute stream and raise (or wait
for) per-chunk flags; one persistent communication kernel on a second stream
moves each piece as soon as it exists, by LSA stores or NVSHMEM puts (or, for ranks on
different hosts where an op has a GIN template, GIN puts). Buffers
that peers touch live in the symmetric arena (:mod:`cuco.runtime.arena`).

:class:`PipelineWorkload` is what such a workload implements on top of the workload
protocol (:class:`cuco.workloads.Workload`); the one verification job
(:class:`cuco.evaluate.jobs.Case`) checks and times its variants like any workload's.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from cuco.design import DesignSpace, Directives, Placement
from cuco.design.pipeline_ops import PipelineOp, register_op
from cuco.design.problem import validated
from cuco.design.rules import violations
from cuco.errors import DirectiveError
from cuco.runtime.checking import compare
from cuco.runtime.arena import ArenaLayout, LiveSlots
from cuco.workloads.base import Workload

#: Threads per CTA of every pipeline communication kernel.
THREADS = 512
#: Flag slots a pipeline arena holds (chunks x ranks of the finest plan allowed).
MAX_FLAGS = 1 << 16
#: Where every variant's "rank r started this call" flags live: the same slots for all
#: variants, since a peer may already be in its next call (with another variant) when it
#: raises it; every other slot is written only after this handshake.
OPEN_SLOT = MAX_FLAGS - 8
#: Programs every job times besides the variants (:class:`cuco.evaluate.jobs.Case`).
BASELINES = ("host_nccl", "compute_only", "comm_only")


class PipelineWorkload(Workload):
    """A compute + communication pipeline: a sequence of compute steps on one stream whose
    pieces cross ranks through one persistent communication kernel on another
    (``side_stream``). Subclasses set :attr:`op` (which gives their :attr:`family` and
    :attr:`problem_type` unless they set their own), and implement :meth:`plan` (the
    template's constants), :meth:`chunk_choices`, the rendering and the GPU methods. A
    user's op (a :class:`PipelineOp` of its own, its template in a directory of its own:
    ``examples/custom_op.py``) is registered when its class is defined."""

    #: The pipeline op this workload runs: its problem class, template, and the issuers and
    #: sync scopes its templates render (:mod:`cuco.design.pipeline_ops`).
    op: ClassVar[PipelineOp]
    placements = (Placement.SIDE_STREAM,)
    #: Communication CTAs the design space offers.
    comm_cta_choices: ClassVar[tuple[int, ...]] = (4, 8, 16, 32)
    #: Whether its communication is a transfer that compute can hide entirely (benchmark
    #: rows then report ``hidden_fraction``); MoE's dispatch and combine feed its compute.
    hides_transfer: ClassVar[bool] = False

    def live_flag_slots(self, d: Directives) -> tuple[tuple[int, int], ...] | None:
        """The flag slots ``(first, end)`` a variant of ``d`` writes below the open slots: its
        plan's ``flag_slots`` (what :func:`flag_plan_check` was given); None where the plan
        names none (a user's op: its variants' sync regions are then not checked)."""
        n = self.plan(d).get("flag_slots")
        return None if n is None else ((0, n),)

    def live_slots(self, layout: ArenaLayout, d: Directives) -> LiveSlots | None:
        """What a variant of ``d`` writes of its sync region (``layout``: its own):
        :func:`pipeline_live_slots` of :meth:`live_flag_slots`; None where those are not named.
        Every pipeline runner's ``live_slots()``."""
        ranges = self.live_flag_slots(d)
        return None if ranges is None else pipeline_live_slots(layout, ranges)

    def __init_subclass__(cls, **kw) -> None:
        op = cls.__dict__.get("op")
        if op is not None:  # before its name becomes a known one (Workload registers it)
            register_op(op)  # a user's op is found by its name like a built-in one
            if "family" not in cls.__dict__:
                cls.family = op.name
            if "problem_type" not in cls.__dict__:
                cls.problem_type = op.problem
            if "backends" not in cls.__dict__:
                cls.backends = op.backends  # the op's table: GIN where it has a GIN template
        super().__init_subclass__(**kw)

    def __init__(self, world_size: int = 2, **shape):
        super().__init__(validated(self.problem_type, {**shape, "workload": self.family,
                                                        "world_size": world_size}))
        self.validate()

    @property
    def shape(self):
        """The problem's shape fields (``self.shape.tokens``)."""
        return self.problem

    # ---- description (CPU) ------------------------------------------------------------
    @abstractmethod
    def plan(self, d: Directives) -> dict[str, Any]:
        """The template constants of ``d`` at this shape (chunk rows, chunk count, ...);
        :class:`DirectiveError` with the fix where the shape cannot be cut by ``d``."""

    @abstractmethod
    def chunk_choices(self) -> list[int]:
        """The chunk sizes the design space offers at this shape."""

    def supported(self, d: Directives) -> list[str]:
        """What every pipeline template shares (a side stream driven by chunk flags, a
        backend its op has a template for), then whether this shape can be cut by ``d``."""
        bad = []
        if d.placement.in_kernel:
            bad.append(f"placement: {self.family} has a fused template for placement=side_stream "
                       f"only (a compute sequence and a communication kernel), not "
                       f"{d.placement.value}")
        if d.backend not in self.backends:
            bad.append(f"backend: {self.family} is rendered for "
                       f"{' and '.join(b.value for b in self.backends)}, not {d.backend.value}")
        if bad:
            return bad
        try:
            self.plan(d)
        except DirectiveError as exc:
            return list(exc.problems)
        return []

    def space(self, placements: Sequence[str | Placement] | None = None) -> DesignSpace:
        """Side-stream points: every backend, issuer, sync scope and core its :attr:`op` has,
        :meth:`chunk_choices` and :attr:`comm_cta_choices`, filtered by :meth:`supported` (tile
        fields unused)."""
        self.check_placements(placements or self.placements)
        return DesignSpace(self.problem, rules=lambda values, _p: self.supported(
                               Directives.model_construct(**values)),
                           backend=[b.value for b in self.backends], placement=["side_stream"],
                           sync_scope=[v.value for v in self.op.sync_scopes()],
                           issuer=[v.value for v in self.op.issuers],
                           chunk_bytes=sorted(self.chunk_choices()),
                           comm_ctas=list(self.comm_cta_choices), tile_m=[128], tile_n=[128],
                           tile_k=[64], stages=[4], raster_group=[1], comm_warps=[0],
                           chunk_schedule=["direct"], core=[c.value for c in self.op.cores],
                           peer_calls=[v.value for v in self.op.peer_calls], prefer=self.preferred())

    def preferred(self) -> dict[str, Any]:
        """Values this shape's space prefers where its default point allows them (the
        regime's default of a tunable, e.g. how a library core groups its calls); none here."""
        return {}

    @abstractmethod
    def grid(self) -> list[Directives]:
        """The directive points a benchmark sweeps (all valid for this shape)."""

    def grid_of(self, chunk_bytes: list[int], points, cores=("own",),
                peer_calls=("per_peer",)) -> list[Directives]:
        """Side-stream directives for every chunk size, ``(backend, issuer, comm_ctas)`` point,
        core and way of calling over the peers' data, less those this shape cannot render."""
        out = []
        for core, calls in itertools.product(cores, peer_calls):
            for chunk in chunk_bytes:
                for backend, issuer, ctas in points:
                    try:
                        d = Directives(backend=backend, placement="side_stream", sync_scope="chunk",
                                       issuer=issuer, chunk_bytes=chunk, comm_ctas=ctas, core=core,
                                       peer_calls=calls)
                    except DirectiveError:  # e.g. grouped calls of core=own
                        continue
                    if not violations(d.__dict__, self.problem) and not self.supported(d):
                        out.append(d)
        return out

    def kernel_name(self, d: Directives) -> str:
        return self.problem.kernel_name(d.full_name)

    def compare(self, got, ref) -> dict[str, Any]:
        """Every element of ``got`` against ``ref`` (fp32)."""
        rtol, atol_f = self.tolerance()
        return compare(got, ref, self.dtype, rtol, atol_f * float(abs(ref).max()))


def flag_plan_check(n_flags: int, what: str) -> int:
    """``n_flags`` (the slots ``[0, n_flags)`` a plan's flags take), or a
    :class:`DirectiveError` where they reach the open slots."""
    if n_flags > OPEN_SLOT:
        raise DirectiveError([f"chunk_bytes: {what} needs {n_flags} flags, more than "
                              f"{OPEN_SLOT}; choose a larger chunk_bytes"])
    return n_flags


def pipeline_live_slots(layout: ArenaLayout, flag_ranges) -> LiveSlots:
    """A pipeline variant's live slots: its plan's flag ``flag_ranges`` (slots, ``(first,
    end)``), every rank's open slot and the call state (seeded; no pipeline template keeps
    its epoch on the device). The rest of the 65536 slots is held at zero between calls."""
    slots = [*flag_ranges, (OPEN_SLOT, MAX_FLAGS)]
    calls = layout.calls - layout.flags
    return LiveSlots(tuple((a * 8, b * 8) for a, b in slots) + ((calls, calls + 16),))
