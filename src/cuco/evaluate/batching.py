"""How the candidates of a batch share GPU jobs (:meth:`cuco.evaluate.Evaluator.evaluate_many`).

Pure Python, tested on the CPU: which candidates are ready for the GPUs (their builds done)
and in what groups, the names the candidates of one shared job go by, and the timeout of a
job that several share. What a shared job means for a verdict (a candidate wrong in it, or
every candidate of one that failed, is judged again alone) is the evaluator's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait

from cuco.evaluate.jobs import VariantSpec


def in_build_batches(pending: Sequence[Sequence[Future] | None], most: int) -> Iterator[list[int]]:
    """Indices of ``pending`` (each a candidate's build futures, or None: nothing to build) in
    groups of at most ``most``: those with nothing to build first, then, each time the caller
    asks (the GPUs are free), every candidate whose builds are done by then, waiting only
    while none is. The GPUs judge whatever is ready instead of idling on the slowest build of
    a batch (a CUTLASS build beside side-stream ones), and what is ready shares one job."""
    most = max(1, most)
    ready = [i for i, futures in enumerate(pending) if futures is None]
    waiting = {i: futures for i, futures in enumerate(pending) if futures is not None}
    while ready or waiting:
        done = [i for i, futures in waiting.items() if all(f.done() for f in futures)]
        for i in done:
            del waiting[i]
        ready += done
        if not ready:
            wait([f for futures in waiting.values() for f in futures], return_when=FIRST_COMPLETED)
            continue
        yield ready[:most]
        del ready[:most]


def shared_names(specs: Sequence[VariantSpec]) -> list[VariantSpec]:
    """The candidates of one job, each under a name of its own: ``candidate`` alone,
    ``candidate0``, ``candidate1``, ... together."""
    if len(specs) == 1:
        return [VariantSpec("candidate", specs[0].directives, specs[0].cubin)]
    return [VariantSpec(f"candidate{j}", s.directives, s.cubin) for j, s in enumerate(specs)]


def shared_timeout(timeout: float, candidates: int) -> float:
    """A stage's timeout for a job of ``candidates``: the programs every job has (the host
    programs) once, each further candidate half a job's worth more."""
    return timeout * (1 + (max(1, candidates) - 1) / 2)
