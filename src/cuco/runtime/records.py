"""What a verification job reports about each program it ran: typed, one rank's and merged.

A job (the evaluator's :class:`cuco.evaluate.jobs.Case`, the collectives'
:class:`cuco.evaluate.collective_job.CollectiveCase`) returns one :class:`RankResult` per
rank, holding a :class:`ProgramRecord` per program; the parent merges them over the ranks
into one :class:`ProgramResult` per program (:func:`merge_ranks`: the slowest rank's time,
the worst error, correct only where every rank was). Every reader (the evaluator's verdict,
the benchmarks' rows, dispatch tables) reads these fields, never keys of a dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


#: What a call that wrote outside its sync region's live slots wrote into
#: (:class:`cuco.runtime.arena.LiveSlots`).
OWN_SLACK = "the unused slots of its own sync region"
#: ... and one that left its runner's memory meant to be zero between calls nonzero (a
#: split-K build's arrival counters).
OWN_ZEROED = "memory its runner leaves at zero between calls (split-K arrival counters)"
#: ... and one that left values in its arena past every sync region (up to the arena's mapped
#: end: a 2 MiB granule, or a larger job's regions).
OWN_TAIL = "its arena past the sync regions"
#: State a kernel kept between calls, where it may keep none.
OWN_STATE = (OWN_SLACK, OWN_ZEROED, OWN_TAIL)


@dataclass(frozen=True)
class FailedCall:
    """The first call of a program that was wrong on one rank."""

    iteration: int  # negative: a warm-up call
    input_set: int
    checked: bool  # poisoned, stressed and compared on the host (else verified on the device)
    bad_elements: int
    rank: int
    #: its device count or L2 sums were changed after the check wrote them (their tag no
    #: longer matches): some kernel wrote memory it was not given
    tampered: bool = False
    #: set where the call changed sync regions not its own (another variant's flags, barrier
    #: slots or call state in a shared job): whose (also ``tampered``); or :data:`OWN_SLACK`
    wrote_into: str = ""
    #: a neighbour of its shared job wrote into its sync region before this call (what the
    #: region held was not its doing: it is judged again alone)
    disturbed: bool = False

    def describe(self) -> str:
        """``a timed call, iteration 7 on input set 2, rank 1: 12 elements differ ...``"""
        kind = "a checked (poisoned, stressed)" if self.checked else (
            "a timed" if self.iteration >= 0 else "a warm-up")
        where = f"{kind} call, iteration {self.iteration} on input set {self.input_set}, rank {self.rank}"
        if self.wrote_into in OWN_STATE:
            return (f"{where}: it left values in {self.wrote_into} (memory that outlives a call "
                    "and that no call reads: a kernel may keep nothing between calls, such as a "
                    "memo of earlier results)")
        if self.wrote_into:
            return (f"{where}: it changed {self.wrote_into} (flags, barrier slots or call state "
                    "that were not its own, in a job it shared)")
        if self.disturbed:
            return (f"{where}: its sync region held values a neighbour in its shared job wrote "
                    "there (judged again alone)")
        if self.tampered:
            return (f"{where}: its verification count was changed after the check wrote it (a "
                    "kernel wrote memory it was not given)")
        return f"{where}: {self.bad_elements} elements differ from the reference"


@dataclass
class ProgramRecord:
    """One program of a job on one rank. ``verified`` is False for a program that was only
    timed (the halves of the bound, a peer library's pieces): its correctness fields mean
    nothing."""

    verified: bool = True
    correct: bool = True
    bad_elements: int = 0
    rel_l2_error: float = 0.0
    #: the worst relative L2 error of the calls compared on the host (no device memory a
    #: candidate could write went into it)
    checked_l2: float = 0.0
    guards_intact: bool = True
    inputs_intact: bool = True
    #: False: a call of this program changed another variant's sync region (a shared job)
    sync_intact: bool = True
    calls_verified: int = 0
    calls_checked: int = 0
    #: the physical floor of one call on this rank (:func:`cuco.runtime.peaks.physical_floor_ms`)
    floor_ms: float = 0.0
    failed_call: FailedCall | None = None
    #: set when the program was wrong for being less accurate than the host program: its L2 error
    less_accurate_than_host: float | None = None
    median_ms: float | None = None
    samples: int = 0
    #: what a program is made of (the strongest host program's GEMM and collective, peers skipped)
    notes: dict[str, Any] = field(default_factory=dict)

    def fail(self, failed: FailedCall) -> None:
        """Wrong, at ``failed`` (the first failing call in the schedule's order)."""
        self.correct, self.bad_elements, self.failed_call = False, failed.bad_elements, failed


@dataclass
class RankResult:
    """Everything one rank of a job reports: a record per program, and the seconds its
    verification took (host comparisons and device counts: never inside a timed interval)."""

    rank: int
    programs: dict[str, ProgramRecord]
    verify_s: float = 0.0
    #: where the checks ran: ``process`` (the rank's verifier process) or ``inline`` (in the
    #: worker, the candidate's own process)
    verifier: str = "inline"


@dataclass
class ProgramResult:
    """One program of a job, merged over its ranks."""

    verified: bool
    correct: bool
    #: the slowest rank's median (None: the program was not timed)
    ms: float | None
    rank_ms: list[float]
    bad_elements: int = 0
    rel_l2_error: float = 0.0
    guards_intact: bool = True
    inputs_intact: bool = True
    #: False: on some rank a call of it changed another variant's sync region
    sync_intact: bool = True
    failed_call: FailedCall | None = None
    less_accurate_than_host: float | None = None
    #: the most generous rank's floor
    floor_ms: float = 0.0
    calls_verified: int = 0
    calls_checked: int = 0
    samples: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.ms is not None

    def verdict(self) -> dict[str, Any]:
        """``correct``, ``bad_elements`` and ``rel_l2_error`` for a results row (None for a
        program that was only timed)."""
        if not self.verified:
            return {"correct": None, "bad_elements": None, "rel_l2_error": None}
        return {"correct": self.correct, "bad_elements": self.bad_elements, "rel_l2_error": self.rel_l2_error}

    def as_dict(self) -> dict[str, Any]:
        """Plain data (a results file, a stored verdict's extra)."""
        return asdict(self)


def merge_ranks(per_rank: list[RankResult]) -> dict[str, ProgramResult]:
    """Max time over ranks, worst error over ranks, correct only if correct everywhere."""
    return {name: merge_program([r.programs[name] for r in per_rank]) for name in per_rank[0].programs}


def merge_program(recs: list[ProgramRecord]) -> ProgramResult:
    """One program's records of every rank as one result."""
    times = [r.median_ms for r in recs if r.median_ms is not None]
    timed = len(times) == len(recs)
    failed = [r.failed_call for r in recs if r.failed_call is not None]
    worse = [r.less_accurate_than_host for r in recs if r.less_accurate_than_host is not None]
    return ProgramResult(
        verified=recs[0].verified,
        correct=all(r.correct for r in recs),
        ms=max(times) if timed else None,
        rank_ms=times if timed else [],
        bad_elements=sum(r.bad_elements for r in recs),
        rel_l2_error=max(r.rel_l2_error for r in recs),
        guards_intact=all(r.guards_intact for r in recs),
        inputs_intact=all(r.inputs_intact for r in recs),
        sync_intact=all(r.sync_intact for r in recs),
        # the earliest failing call of any rank, a write into another variant's region first
        failed_call=min(failed, key=lambda c: (not c.wrote_into, c.iteration, c.rank)) if failed else None,
        less_accurate_than_host=max(worse) if worse else None,
        floor_ms=min(r.floor_ms for r in recs),
        calls_verified=min(r.calls_verified for r in recs),
        calls_checked=min(r.calls_checked for r in recs),
        samples=min(r.samples for r in recs),
        notes=recs[0].notes,  # agreed by every rank: rank 0's
    )
