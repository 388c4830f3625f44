"""The collectives' job: NCCL and cuco's own collective kernels (LSA, NVSHMEM) on one op at
one size, verified and timed by the evaluator's one verification job.

A :class:`CollectiveCase` is sent to every rank. Each rank draws the job's input sets
(:func:`cuco.evaluate.programs.input_sets`: fresh values from the seed, sealed fp32
references from NCCL in fp32), makes a :class:`~cuco.evaluate.programs.Program` of host NCCL
and of every kernel variant at every CTA count (launched by
:mod:`cuco.runtime.collective_launch`) and hands them to
:func:`~cuco.evaluate.verification.judge`, as :class:`cuco.evaluate.jobs.Case` does a
workload's programs: every call verified, timed ones too, checked calls at random places
among timed ones, each call's output poisoned, the input set changing from call to call. Each
rank returns a typed :class:`~cuco.runtime.records.RankResult`; the parent merges the ranks
(:func:`cuco.runtime.records.merge_ranks`: the slowest rank's time, the worst error).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuco.design.patterns import Collective
from cuco.errors import InputError
from cuco.evaluate.jobs import N_CHECKED, STRESS_US, fresh_seed
from cuco.evaluate.checkers import job_verifier
from cuco.evaluate.programs import InputSet, Program, guarded_output, host_program, input_sets
from cuco.evaluate.verification import ACCURACY_SLACK, HOST, judge
from cuco.runtime.collective_launch import (KERNEL_VARIANTS, CollectiveInputs, CollectiveOp, collective_op,
                                            host_call, kernel_call, prepare_buffers)
from cuco.runtime.dtypes import EPS
from cuco.runtime.records import RankResult

#: The absolute slack of a program with no ring to allow for, relative to max|ref|: fp32 sums
#: of a few terms in another order (about 1e-6 where max|ref| is about 5).
REORDER_SLACK = 2.0**-20


def tolerance(op: CollectiveOp, dtype: str, world_size: int) -> tuple[float, float]:
    """``(rtol, atol_factor)`` every program of a job is held to. cuco's kernels add in fp32
    and round once, as NCCL does at two ranks: rtol 2 eps. At more ranks NCCL's ring rounds
    after each of its W - 1 steps, each relative to a partial sum, and partial sums reach
    max|ref| (the tensor-parallel layers' reasoning): atol 2 (W - 1) eps max|ref| for the
    reductions; a gather moves bits. A rank's input dropped or doubled errs by about rms(x),
    far above either (``tests/test_collective_job_cpu.py`` models both)."""
    eps = EPS[dtype]
    ring = op.collective is not Collective.ALL_GATHER and world_size > 2
    return 2 * eps, (2 * (world_size - 1) * eps if ring else REORDER_SLACK)


@dataclass
class CollectiveCase:
    """One op at one size (bytes of each rank's input) on every rank: host NCCL (the
    accuracy bar and the baseline, always run) and each kernel variant at each CTA count,
    named ``variant@ctas``. ``time=False``: a check-only job (every program once per input
    set, every call checked)."""

    op: str
    nbytes: int
    dtype: str = "bf16"
    #: default: every variant of the op offered at this size (staged and LL: small ones)
    variants: tuple[str, ...] = ()
    ctas: tuple[int, ...] = (8, 16, 32, 64)
    seed: int = 0
    warmup: int = 10
    iters: int = 50
    time: bool = True
    lsa_cubin: str = ""
    nvshmem_cubin: str = ""
    n_checked: int = N_CHECKED
    busy_us: float = 40.0
    stress_us: float = STRESS_US
    schedule_seed: int = field(default_factory=fresh_seed)
    #: where the checks run (:attr:`cuco.evaluate.jobs.Case.verifier`)
    verifier: str | None = None
    #: the accuracy rule's multiple of host NCCL's L2 error (the workloads' default)
    accuracy_slack: float = ACCURACY_SLACK

    def __post_init__(self) -> None:
        has = (HOST, *collective_op(self.op).kernels)
        unknown = [v for v in self.variants if v not in has]
        if unknown:
            raise ValueError(f"{self.op} has no variant {', '.join(unknown)}; it has {', '.join(has)}")
        if not self.variants:
            self.variants = tuple(v for v in has if v == HOST or KERNEL_VARIANTS[v].offered(self.nbytes))
        elif HOST not in self.variants:
            self.variants = (HOST, *self.variants)
        if self.time and self.iters <= self.n_checked:
            raise InputError(f"iters={self.iters} leaves no timed call beside {self.n_checked} checked ones",
                             param="iters", fix=4 * self.n_checked)

    @property
    def data(self) -> CollectiveInputs:
        return CollectiveInputs(collective_op(self.op), self.nbytes, self.dtype)

    def kernels(self, world_size: int) -> list[str]:
        """The kernel variants this job runs on ``world_size`` ranks (LL only where each
        rank's slot is whole 16-byte lines)."""
        d = self.data
        return [v for v in self.variants
                if v != HOST and KERNEL_VARIANTS[v].fits(d.op, d.elems, world_size, self.dtype)]

    def kernel_programs(self, world_size: int) -> dict[str, tuple[str, int]]:
        """``{name: (variant, ctas)}`` of every kernel program (``variant@ctas``)."""
        return {f"{v}@{c}": (v, c) for v in self.kernels(world_size) for c in self.ctas}

    def shares(self, world_size: int) -> dict[str, tuple[str, ...]]:
        """Every program of the job, with the buffers it shares with others (what its
        schedule is drawn from): host NCCL none, each kernel its backend's."""
        kernels = self.kernel_programs(world_size)
        return {HOST: (), **{name: KERNEL_VARIANTS[v].shares for name, (v, _) in kernels.items()}}

    def check_resident(self, ctx) -> None:
        """A kernel's CTAs meet their peers' in barriers, so every rank's grid must be resident
        at once: in an emulated world a grid wider than the rank's share of the one GPU would
        wait for SMs its peers' spinning CTAs hold, forever (W = 8 at 32 CTAs). Refused with
        the count that fits."""
        if not (ctx.options.emulated and self.kernels(ctx.world_size)):
            return
        from cuco.runtime.emulated import persistent_sms
        fits = persistent_sms()
        wide = sorted(c for c in self.ctas if c > fits)
        if wide:
            raise InputError(
                f"ctas={wide}: a collective kernel's CTAs wait in barriers for their peers', so all "
                f"must be resident, but a rank of this emulated world of {ctx.world_size} has {fits} SMs "
                f"of the one GPU; use ctas of {fits} or fewer")

    def __call__(self, ctx) -> RankResult:
        data, w = self.data, ctx.world_size
        data.op.check_split(data.elems, w)
        self.check_resident(ctx)
        rtol, atol_factor = tolerance(data.op, self.dtype, w)
        client = job_verifier(ctx, self.verifier)
        with ctx.stream:  # made on the job's stream, ordered with every call
            sets = input_sets(ctx, data, CollectiveInputs, self.seed, atol_factor, client)
            programs = self.programs(ctx, sets)
        return judge(ctx, self, programs, {}, sets, rtol, self.dtype, None, verifier=client)

    def programs(self, ctx, sets: list[InputSet]) -> dict[str, Program]:
        """Host NCCL on its own guarded output, and every kernel variant at every CTA count on
        the buffers of its backend, which they share (a call's output is poisoned before it
        runs and verified before the next call)."""
        data, dtype = self.data, self.dtype
        nout = data.op.out_elems(data.elems, ctx.world_size)
        programs = {HOST: host_program(lambda x, o: host_call(ctx, data.op, x["x"], o, dtype), sets, nout, dtype)}
        kernels = self.kernels(ctx.world_size)
        if not kernels:
            return programs
        out, guards = guarded_output(nout, dtype)
        bufs = prepare_buffers(ctx, data, [st.inputs["x"] for st in sets], kernels, out, guards,
                               {"lsa": self.lsa_cubin, "nvshmem": self.nvshmem_cubin})
        for name, (variant, ctas) in self.kernel_programs(ctx.world_size).items():
            calls = [kernel_call(ctx, data.op, variant, ctas, bufs, j) for j in range(len(sets))]
            programs[name] = Program([c.call for c in calls], [c.output for c in calls], calls[0].guards,
                                     shares=KERNEL_VARIANTS[variant].shares)
        return programs
