"""Stream-ordered communication: ``sync_scope=stream`` and ``issuer=copy_engine``, the rules
they obey (the one place that says so). Which workloads have them, on which backends, each
:class:`~cuco.design.pipeline_ops.PipelineOp` says (``stream_ordered_backends``).

A persistent communication kernel (``sync_scope=chunk``) holds its SMs for the whole call,
polling one flag per chunk, and slows the compute beside it. A stream-ordered variant holds
nothing while it waits: each chunk's transfer is enqueued on the side stream behind the
chunk's event, either as a short kernel of ``comm_ctas`` CTAs (issuer ``thread``, ``warp``
or ``cta``: SMs are held only while they copy) or as a peer copy by the copy engine
(issuer ``copy_engine``: no SM at all). The receiver still waits on a flag per chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cuco.design.dimensions import Issuer, SyncScope
from cuco.design.pipeline_ops import SM_ISSUERS, SM_SYNC_SCOPES, find_op
from cuco.design.problem import Problem

__all__ = ["SM_ISSUERS", "SM_SYNC_SCOPES", "repair", "violations"]


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def violations(d: Mapping[str, Any], problem: Problem | None = None) -> list[str]:
    """The rules of the two stream-ordered values that ``d`` breaks (for ``problem``'s
    workload if given: only a pipeline op with stream-ordered templates has them, on the
    backends it names)."""
    out: list[str] = []
    issuer, sync = _v(d["issuer"]), _v(d["sync_scope"])
    placement, backend = _v(d["placement"]), _v(d["backend"])
    if issuer == "copy_engine" and sync != "stream":
        out.append(f"sync_scope: issuer=copy_engine copies each chunk in stream order after its "
                   f"event (the copy engine polls no flag), not sync_scope={sync}; set "
                   "sync_scope=stream")
    if sync == "stream" and placement != "side_stream":
        out.append(f"sync_scope: sync_scope=stream enqueues each chunk's transfer on a side "
                   f"stream, not in placement={placement}'s kernel; set placement=side_stream")
    if issuer == "copy_engine" and d["comm_ctas"] != 1:
        out.append(f"comm_ctas: issuer=copy_engine launches no kernel, so comm_ctas="
                   f"{d['comm_ctas']} means nothing; set comm_ctas=1 (one point per copy-engine "
                   "variant)")
    if problem is None:
        return out
    workload, op = problem.workload, find_op(problem.workload)
    allowed = tuple(b.value for b in op.stream_ordered_backends) if op else ()
    if not allowed:
        if issuer == "copy_engine":
            out.append(f"issuer: {workload} has no copy-engine template; its issuers are "
                       f"{', '.join(i.value for i in SM_ISSUERS)}")
        if sync == "stream":
            out.append(f"sync_scope: {workload} has no stream-ordered template; its sync scopes "
                       f"are {', '.join(s.value for s in SM_SYNC_SCOPES)}")
    elif (issuer == "copy_engine" or sync == "stream") and backend not in allowed:
        out.append(f"backend: the stream-ordered {workload} variants copy into a peer's arena on "
                   f"one host; choose backend {' or '.join(allowed)}, not {backend}")
    return out


def repair(values: dict[str, Any], choices: Mapping[str, Sequence[Any]]) -> None:
    """Fix the couplings a single-field change of a stream-ordered point breaks (used by
    :meth:`cuco.design.DesignSpace.mutate` and ``crossover``)."""
    if values["issuer"] == Issuer.COPY_ENGINE:
        if SyncScope.STREAM in choices["sync_scope"]:
            values["sync_scope"] = SyncScope.STREAM
        if 1 in choices["comm_ctas"]:
            values["comm_ctas"] = 1
