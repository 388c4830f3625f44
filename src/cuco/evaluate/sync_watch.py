"""Who wrote into another variant's sync region in a shared job.

In a job of several variants each has a sync region of its own (flags, barrier slots, call
state: :meth:`cuco.runtime.arena.ArenaLayout.with_regions`), at a place drawn per job. Every
region of every arena the job's variants use is summed under a key the candidates never see
(:func:`cuco.runtime.checking.region_sums_async`) at each point where the ranks start a call
together: after the host-side all-reduce that opens it, so every rank's previous call, and
any write it made into a peer, has ended. Between two such snapshots one call ran; a region
that changed and is not that call's program's own was written by it (a kernel that forges a
neighbour's flags ahead of its epoch, or leaves a value for a later job, changes a region it
does not own). The snapshots live where the checker keeps its counts: in the verifier
process, or tagged in the worker (a rewritten row fails its tag).

Pure Python over the sums the checker returns: the CPU tests exercise every rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuco.runtime.arena import VariantArena

#: What a broken snapshot row is charged as written into (inline checker only).
SNAPSHOTS = "the evaluator's snapshots of the sync regions"


@dataclass(frozen=True)
class CallMade:
    """One call between two snapshots: its program, its index in the schedule (or the first
    launches' index) and the schedule's :class:`~cuco.evaluate.schedule.Call`."""

    program: str
    idx: int
    call: Any


@dataclass(frozen=True)
class Blame:
    """A program's first call that changed regions it does not own, and whose they were."""

    idx: int
    call: Any
    wrote_into: str
    #: the variants whose regions it changed (its own state's findings: none)
    victims: frozenset[str] = frozenset()


class SyncWatch:
    """The sync regions of one job, their owners, and the call between each two snapshots.

    ``spans``: per arena, ``(device address of its first region, regions)``; ``owners``: the
    variant owning each region in that order (None: a slot no variant of that backend has);
    ``region_bytes``: one region's size."""

    def __init__(self, spans: Sequence[tuple[int, int]], owners: Sequence[str | None], region_bytes: int):
        if sum(n for _, n in spans) != len(owners):
            raise ValueError(f"{len(owners)} owners for {sum(n for _, n in spans)} regions")
        self.spans, self.owners, self.region_bytes = list(spans), list(owners), region_bytes
        self.variants = {o for o in owners if o is not None}
        self.between: list[CallMade | None] = []  # per snapshot row, the call since the last
        self.last_variant: CallMade | None = None
        self.rows = 0

    @classmethod
    def of(cls, programs: dict[str, Any]) -> "SyncWatch | None":
        """The watch of a job's programs, or None where fewer than two variants share it (a
        variant alone has the only region: nothing of another's to write)."""
        shared = {name: p.arena for name, p in programs.items() if isinstance(p.arena, VariantArena)}
        if len(shared) < 2:
            return None
        spans, owners, region_bytes = [], [], None
        for base in {id(a.arena): a for a in shared.values()}.values():
            job = base.job_layout
            region_bytes = job.region_bytes
            spans.append((base.arena.ptr + job.flags, job.regions))
            mine = {a.slot: name for name, a in shared.items() if a.arena is base.arena}
            owners.extend(mine.get(k) for k in range(job.regions))
        return cls(spans, owners, region_bytes)

    def start(self, checker, rows: int) -> None:
        """The checker keeps ``rows`` snapshots of every region (before the job's first call)."""
        self.rows = rows
        checker.watch(self.spans, self.region_bytes, rows)

    def snapshot(self, checker, after: CallMade | None) -> None:
        """A snapshot now (the ranks together, no call running); ``after``: the call made
        since the last one (None for the first)."""
        row = len(self.between)
        if row >= self.rows:
            raise RuntimeError(f"sync snapshot {row} of a job that made room for {self.rows}")
        if after is not None and after.program in self.variants:
            self.last_variant = after
        elif after is not None:
            # a call of no region (a host program, a half of the bound) writes none: a change
            # seen after it is a late write of the last variant call's (a kernel left running)
            after = self.last_variant
        self.between.append(after)
        checker.snapshot(row)

    def blame(self, sums, intact: Sequence[bool]) -> dict[str, Blame]:
        """Each program whose call changed a region not its own, at its first such call.
        ``sums``: per snapshot row the region sums; ``intact``: whether each row still
        matched its tag. A row that did not was rewritten after it was taken: every variant
        that ran after it is charged (none can be cleared)."""
        out: dict[str, Blame] = {}
        n = len(self.between)
        broken = next((r for r in range(n) if not intact[r]), n)
        for r in range(1, broken):
            made = self.between[r]
            if made is None or made.program in out:
                continue
            changed = [v for v, owner in enumerate(self.owners)
                       if owner != made.program and int(sums[r][v]) != int(sums[r - 1][v])]
            if changed:
                out[made.program] = Blame(made.idx, made.call, _whose(self.owners, changed),
                                          frozenset(o for v in changed if (o := self.owners[v])))
        for r in range(broken + 1, n):
            made = self.between[r]
            if made is not None and made.program not in out:
                out[made.program] = Blame(made.idx, made.call, SNAPSHOTS)
        return out


def own_state_blames(slack: dict[str, Blame], sync: dict[str, Blame]) -> tuple[dict[str, Blame], dict[str, Blame]]:
    """Split the findings in variants' own state (``slack``: values left in a region's unused
    slots, ...) into those that are their own doing and those a neighbour caused: a region
    some other variant of the job wrote into (``sync``) holds what that one left there, so its
    owner is disturbed (wrong in this job, judged again alone), not a tamperer.
    Returns ``(own, disturbed)``."""
    written = {v for b in sync.values() for v in b.victims}
    own = {n: b for n, b in slack.items() if n not in written}
    return own, {n: b for n, b in slack.items() if n in written}


def _whose(owners: Sequence[str | None], changed: list[int]) -> str:
    """``candidate1's sync region``, ``an unused sync region``, or several, in words."""
    names = sorted({owners[v] or "" for v in changed})
    parts = [f"{n}'s sync region" if n else "an unused sync region" for n in names]
    return ", ".join(parts)
