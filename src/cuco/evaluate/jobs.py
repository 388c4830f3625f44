"""The job that verifies and times fused variants of a workload on every rank.

A :class:`Case` is sent to every rank of a worker group. Each rank makes the job's input
sets and programs (:mod:`cuco.evaluate.programs`: the strongest host program, the
workload's other baselines, peer libraries' ops, every variant), then verifies and times
them in the order of one schedule (:mod:`cuco.evaluate.schedule`,
:mod:`cuco.evaluate.verification`): every call verified, checked calls at random places
among timed ones, the epoch a job starts from random. So a kernel cannot tell a checked
call from a timed one, and one that reuses a stale result or skips work when timed is
wrong. Each rank returns a typed :class:`~cuco.runtime.records.RankResult`; the parent
merges ranks (:func:`cuco.runtime.records.merge_ranks`: max time, worst error).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuco.design import Directives
from cuco.evaluate.checkers import job_verifier
from cuco.evaluate.programs import (
    InputSet, Program, host_program, input_sets, peer_programs, trusted_program, variant_program,
)
from cuco.evaluate.schedule import N_SETS
from cuco.evaluate.verification import ACCURACY_SLACK, HOST, judge
from cuco.runtime.arena import VariantArena, prepare_arenas, region_slots
from cuco.runtime.peaks import MeasurePeaks, physical_floor_ms
from cuco.runtime.records import RankResult
from cuco.workloads.base import Workload

__all__ = ["ACCURACY_SLACK", "N_CHECKED", "N_SETS", "STRESS_US", "Case", "VariantSpec",
           "first_epoch", "fresh_seed"]

#: Microseconds the compute stream sleeps before each chunk in checked calls.
STRESS_US = 20.0
#: Iterations of each verified program checked (stressed, compared on the host) in a timing job.
N_CHECKED = 4


def fresh_seed() -> int:
    """A job's schedule seed (order, checked positions, poison, stress, first epoch)."""
    import secrets
    return secrets.randbits(48)


def first_epoch(schedule_seed: int) -> int:
    """The epoch a job's first call carries: random per job, the same on every rank."""
    return 1 + random.Random(schedule_seed ^ 0x5EED).randrange(1 << 40)


@dataclass
class VariantSpec:
    """A compiled candidate: its name, directives (JSON) and cubin path."""

    name: str
    directives: str
    cubin: str


@dataclass
class Case:
    """The job that verifies and times fused variants of any workload on every rank
    (see :func:`judge`): the host-driven program (``host_nccl``: the strongest one the
    workload has), the workload's extra baselines and every variant are verified and
    timed in one schedule; the compute alone and the communication alone (the halves of
    the bound) are timed beside them. ``peers``: other libraries' fused ops (torch) join
    the schedule as programs, and their pieces alone (torch's GEMM) are timed; a missing
    one is named with the reason under ``host_nccl``'s ``notes["peers_skipped"]``."""

    workload: Workload
    variants: list[VariantSpec] = field(default_factory=list)
    #: the seed of the job's input sets, or several: :data:`N_SETS` sets each, all in one
    #: schedule (the evaluator's full-shape check of two fresh seeds is one job)
    seed: int | tuple[int, ...] = 1
    #: False: a check-only job (every program once per input set, every call checked)
    time: bool = True
    warmup: int = 5
    iters: int = 30
    n_checked: int = N_CHECKED
    busy_us: float = 40.0
    stress_us: float = STRESS_US
    schedule_seed: int = field(default_factory=fresh_seed)
    peers: bool = False
    #: the workload's other host programs (:meth:`Workload.baselines`) join the job; the
    #: evaluator's check-only stages leave them out (they matter where they are timed:
    #: the baseline is the fastest), keeping ``host_nccl``, the accuracy bar
    baselines: bool = True
    #: where the checks run: None, the worker group's choice (its verifier process where it
    #: started one); ``"inline"`` in the worker; ``"process"`` (refused where there is none)
    verifier: str | None = None

    @property
    def accuracy_slack(self) -> float:
        """The accuracy rule's multiple of the host program's L2 error: the workload's."""
        return self.workload.accuracy_slack

    def __call__(self, ctx) -> RankResult:
        wl = self.workload
        if wl.world_size != ctx.world_size:
            raise ValueError(f"{wl.label} is a problem for {wl.world_size} ranks; this worker "
                             f"group has {ctx.world_size}")
        rtol, atol_f = wl.tolerance()
        seeds = (self.seed,) if isinstance(self.seed, int) else tuple(self.seed)
        layout = wl.layout()
        client = job_verifier(ctx, self.verifier)
        with ctx.stream:  # made on the job's stream, ordered with every call
            # every reference before any candidate kernel of the job: handed to the verifier
            sets = [st for seed in seeds for st in input_sets(ctx, wl, type(wl), seed, atol_f, client)]
            gaps = wl.peer_gaps(ctx) if self.peers else {}  # asked before any peer is made
            programs = self.programs(ctx, sets, layout)
        floor = self.floor_ms(ctx)
        result = judge(ctx, self, programs, self.timed_alone(ctx, sets), sets, rtol, wl.dtype, layout, floor,
                       verifier=client)
        notes = wl.host_notes(ctx)
        if self.peers:
            notes["peers_skipped"] = gaps
        result.programs[HOST].notes = notes
        return result

    def floor_ms(self, ctx) -> float:
        """The physical floor of one call, where a time is scored against it: in a timing job
        of a real world, with work to bound (the peaks are measured once per worker). A
        check-only job scores no time, and an emulated world's times mean nothing, so neither
        measures: the link's peak alone all-gathers 256 MiB per rank, over sockets there."""
        work = self.workload.work()
        if work is None or not self.time or ctx.options.emulated:
            return 0.0
        return physical_floor_ms(work, MeasurePeaks()(ctx))

    def programs(self, ctx, sets: list[InputSet], layout) -> dict[str, Program]:
        """Every verified program of the job: the host program (``host_nccl``), the
        workload's other baselines, peer libraries' ops and every variant on its arena (in a
        job of several, each with a sync region of its own: :meth:`variant_arenas`)."""
        wl, elems = self.workload, self.workload.output_elems()
        arenas = self.variant_arenas(ctx, layout)
        programs = {HOST: host_program(lambda x, o: wl.host_sequence(ctx, x, o), sets, elems, wl.dtype)}
        per_set = [wl.baselines(ctx, st.inputs) if self.baselines else {} for st in sets]
        for name in per_set[0]:  # the other host programs: right answers too
            programs[name] = trusted_program([b[name][0] for b in per_set], [b[name][1] for b in per_set], sets)
        if self.peers:
            programs.update(peer_programs(wl, ctx, sets, elems))
        for v in self.variants:
            d, arena = Directives.from_json(v.directives), arenas[v.name]
            programs[v.name] = variant_program(
                lambda x, o, d=d, v=v, a=arena: wl.runner(ctx, d, v.cubin, a, x, o),
                arena, sets, elems, wl.dtype)
        return programs

    def variant_arenas(self, ctx, layout) -> dict[str, Any]:
        """Each variant's arena, prepared for the job (collective). Alone, the backend's arena
        as the workload lays it out; in a job of several, every arena holds one sync region
        (flags, barrier slots, call state) per variant, each variant's at a place drawn from
        the job's seed, all zeroed and seeded now: no variant's kernels are given another's,
        and nothing any kernel left in one outlives the job."""
        if not self.variants:
            return {}
        backends = {v.name: Directives.from_json(v.directives).backend.value for v in self.variants}
        n = len(self.variants)
        job_layout = layout.with_regions(n) if n > 1 else layout
        arenas = prepare_arenas(ctx, job_layout, set(backends.values()), first_epoch(self.schedule_seed))
        if n == 1:
            return {name: arenas[b] for name, b in backends.items()}
        slots = region_slots(n, self.schedule_seed)
        return {v.name: VariantArena(arenas[backends[v.name]], job_layout, slot, v.name)
                for v, slot in zip(self.variants, slots)}

    def timed_alone(self, ctx, sets: list[InputSet]) -> dict[str, Callable[[], Callable[[], None]]]:
        """Makers of the programs only timed: the halves of the bound (compute alone,
        communication alone) and, with ``peers``, the peers' pieces alone."""
        wl, inputs = self.workload, sets[0].inputs
        extras = {"compute_only": lambda: wl.compute_only(ctx, inputs),
                  "comm_only": lambda: wl.comm_only(ctx, inputs)}
        if self.peers:
            extras.update({name: (lambda make=make: make(inputs)) for name, make in wl.timed_alone(ctx).items()})
        return extras
