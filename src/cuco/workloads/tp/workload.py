"""Tensor-parallel linear layers: the three workloads users meet first.

Per rank ``r`` of ``w`` (global shapes M x K times K x N):

* ``gemm_allreduce``      row-parallel linear:    ``Y = allreduce(X_r[M, K/w] @ W_r[K/w, N])``
* ``gemm_reducescatter``  row-parallel + seq-par: ``Y_r = rows_r(sum_s X_s @ W_s)``, ``[M/w, N]``
* ``allgather_gemm``      column-parallel linear: ``Y_r = allgather_rows(X_s[M/w, K]) @ W_r[K, N/w]``

:class:`GemmWorkload` is their common base (and a user's GEMM + collective workload's, with
a ``pattern`` naming the built-in whose templates it reuses): every placement, a
``side_stream`` template per pattern and the one-kernel CUTLASS templates.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from cuco.design import DesignSpace, Directives, GemmProblem, Placement, placement_rules
from cuco.design.patterns import (ALLGATHER_GEMM, GEMM_ALLREDUCE, GEMM_REDUCESCATTER, TP_NAMES,
                                  LocalGemm, OperandShapes, TPPattern, find, tp_pattern)
from cuco.design.tiles import EQUAL_CHUNKS_M, chunk_sizes
from cuco.errors import DirectiveError, InputError, ShapeError
from cuco.kernels import tp as templates
from cuco.kernels.collectives import KernelSource
from cuco.runtime import dtypes, host_collective, host_gemm, torch_bridge
from cuco.runtime.arena import ArenaLayout
from cuco.runtime.cublas import gemm
from cuco.runtime.peaks import Work
from cuco.workloads.tp import torch_fused
from cuco.workloads.base import EPS, Buffers, Peer, Runner, Workload, in_order, register
from cuco.design.problem import Dtype


def _ptr(a) -> int:
    return int(a.data.ptr)


def _random_matrix(shape: tuple[int, int], dtype: str, seed: int, scale: float = 1.0):
    import cupy
    rs = cupy.random.RandomState(seed)
    x = rs.standard_normal(shape, dtype=cupy.float32)
    if scale != 1.0:
        x *= cupy.float32(scale)
    return dtypes.from_float32(x, dtype)


class GemmWorkload(Workload):
    """A GEMM whose operands or result cross ranks through one collective.

    Subclasses set :attr:`family` and implement the abstract methods. The per-rank shapes
    must divide as the pattern requires; a shape that does not is refused with a
    :class:`cuco.ShapeError` at construction.
    """

    problem_type = GemmProblem
    placements = tuple(Placement)
    #: the strongest host program (best GEMM library, then the faster NCCL buffers) and the
    #: one before #21 (cuBLAS default algorithm, NCCL on plain buffers): picking per shape can
    #: lose to the plain one by a few percent, so the faster of the two is the baseline; and
    #: PyTorch's fused op of the pattern (``torch_fused``) wherever a job timed it (torch
    #: present, ``Case(peers=True)``): the fastest correct of them is the bar
    host_programs = ("host_nccl", "host_nccl_default", torch_fused.PEER)
    #: Every honest variant of the three layers was within 1.0x the host program's L2 error
    #: (99 rows of bench/results/tp_workloads_h200x2_616ca2a.json, 2 x H200: every placement, backend and
    #: pattern at 8192^3; the reductions sum bf16 partials in fp32 as NCCL does, or more
    #: exactly); a peer's partial rounded one mantissa bit short is about 1.4x, a reduced
    #: output's lowest bit dropped about 2x: both wrong here, and both inside the 2x default
    accuracy_slack = 1.25
    #: The pattern whose fused templates, chunk plans and arena this workload uses (the
    #: built-ins: their own; a subclass inherits it). A user workload that is "GEMM +
    #: something, then AllReduce" subclasses :class:`GemmAllReduce` or sets
    #: ``pattern = "gemm_allreduce"`` (the name is looked up once, when the class is
    #: defined), and adds a :meth:`chunk_epilogue`.
    pattern: ClassVar[TPPattern | None] = None
    problem: GemmProblem

    def __init_subclass__(cls, **kw) -> None:
        if isinstance(cls.__dict__.get("pattern"), str):  # before its name becomes a known one
            cls.pattern = tp_pattern(cls.__dict__["pattern"])
        super().__init_subclass__(**kw)

    def __init__(self, *positional: object, m: int | None = None, n: int | None = None,
                 k: int | None = None, world_size: int | None = None, dtype: Dtype = "bf16"):
        """The global GEMM ``C[m, n] = A[m, k] B[k, n]`` over ``world_size`` ranks, by keyword
        only: shape strings and ``GemmProblem.SHAPE`` read M x K x N, so a positional order
        here would mean another problem than the same numbers there."""
        if positional or None in (m, n, k, world_size):
            raise TypeError(f"{type(self).__name__} takes keywords only: "
                            f"{type(self).__name__}(m=M, n=N, k=K, world_size=W) (the global "
                            "GEMM C[M, N] = A[M, K] B[K, N]); a shape string 'MxKxN' goes to "
                            "cuco.make_problem instead")
        super().__init__(GemmProblem(workload=self.family, m=m, n=n, k=k,
                                     world_size=world_size, dtype=dtype))
        self.validate()

    def validate(self) -> None:
        _ = self.pattern_problem  # a shape its pattern cannot split is refused here, with the fix

    # ---- description (CPU) ------------------------------------------------------------
    @property
    def m(self) -> int:
        return self.problem.m

    @property
    def n(self) -> int:
        return self.problem.n

    @property
    def k(self) -> int:
        return self.problem.k

    @property
    def tp(self) -> TPPattern:
        """The pattern this workload runs (:attr:`pattern`); an :class:`InputError` naming
        the fix for a GEMM workload that names none."""
        if self.pattern is None:
            raise InputError(f"{type(self).__name__} names no tensor-parallel pattern; set "
                             f"pattern = one of {', '.join(TP_NAMES)} (the templates it reuses)",
                             param="pattern", fix=TP_NAMES[0])
        return self.pattern

    @property
    def pattern_problem(self) -> GemmProblem:
        """This shape under the family whose templates and chunk plans it uses."""
        return self.in_pattern(self.problem)

    def in_pattern(self, problem: GemmProblem) -> GemmProblem:
        """``problem`` (this workload's, or a smaller one) under its pattern's family,
        validated, so a shape the pattern cannot split is refused with the fix."""
        if find(problem.workload) is self.tp:
            return problem
        return GemmProblem(**{**problem.model_dump(), "workload": self.tp.name})

    def local_gemm(self) -> LocalGemm:
        """(m, n, k) of the GEMM each rank runs (its pattern's)."""
        return self.tp.local_gemm(m=self.m, n=self.n, k=self.k, world_size=self.world_size)

    def operand_shapes(self) -> OperandShapes:
        """Each rank's ``A``, ``B`` and final output shapes (its pattern's)."""
        return self.tp.operand_shapes(m=self.m, n=self.n, k=self.k, world_size=self.world_size)

    def output_shape(self) -> tuple[int, int]:
        """Shape of each rank's final output (its pattern's)."""
        return self.operand_shapes().out

    def output_elems(self) -> int:
        rows, cols = self.output_shape()
        return rows * cols

    def flops_per_rank(self) -> int:
        m, n, k = self.local_gemm()
        return 2 * m * n * k

    def link_bytes_per_rank(self) -> int:
        """Bytes each rank must receive from its peers in one call (the pattern's)."""
        return self.tp.link_bytes(m=self.m, n=self.n, k=self.k, world_size=self.world_size,
                                  dtype_bytes=self.problem.dtype_bytes)

    def work(self) -> Work:
        """Its GEMM, each operand and result through HBM once, and what it receives."""
        m, n, k = self.local_gemm()
        esz = self.problem.dtype_bytes
        return Work(self.flops_per_rank(), (m * k + k * n + m * n) * esz, self.link_bytes_per_rank())

    def tolerance(self) -> tuple[float, float]:
        """Each partial product is rounded once to the dtype and, for reductions,
        the sum of ``world_size`` of them once more: ``rtol = (w + 1) * eps``.
        Where partials cancel, their rounding errors (up to ``eps/2`` of a
        partial, and partials reach ``max|ref|``) stay: the absolute part is
        ``eps * w * max|ref|``, grown with ``sqrt(K)`` for fp32
        accumulation-order differences. A kernel that drops or doubles one
        rank's contribution errs by about ``rms(ref)``, far above it.
        """
        eps = EPS[self.dtype]
        w = self.world_size
        return (w + 1) * eps, eps * (w + math.sqrt(self.k / 65536.0))

    # ---- templates ----------------------------------------------------------------------
    def row_blocks_refusal(self) -> str | None:
        """Why the in-kernel placements cannot take this shape's rows (see
        :func:`cuco.design.placement_rules.row_blocks_refusal`); None when they can."""
        return placement_rules.row_blocks_refusal(self.pattern_problem)

    def supported(self, d: Directives) -> list[str]:
        """The in-kernel placements' rules (:mod:`cuco.design.placement_rules`) and what their
        templates cannot render, or a side-stream chunk plan that does not fit."""
        problem = self.pattern_problem
        if d.placement.in_kernel:
            python = placement_rules.chunk_epilogue_refusal(type(self).__name__, d.placement) \
                if self.has_chunk_epilogue() else None
            if python:
                return [python]
            return (placement_rules.in_kernel_violations(d.__dict__, problem)
                    + templates.supported(problem, d))
        try:
            templates.side_stream_plan(problem, d)
        except DirectiveError as exc:
            return list(exc.problems)
        return []

    def render(self, d: Directives) -> KernelSource:
        rows = self.row_blocks_refusal() if d.placement.in_kernel else None
        if rows:  # before the design rules' tile message, which cannot name side_stream
            raise DirectiveError([f"placement: {rows}"])
        return templates.render_tp(self.pattern_problem, d)[0]

    def space(self, placements: Sequence[str | Placement] | None = None) -> DesignSpace:
        """The points that have a fused template at this shape.

        ``side_stream``: vendor GEMM per chunk (tile fields unused, kept at 128x128x64, 4
        stages); chunk sizes of 2 to 32 chunks per rank, 8 to 64 communication CTAs.
        ``epilogue`` / ``dedicated_ctas``: the one-kernel CUTLASS templates, one output tile
        per flag, the mainloops of :data:`cuco.kernels.tp.MAINLOOPS`, row-by-row or grouped tile
        order (8 or 16 m-tiles), the epilogue on the consumers or on 3 spare producer warps,
        8 or 16 communication CTAs. A workload whose Python ``chunk_epilogue`` runs between chunks
        gets ``side_stream`` only, and so does a shape whose rows do not split into equal
        blocks per rank (an AllReduce M not a multiple of ``world_size``); asked for the
        in-kernel placements alone, such a shape is a :class:`ShapeError` naming side_stream.
        Any other M, N and K take the in-kernel placements (a short last tile where the tiles
        do not divide).
        """
        placements = self.check_placements(placements or self.placements)
        if self.has_chunk_epilogue():
            placements = self.check_placements([p for p in placements if not p.in_kernel]
                                               or [Placement.SIDE_STREAM])
        rows = self.row_blocks_refusal()
        if rows and any(p.in_kernel for p in placements):
            if all(p.in_kernel for p in placements):
                raise ShapeError(f"{self.problem.label}: {rows}",
                                 param="placements", fix="side_stream")
            placements = tuple(p for p in placements if not p.in_kernel)
        problem = self.problem
        side = sorted(chunk_sizes(problem, (2, 4, 8, 16, 32), floor_log2=15))
        in_kernel = [p for p in placements if p.in_kernel]
        mainloops = templates.mainloops_for(self.pattern_problem)
        tiles = sorted({ml.tile_m * ml.tile_n * problem.dtype_bytes for ml in mainloops}) \
            if in_kernel else []
        comm = ([8, 16, 32, 64] if Placement.SIDE_STREAM in placements else []) \
            + ([0] if Placement.EPILOGUE in placements else []) \
            + ([8, 16] if Placement.DEDICATED_CTAS in placements else [])

        fields = self._mainloop_choices(mainloops if in_kernel else ())
        return DesignSpace(problem, rules=lambda values, _p: self.space_refusals(values, side, mainloops),
                           coupled={templates.Mainloop._fields: self._mainloop_rows(placements, fields,
                                                                                    mainloops)},
                           backend=[b.value for b in self.backends],
                           placement=list(placements), sync_scope=["chunk"],
                           chunk_bytes=sorted({*side, *tiles}), tile_k=[64], **fields,
                           comm_ctas=sorted(set(comm)), issuer=["thread", "warp", "cta"],
                           raster_group=[1, 8, 16] if in_kernel else [1],
                           comm_warps=[0, 3] if in_kernel else [0], chunk_schedule=["direct"])

    @staticmethod
    def _mainloop_choices(mainloops: Sequence[templates.Mainloop]) -> dict[str, list]:
        """Each :class:`~cuco.kernels.tp.Mainloop` field's choices in :meth:`space`: the values
        the in-kernel ``mainloops`` (:func:`~cuco.kernels.tp.mainloops_for` the shape) take, or,
        with none, side_stream's alone (its vendor GEMM per chunk: 128x128x64 tile fields, 4
        stages, no split, cluster or swap)."""
        if not mainloops:
            return dict(schedule=["cooperative"], tile_n=[128], stages=[4], tile_m=[128], split_k=[1], cluster_m=[1],
                        swap_ab=[False])
        return {f: sorted({getattr(ml, f) for ml in mainloops}) for f in templates.Mainloop._fields}

    @staticmethod
    def _mainloop_rows(placements: Sequence[Placement], fields: dict[str, list],
                       mainloops: Sequence[templates.Mainloop]) -> list[tuple]:
        """The joint values of a :class:`~cuco.kernels.tp.Mainloop`'s fields (coupled in
        :meth:`space`, which offers these mainloops, not the product of their choices): each of
        the in-kernel ``mainloops`` (:func:`~cuco.kernels.tp.mainloops_for` the shape), and side_stream's fixed 128x128x64 tile
        fields of 4 stages, unswapped, with every schedule, split and cluster choice of
        ``fields`` (its rules refuse those it cannot take). Listing them makes the grid the mainloops' count,
        not the product of the six fields' choices: a space's points are listed in seconds, not
        a minute."""
        rows = [tuple(ml) for ml in mainloops] if any(p.in_kernel for p in placements) else []
        if Placement.SIDE_STREAM in placements:
            rows += [tuple(templates.Mainloop(s, 128, 4, 128, k, c))
                     for s in fields["schedule"] for k in fields["split_k"] for c in fields["cluster_m"]]
        return rows

    def space_refusals(self, values: dict, side_chunks: Sequence[int],
                       mainloops: Sequence[templates.Mainloop] | None = None) -> list[str]:
        """Why :meth:`space` leaves out the point ``values`` of its grid, beyond the design
        rules (:func:`cuco.design.rules.violations`): the points it offers (side_stream's
        chunk sizes ``side_chunks``, its unused tile fields fixed so that no point repeats;
        the in-kernel ``mainloops``, by default :func:`~cuco.kernels.tp.mainloops_for` the
        shape, and CTA counts), then :meth:`supported`."""
        if values["placement"] is Placement.SIDE_STREAM:
            out = []
            if values["chunk_bytes"] not in side_chunks:
                out.append("chunk_bytes: side_stream uses 2 to 32 chunks per rank")
            if (values["tile_m"], values["tile_n"], values["stages"]) != (128, 128, 4) or values["comm_ctas"] < 8:
                out.append("tile_n: side_stream runs a vendor GEMM; its tile fields stay "
                           "128x128x64, 4 stages")
            return out or self.supported(Directives.model_construct(**values))
        if values["placement"] is Placement.DEDICATED_CTAS and values["comm_ctas"] > 16:
            return ["comm_ctas: dedicated_ctas reserves 8 or 16 CTAs in this space"]
        if mainloops is None:
            mainloops = templates.mainloops_for(self.pattern_problem)
        if templates.Mainloop(values["schedule"].value, values["tile_n"], values["stages"], values["tile_m"],
                              values["split_k"], values["cluster_m"], values["swap_ab"]) not in mainloops:
            return ["stages: the in-kernel mainloops of this space are " + "; ".join(
                ml.text() for ml in mainloops)]
        return self.supported(Directives.model_construct(**values))

    def small_problem(self) -> GemmProblem:
        """A few chunks per rank, with M's residue mod 64 kept: a ragged M checks the
        ragged kernel bodies (whose EVOLVE-BLOCKs the evaluator splices into this shape)."""
        w = self.world_size
        return self.problem.model_copy(update={"m": 256 * w + self.m % (EQUAL_CHUNKS_M * w),
                                               "n": 512 * w, "k": 512 * w})

    def small_directives(self, d: Directives, small: Workload) -> Directives:
        """``d`` with its chunk cut to fit the small shape (a few chunks, at least one tile);
        in-kernel placements move one tile per flag, so they keep their chunk."""
        if d.placement.in_kernel:
            return d
        fit = small.problem.output_bytes_per_rank() // 4
        chunk = d.chunk_bytes
        while chunk > fit and chunk > (1 << 15):
            chunk //= 2
        # the small shape's rows can be wider than the problem's (AllGather's K is not split:
        # 4096 at W = 8): a chunk too small to cut them grows to the least that does
        while small.supported(d.replace(chunk_bytes=chunk)) and chunk < d.chunk_bytes * 64:
            chunk *= 2
        return d.replace(chunk_bytes=chunk)

    def layout(self) -> ArenaLayout:
        """The arena of this shape: its pattern's regions, the templates' flag slots."""
        regions = self.tp.arena_regions(m=self.m, n=self.n, k=self.k,
                                        dtype_bytes=self.problem.dtype_bytes)
        return ArenaLayout.for_tp(regions, self.world_size, templates.FLAG_STRIDE)

    # ---- GPU side (inside a worker) -------------------------------------------------
    def make_inputs(self, ctx, seed: int) -> Buffers:
        """This rank's ``x`` and ``w`` shards (shapes: :meth:`operand_shapes`), ``w`` scaled
        by ``1/sqrt(K)`` so outputs stay near 1 at any K."""
        a, b, _ = self.operand_shapes()
        s = 1000 * seed + 10 * ctx.rank
        return {"x": _random_matrix(a, self.dtype, s),
                "w": _random_matrix(b, self.dtype, s + 1, 1.0 / math.sqrt(self.k))}

    @abstractmethod
    def gemm_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The GEMM alone (the compute half of the bound)."""

    # ---- host baselines: the strongest host program, the old one, torch's peers ----------
    @abstractmethod
    def host_parts(self, ctx) -> tuple[host_gemm.HostGemm, host_collective.HostCollective]:
        """The fastest GEMM and the faster NCCL (plain or registered buffers) of this shape,
        chosen once per worker: the pieces of the strongest host program."""

    @abstractmethod
    def host_sequence_default(self, ctx, inputs: Buffers, out) -> Callable[[], None]:
        """The host program before #21: cuBLAS ``gemmEx`` (default algorithm), then NCCL on
        plain buffers (kept as the ``host_nccl_default`` baseline)."""

    def builtin_host(self) -> bool:
        """Whether the host program is the built-in one (a subclass that writes its own, e.g.
        with an epilogue, keeps its compute half and gets no default baseline or peer)."""
        return type(self).host_sequence in (GemmAllReduce.host_sequence, GemmReduceScatter.host_sequence,
                                            AllGatherGemm.host_sequence)

    def compute_only(self, ctx, inputs: Buffers) -> Callable[[], None]:
        """The fastest host GEMM alone (the compute half of the bound)."""
        if not self.builtin_host():
            return self.gemm_only(ctx, inputs)
        m, n, k = self.local_gemm()
        a = dtypes.random(m * k, self.dtype, 11 + ctx.rank) if self.tp.gathers_input else inputs["x"]
        c = dtypes.empty(m * n, self.dtype)
        call = self.host_parts(ctx)[0].bind(_ptr(a), _ptr(inputs["w"]), _ptr(c))
        call.keepalive = (a, c)  # type: ignore[attr-defined]
        return call

    def baselines(self, ctx, inputs: Buffers) -> dict[str, tuple[Callable[[], None], object]]:
        """The host program before #21 (``host_nccl_default``), checked and timed beside the
        strongest one (``host_nccl``)."""
        if not self.builtin_host():
            return {}
        out = dtypes.empty(self.output_elems(), self.dtype)
        return {"host_nccl_default": (self.host_sequence_default(ctx, inputs, out), out)}

    def host_notes(self, ctx) -> dict[str, object]:
        """What the strongest host program is made of, each candidate's time and why the
        others lost or were out."""
        if not self.builtin_host():
            return {"gemm": "the workload's own host_sequence"}
        gemm_choice, coll = self.host_parts(ctx)
        return {**gemm_choice.notes(), **coll.notes()}

    def peers(self, ctx, inputs: Buffers, out) -> dict[str, Peer]:
        """PyTorch's fused op of this pattern (``torch_fused``), where there is one."""
        if self.peer_gaps(ctx):
            return {}
        return {torch_fused.PEER: torch_fused.peer(ctx, self.tp, inputs, out, self.dtype)}

    def peer_gaps(self, ctx) -> dict[str, str]:
        if not self.builtin_host():
            return {torch_fused.PEER: "the workload writes its own host program; torch's fused op "
                                      "computes the plain GEMM and collective"}
        own = find(self.family)  # a user workload of another name computes more than torch's op
        why = torch_fused.gap(ctx, own) if own else f"PyTorch has no fused op for {self.family}"
        return {torch_fused.PEER: why} if why else {}

    def timed_alone(self, ctx) -> dict[str, Callable[[Buffers], Callable[[], None]]]:
        """``torch.matmul`` of the per-rank GEMM alone (``torch_gemm``) where torch runs."""
        if torch_bridge.unusable(ctx):
            return {}
        m, n, k = self.local_gemm()

        def make(inputs: Buffers) -> Callable[[], None]:
            a = dtypes.random(m * k, self.dtype, 13 + ctx.rank) if self.tp.gathers_input else inputs["x"]
            c = dtypes.empty(m * n, self.dtype)
            call = host_gemm.torch_matmul(ctx, _ptr(a), _ptr(inputs["w"]), _ptr(c), m, n, k, self.dtype)
            call.keepalive = (a, c)  # type: ignore[attr-defined]
            return call
        return {"torch_gemm": make}

    def runner(self, ctx, d: Directives, binary: str, arena, inputs: Buffers, out) -> Runner:
        from cuco.workloads.tp.in_kernel import runner_class
        return runner_class(d)(ctx, self, d, binary, arena, inputs, out)

    def chunk_epilogue(self, ctx, inputs: Buffers, ptr: int, row0: int, rows: int, stream) -> None:
        """Work on ``rows`` rows of the local GEMM output starting at row ``row0`` (at
        device address ``ptr``), enqueued on ``stream`` right after their GEMM and
        before the communication may read them. None for the built-ins; a user
        workload adds bias, activation, scaling here (and in its host sequence)."""

    @classmethod
    def has_chunk_epilogue(cls) -> bool:
        """Whether this workload adds Python work between chunks (the one-kernel
        placements cannot run it)."""
        return cls.chunk_epilogue is not GemmWorkload.chunk_epilogue


class _RowParallel(GemmWorkload):
    """Shared by GEMM+AllReduce and GEMM+ReduceScatter: K is split over ranks."""

    def _partial_fp32(self, inputs: Buffers):
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        w32 = dtypes.to_float32(inputs["w"], self.dtype)
        return x32 @ w32  # cuBLAS sgemm, fp32 (CuPy does not use TF32 unless asked)

    def gemm_only(self, ctx, inputs: Buffers):
        m, n, kl = self.local_gemm()
        tmp = dtypes.empty(m * n, self.dtype)
        x, w = _ptr(inputs["x"]), _ptr(inputs["w"])
        return lambda: gemm(x, w, _ptr(tmp), m, n, kl, self.dtype, ctx.stream)


@register
class GemmAllReduce(_RowParallel):
    family = GEMM_ALLREDUCE.name
    pattern = GEMM_ALLREDUCE

    def reference(self, ctx, inputs: Buffers):
        import cupy
        part = self._partial_fp32(inputs)
        out = cupy.empty_like(part)
        ctx.comm.all_reduce(_ptr(part), _ptr(out), part.size, "fp32", ctx.stream.ptr)
        return out

    def host_parts(self, ctx):
        m, n, kl = self.local_gemm()
        return (host_gemm.select(ctx, m, n, kl, self.dtype),
                host_collective.select(ctx, "all_reduce", m * n, self.dtype))

    def host_sequence(self, ctx, inputs: Buffers, out):
        """The fastest GEMM into the all-reduce's buffer (``out``, or a registered window,
        where the result then lands), then the faster NCCL all-reduce in place."""
        gemm_choice, coll = self.host_parts(ctx)
        dst = coll.buffer(ctx, "recv", out)
        return in_order(gemm_choice.bind(_ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(dst)),
                         coll.bind(ctx, dst, dst), output=dst)

    def host_sequence_default(self, ctx, inputs: Buffers, out):
        m, n, kl = self.local_gemm()
        x, w, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(out)

        def run():
            gemm(x, w, o, m, n, kl, self.dtype, ctx.stream)
            ctx.comm.all_reduce(o, o, m * n, self.dtype, ctx.stream.ptr)
        return run

    def comm_only(self, ctx, inputs: Buffers):
        coll = self.host_parts(ctx)[1]
        buf = coll.buffer(ctx, "recv", dtypes.random(self.m * self.n, self.dtype, 7 + ctx.rank))
        return in_order(coll.bind(ctx, buf, buf), output=buf)


@register
class GemmReduceScatter(_RowParallel):
    family = GEMM_REDUCESCATTER.name
    pattern = GEMM_REDUCESCATTER

    def reference(self, ctx, inputs: Buffers):
        import cupy
        part = self._partial_fp32(inputs)
        rows, n = self.output_shape()
        out = cupy.empty((rows, n), dtype=cupy.float32)
        ctx.comm.reduce_scatter(_ptr(part), _ptr(out), rows * n, "fp32", ctx.stream.ptr)
        return out

    def host_parts(self, ctx):
        m, n, kl = self.local_gemm()
        return (host_gemm.select(ctx, m, n, kl, self.dtype),
                host_collective.select(ctx, "reduce_scatter", self.output_elems(), self.dtype))

    def host_sequence(self, ctx, inputs: Buffers, out):
        """The fastest GEMM into the reduce-scatter's send buffer, then the faster NCCL
        reduce-scatter into ``out`` (or a registered window, where the result then lands)."""
        gemm_choice, coll = self.host_parts(ctx)
        m, n, _ = self.local_gemm()
        src = coll.buffer(ctx, "send", dtypes.empty(m * n, self.dtype))
        dst = coll.buffer(ctx, "recv", out)
        return in_order(gemm_choice.bind(_ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(src)),
                         coll.bind(ctx, src, dst), output=dst, scratch=(src,))

    def host_sequence_default(self, ctx, inputs: Buffers, out):
        m, n, kl = self.local_gemm()
        tmp = dtypes.empty(m * n, self.dtype)
        x, w, t, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(tmp), _ptr(out)
        count = self.output_elems()

        def run():
            gemm(x, w, t, m, n, kl, self.dtype, ctx.stream)
            ctx.comm.reduce_scatter(t, o, count, self.dtype, ctx.stream.ptr)
        run.keepalive = tmp  # type: ignore[attr-defined]
        run.scratch = (tmp,)  # type: ignore[attr-defined]
        return run

    def comm_only(self, ctx, inputs: Buffers):
        coll = self.host_parts(ctx)[1]
        src = coll.buffer(ctx, "send", dtypes.random(self.m * self.n, self.dtype, 7 + ctx.rank))
        dst = coll.buffer(ctx, "recv", dtypes.empty(self.output_elems(), self.dtype))
        return in_order(coll.bind(ctx, src, dst), output=dst)


@register
class AllGatherGemm(GemmWorkload):
    family = ALLGATHER_GEMM.name
    pattern = ALLGATHER_GEMM

    def tolerance(self) -> tuple[float, float]:
        """No reduction across ranks: one rounding of the output (twice for slack)."""
        eps = EPS[self.dtype]
        return 2 * eps, eps * (1.0 + math.sqrt(self.k / 65536.0))

    def reference(self, ctx, inputs: Buffers):
        import cupy
        x32 = dtypes.to_float32(inputs["x"], self.dtype)
        full = cupy.empty((self.m, self.k), dtype=cupy.float32)
        ctx.comm.all_gather(_ptr(x32), _ptr(full), x32.size, "fp32", ctx.stream.ptr)
        return full @ dtypes.to_float32(inputs["w"], self.dtype)

    def host_parts(self, ctx):
        m, n, k = self.local_gemm()
        rows, cols = self.operand_shapes().a  # this rank's shard of X, gathered
        return (host_gemm.select(ctx, m, n, k, self.dtype),
                host_collective.select(ctx, "all_gather", rows * cols, self.dtype))

    def host_sequence(self, ctx, inputs: Buffers, out):
        """The faster NCCL all-gather of X (from a registered window holding it, where that
        is faster), then the fastest GEMM into ``out``."""
        gemm_choice, coll = self.host_parts(ctx)
        m, n, k = self.local_gemm()
        full = coll.buffer(ctx, "recv", dtypes.empty(m * k, self.dtype))
        return in_order(coll.bind(ctx, coll.holding(ctx, inputs["x"]), full),
                         gemm_choice.bind(_ptr(full), _ptr(inputs["w"]), _ptr(out)), output=out,
                         scratch=(full,))

    def host_sequence_default(self, ctx, inputs: Buffers, out):
        m, n, k = self.local_gemm()
        full = dtypes.empty(m * k, self.dtype)
        x, w, f, o = _ptr(inputs["x"]), _ptr(inputs["w"]), _ptr(full), _ptr(out)
        count = inputs["x"].size

        def run():
            ctx.comm.all_gather(x, f, count, self.dtype, ctx.stream.ptr)
            gemm(f, w, o, m, n, k, self.dtype, ctx.stream)
        run.keepalive = full  # type: ignore[attr-defined]
        run.scratch = (full,)  # type: ignore[attr-defined]
        return run

    def gemm_only(self, ctx, inputs: Buffers):
        m, n, k = self.local_gemm()
        full = dtypes.random(m * k, self.dtype, 11 + ctx.rank)
        out = dtypes.empty(m * n, self.dtype)
        f, w, o = _ptr(full), _ptr(inputs["w"]), _ptr(out)
        return in_order(lambda: gemm(f, w, o, m, n, k, self.dtype, ctx.stream), output=out, keep=(full,))

    def comm_only(self, ctx, inputs: Buffers):
        """The all-gather alone, of random rows the size of X's shard: gathering X itself
        would leave an input set's gathered operand in memory for the whole job, where a
        candidate could read it instead of moving it (as every other half of a bound does)."""
        coll = self.host_parts(ctx)[1]
        size = inputs["x"].size
        # one per worker and size: a registered collective keeps a window per buffer it sends
        key = ("comm_only_shard", size, self.dtype)
        if key not in ctx.scratch:
            ctx.scratch[key] = dtypes.random(size, self.dtype, 17 + ctx.rank)
        shard = ctx.scratch[key]
        full = coll.buffer(ctx, "recv", dtypes.empty(self.m * self.k, self.dtype))
        return in_order(coll.bind(ctx, coll.holding(ctx, shard), full), output=full)
