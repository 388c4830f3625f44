"""The programs a verification job runs, and the input sets they run on.

Each rank draws :data:`~cuco.evaluate.schedule.N_SETS` input sets from each of the job's
seeds (different buffers, different values) and their fp32 references, sealed
(:class:`~cuco.runtime.sealed.SealedReference`) and kept per worker across jobs (a search
checks many candidates on the same seeds), with fingerprints of both: a candidate that
writes to its inputs is wrong, and the entry is dropped. A :class:`Program` is one callable
per input set and where each call's result lands: the host programs and peer libraries'
ops (right answers: scrubbed as soon as they are verified) and the fused variants (one
output for every set, so what one set's call left there is wrong for the next call's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cuco.evaluate.schedule import N_SETS, set_seed
from cuco.runtime import dtypes
from cuco.runtime.arena import CANARY, GUARD_BYTES
from cuco.runtime.checking import fingerprint
from cuco.runtime.sealed import SealedReference, scrubbed_allocations
from cuco.runtime.verifier_client import RemoteReference, VerifierClient, hand_over
from cuco.workloads.base import Buffers, Workload, check_scratch

#: Seeds whose inputs and reference a worker keeps (three jobs of N_SETS sets, and more).
CACHED_SEEDS = 4 * N_SETS


def fingerprint_of(buffers) -> tuple:
    """A hash of every byte and its position of each buffer, in name order: a changed input
    or reference changes it."""
    return tuple(fingerprint(v) for _, v in sorted(buffers.items()))


def _class_key(cls: type) -> str:
    """Same class (or the same code of a notebook class) -> same key."""
    import cloudpickle
    return hashlib.sha1(cloudpickle.dumps(cls)).hexdigest()


class InputSource(Protocol):
    """What a job's input sets are drawn from: a :class:`~cuco.workloads.base.Workload`, or
    a collective's inputs (:class:`cuco.runtime.collective_launch.CollectiveInputs`)."""

    @property
    def label(self) -> str: ...

    def make_inputs(self, ctx, seed: int) -> Buffers: ...

    def reference(self, ctx, inputs: Buffers) -> Any: ...


def inputs_and_reference(ctx, wl: InputSource, cls: type, seed: int, verifier: VerifierClient | None = None):
    """``(inputs, fp32 reference, fingerprints of both)`` of ``seed``, made once per worker,
    the reference's temporaries scrubbed. With a ``verifier`` process the reference is made
    with the device idle (no candidate kernel running), handed to the verifier (sealed
    there) and overwritten here: the worker keeps a :class:`RemoteReference`. Without one it
    is sealed here (:class:`~cuco.runtime.sealed.SealedReference`)."""
    import cupy
    cache = ctx.scratch.setdefault("references", {})
    key = (_class_key(cls), wl.label, ctx.world_size, seed, verifier is not None)
    hit = cache.pop(key, None)
    if hit is None:
        with scrubbed_allocations():
            if verifier is not None:
                cupy.cuda.runtime.deviceSynchronize()  # every earlier kernel (a candidate's) ended
            inputs = wl.make_inputs(ctx, seed)
            plain = _fp32(wl.reference(ctx, inputs))
            ref = hand_over(verifier, plain) if verifier is not None else SealedReference.seal(plain)
            del plain
            # a host upload or download on a side stream staged through CuPy's pinned pool:
            # host memory the device addresses (UVA), unmapped here so no copy stays in reach
            cupy.get_default_pinned_memory_pool().free_all_blocks()
        hit = (inputs, ref, fingerprint_of(inputs), ref_fingerprint(ref))
        while len(cache) >= CACHED_SEEDS:
            _forget(ctx, cache.pop(next(iter(cache)))[1])
    cache[key] = hit  # most recent last
    return hit


def ref_fingerprint(ref) -> tuple:
    """A sealed reference's fingerprint (a held one's is out of every kernel's reach: none)."""
    return () if isinstance(ref, RemoteReference) else fingerprint_of({"ref": ref.bits})


def ref_intact(st: "InputSet") -> bool:
    """Whether ``st``'s reference is as it was made (a held one: always)."""
    return ref_fingerprint(st.ref) == st.ref_fingerprint


def _forget(ctx, ref) -> None:
    client = getattr(ctx, "verifier", None)
    if isinstance(ref, RemoteReference) and client is not None and client.alive:
        client.request("drop", ref_ids=[ref.ref_id], all=False)


def drop_references(ctx) -> None:
    """Every cached input set and reference dropped (an input set was written)."""
    ctx.scratch.get("references", {}).clear()
    client = getattr(ctx, "verifier", None)
    if client is not None and client.alive:
        client.request("drop", ref_ids=[], all=True)


def _fp32(ref):
    """A workload's reference as one C-contiguous fp32 array (a copy only where it is not)."""
    import cupy
    if ref.dtype == cupy.float32 and ref.flags.c_contiguous:
        return ref
    return cupy.ascontiguousarray(ref, dtype=cupy.float32)


def guarded_output(n: int, dtype: str):
    """``(out, guards)``: an output of ``n`` elements between two guard pages that hold
    a canary; a candidate that writes past its output changes a guard."""
    import cupy
    g = GUARD_BYTES // dtypes.ITEMSIZE[dtype]
    padded = dtypes.empty(n + 2 * g, dtype)
    guard_bytes = padded.view(cupy.uint8)
    outer = (guard_bytes[:GUARD_BYTES], guard_bytes[-GUARD_BYTES:])
    for part in outer:
        part.fill(CANARY)
    return padded[g:g + n], outer


@dataclass
class InputSet:
    """One of a job's input sets on this rank: inputs, fp32 reference (sealed here, or held
    by the verifier process), fingerprint and the absolute tolerance
    (``atol_factor * max|ref|``)."""

    inputs: Buffers
    ref: SealedReference | RemoteReference
    fingerprint: tuple
    atol: float
    ref_fingerprint: tuple


def input_sets(ctx, wl: InputSource, cls: type, seed: int, atol_factor: float,
               verifier: VerifierClient | None = None) -> list[InputSet]:
    """The job's :data:`~cuco.evaluate.schedule.N_SETS` input sets, each with its own seed
    and buffers (cached per worker like any seed); their references held by ``verifier``
    where given (:func:`inputs_and_reference`)."""
    out = []
    for j in range(N_SETS):
        inputs, ref, fp, ref_fp = inputs_and_reference(ctx, wl, cls, set_seed(seed, j), verifier)
        out.append(InputSet(inputs, ref, fp, atol_factor * ref.amax, ref_fp))
    return out


@dataclass
class Program:
    """A program a job verifies: one callable per input set and where each lands.

    A fused variant has one output buffer for all sets (``outputs`` repeats it), its
    runners (one per set, whose ``stress_us`` checked calls raise) and its arena; a
    program's ``shares`` name the buffers it shares with other programs (the arena).
    """

    calls: list[Callable[[], None]]
    outputs: list[Any]
    guards: tuple = ()
    runners: list[Any] = field(default_factory=list)
    arena: Any = None
    shares: tuple[str, ...] = ()
    #: per set, run after the call's closing event and before its check (a peer's result
    #: into its checked output: never timed)
    settle: list[Callable[[], None]] = field(default_factory=list)
    #: poison the output again as soon as it is verified: a host program's (or a peer
    #: library's) output is a right answer, which a candidate reading memory it was not
    #: given must not find lying there between calls
    scrub: bool = False


def host_program(make: Callable[[Buffers, Any], Callable[[], None]], sets: list[InputSet], elems: int,
                 dtype: str) -> Program:
    """A host-driven program, one callable per input set, each writing the guarded output
    it is given, or the buffer its callable names as ``output`` (e.g. a registered NCCL
    window the result lands in)."""
    out, outer = guarded_output(elems, dtype)
    calls = [make(st.inputs, out) for st in sets]
    outputs = [getattr(c, "output", out) for c in calls]
    return trusted_program(calls, outputs, sets, outer if all(o is out for o in outputs) else ())


def trusted_program(calls: list[Callable[[], None]], outputs: list[Any], sets: list[InputSet],
                    guards: tuple = ()) -> Program:
    """A host program's calls (one per input set), scrubbed as soon as each is verified:
    its output and its ``scratch`` (refused where the scratch overlaps the set's inputs:
    :func:`~cuco.workloads.base.check_scratch`)."""
    for call, st in zip(calls, sets, strict=True):
        check_scratch(call, st.inputs)
    return Program(calls, outputs, guards, scrub=True)


def peer_programs(wl: Workload, ctx, sets: list[InputSet], elems: int) -> dict[str, Program]:
    """Other libraries' fused ops of ``wl`` (:meth:`Workload.peers`), one program each, all
    writing one guarded output (checked right after each call, so they can share it)."""
    out, outer = guarded_output(elems, wl.dtype)
    per_set = [wl.peers(ctx, st.inputs, out) for st in sets]
    return {name: Program([p[name].call for p in per_set], [out] * len(sets), outer,
                          settle=[p[name].settle for p in per_set], scrub=True) for name in per_set[0]}


def variant_program(make: Callable[[Buffers, Any], Any], arena, sets: list[InputSet], elems: int,
                    dtype: str) -> Program:
    """A fused variant: ``make(inputs, out)`` builds its runner for one input set; every
    runner writes the same output (a guarded buffer of its own, or the arena's), so what
    one set's call left there is wrong for the next call's set."""
    out, outer = guarded_output(elems, dtype)
    runners = [make(st.inputs, out) for st in sets]
    own = runners[0].output is out
    return Program(runners, [r.output for r in runners], outer if own else (), runners, arena,
                   (f"arena:{arena.backend}",))
