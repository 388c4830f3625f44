"""What computes a pipeline op's steps (``core``): the rules of the library cores, in one
place. Which ops have which library cores each :class:`~cuco.design.pipeline_ops.PipelineOp`
says (``library_cores``).

``core=own`` (every workload) runs the template's own compute kernel. A library core
(``flash``, ``cudnn``: context-parallel attention) calls the library's kernel once per phase
on the compute stream (the local data first, then each peer's as it arrives), while the
template's persistent communication kernel moves the peers' data on a side stream; a small
kernel of the template merges the phases' partial results. So a library core exists only
beside a side-stream communication kernel, and only for an op that names it.

``peer_calls`` says how a library core calls over the peers' data: a phase per peer
(``per_peer``), the peers' data together in as few calls as the mask allows (``grouped``),
or one call over every rank's keys, the own included (``all_keys``). Only a library core
makes calls. Grouping changes nothing where a rank has one peer (two ranks), so ``grouped``
is refused there; ``all_keys`` is not (one call instead of two and a merge), but it needs a
peer and an unmasked problem: one library call has no mask for a causal zig-zag shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cuco.design.dimensions import Core, PeerCalls, Placement
from cuco.design.pipeline_ops import find_op
from cuco.design.problem import CPProblem, Problem

__all__ = ["peer_calls_violations", "repair", "violations"]


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def violations(d: Mapping[str, Any], problem: Problem | None = None) -> list[str]:
    """The rules of ``core`` and ``peer_calls`` that ``d`` breaks (for ``problem``'s workload
    if given: only an op that lists the library among its ``library_cores`` has it)."""
    core = Core(_v(d.get("core", Core.OWN)))
    out = peer_calls_violations(d, problem)
    if not core.library:
        return out
    placement = _v(d["placement"])
    if Placement(placement).in_kernel:
        out.append(f"core: core={core.value} calls a library's kernel per phase on the compute "
                   f"stream beside a communication kernel of its own, not inside "
                   f"placement={placement}'s kernel; set placement=side_stream or core=own")
    if problem is None:
        return out
    op = find_op(problem.workload)
    have = op.library_cores if op is not None else ()
    if core not in have:
        offered = ", ".join(c.value for c in have)
        out.append(f"core: {problem.workload} has no core={core.value} "
                   + (f"(its library cores: {offered}); " if offered else "(it computes with its own "
                      "kernels only); ")
                   + "set core=own" + (f" or one of {offered}" if offered else ""))
    return out


def peer_calls_violations(d: Mapping[str, Any], problem: Problem | None = None) -> list[str]:
    """``peer_calls`` other than ``per_peer`` needs a library core (cuco's own kernel makes
    no calls to group); for ``problem``, ``grouped`` needs more than two ranks (one peer is
    one call either way) and ``all_keys`` a peer and no causal mask."""
    calls = PeerCalls(_v(d.get("peer_calls", PeerCalls.PER_PEER)))
    if calls is PeerCalls.PER_PEER:
        return []
    core = Core(_v(d.get("core", Core.OWN)))
    if not core.library:
        return [f"peer_calls: peer_calls={calls.value} groups a library core's calls; core={core.value} "
                f"walks its own tiles: set core=flash or core=cudnn, or peer_calls=per_peer"]
    if problem is None:
        return []
    w = problem.world_size
    if calls is PeerCalls.GROUPED and w < 3:
        return [f"peer_calls: with world_size={w} a rank has at most one peer, so "
                f"peer_calls=grouped makes the same calls as per_peer; set peer_calls=per_peer"]
    if calls is PeerCalls.ALL_KEYS and w < 2:
        return [f"peer_calls: with world_size={w} there are no peers' keys to join, so "
                f"peer_calls=all_keys makes the same call as per_peer; set peer_calls=per_peer"]
    if calls is PeerCalls.ALL_KEYS and isinstance(problem, CPProblem) and problem.causal:
        fix = "peer_calls=per_peer" + (" or grouped" if w >= 3 else "")
        return [f"peer_calls: peer_calls=all_keys attends every key in one unmasked library call, "
                f"and a causal zig-zag shard sees only some of them; set {fix}, or causal=false"]
    return []


def repair(values: dict[str, Any], choices: Mapping[str, Sequence[Any]],
           problem: Problem | None = None) -> None:
    """Fix the couplings a single-field change breaks (a library core moved into an in-kernel
    placement goes back to ``own``; ``peer_calls`` that the core or ``problem`` refuses —
    ``own`` calls nothing to group, ``grouped`` at two ranks, ``all_keys`` under a causal
    mask — goes back to ``per_peer``; used by :meth:`cuco.design.DesignSpace.mutate`)."""
    core = values.get("core", Core.OWN)
    if Core(_v(core)).library and Placement(_v(values["placement"])).in_kernel \
            and Core.OWN in choices.get("core", (Core.OWN,)):
        values["core"] = Core.OWN
    if peer_calls_violations(values, problem) \
            and PeerCalls.PER_PEER in choices.get("peer_calls", (PeerCalls.PER_PEER,)):
        values["peer_calls"] = PeerCalls.PER_PEER
