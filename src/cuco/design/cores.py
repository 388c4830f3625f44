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
(``per_peer``), or the peers' data together in as few calls as the mask allows
(``grouped``). Only a library core makes calls, and grouping changes nothing where a rank
has one peer (two ranks), so ``grouped`` is refused there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cuco.design.dimensions import Core, PeerCalls, Placement
from cuco.design.pipeline_ops import find_op
from cuco.design.problem import Problem

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
    """``peer_calls=grouped`` needs a library core (cuco's own kernel makes no calls to
    group) and, for ``problem``, more than two ranks (one peer is one call either way)."""
    if PeerCalls(_v(d.get("peer_calls", PeerCalls.PER_PEER))) is PeerCalls.PER_PEER:
        return []
    core = Core(_v(d.get("core", Core.OWN)))
    if not core.library:
        return [f"peer_calls: peer_calls=grouped groups a library core's calls; core={core.value} "
                f"walks its own tiles: set core=flash or core=cudnn, or peer_calls=per_peer"]
    if problem is not None and problem.world_size < 3:
        return [f"peer_calls: with world_size={problem.world_size} a rank has at most one peer, so "
                f"peer_calls=grouped makes the same calls as per_peer; set peer_calls=per_peer"]
    return []


def repair(values: dict[str, Any], choices: Mapping[str, Sequence[Any]]) -> None:
    """Fix the couplings a single-field change breaks (a library core moved into an in-kernel
    placement goes back to ``own``; ``own`` calls nothing to group, so ``peer_calls`` goes
    back to ``per_peer``; used by :meth:`cuco.design.DesignSpace.mutate`)."""
    core = values.get("core", Core.OWN)
    if Core(_v(core)).library and Placement(_v(values["placement"])).in_kernel \
            and Core.OWN in choices.get("core", (Core.OWN,)):
        values["core"] = Core.OWN
    if not Core(_v(values.get("core", Core.OWN))).library \
            and PeerCalls.PER_PEER in choices.get("peer_calls", (PeerCalls.PER_PEER,)):
        values["peer_calls"] = PeerCalls.PER_PEER
