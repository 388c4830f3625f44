"""The three pipeline ops as typed objects: what each one is, in one place.

A pipeline op is a sequence of compute steps whose pieces cross ranks while later steps
compute (:mod:`cuco.workloads.pipeline`):

* ``moe``           MoE dispatch -> expert GEMMs -> combine (:class:`~cuco.design.MoEProblem`)
* ``kv_transfer``   prefill layers, each layer's K/V sent to a decode rank
  (:class:`~cuco.design.KVProblem`)
* ``cp_attention``  context-parallel attention over zig-zag chunks
  (:class:`~cuco.design.CPProblem`)

Everything else asks the :class:`PipelineOp` object (its problem class, the templates its
fused kernels are rendered from, the backends they take, which stream-ordered values it
offers and on which backends, which libraries may compute its steps) instead of comparing its name: a name (a string from the CLI, a database row, a
problem's ``workload``, a rendered source's name) is looked up here once, by
:func:`find_op` (or :func:`pipeline_op`), where it arrives. A user's op (a
:class:`PipelineOp` of a problem class of its own, e.g. ``examples/custom_op.py``) joins the
lookup with :func:`register_op`; :data:`PIPELINE_OPS` stays the built-in ones. The tensor-parallel patterns
are the same thing for GEMM + collective layers (:mod:`cuco.design.patterns`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.design.dimensions import Backend, Core, Issuer, PeerCalls, SyncScope
from cuco.design.problem import CPProblem, KVProblem, MoEProblem, Problem
from cuco.design.registry import Registry
from cuco.errors import InputError

#: Issuers whose bytes SM threads move, and the sync scopes every placement may have.
SM_ISSUERS: tuple[Issuer, ...] = (Issuer.THREAD, Issuer.WARP, Issuer.CTA)
SM_SYNC_SCOPES: tuple[SyncScope, ...] = (SyncScope.CHUNK, SyncScope.CTA, SyncScope.KERNEL)


@dataclass(frozen=True)
class PipelineOp:
    """One pipeline op (see the module's docstring); three instances exist, :data:`MOE`,
    :data:`KV_TRANSFER` and :data:`CP_ATTENTION`."""

    #: the workload name (the built-in workload's ``family``, its problem's ``workload``)
    name: str
    #: the :class:`Problem` subclass of its shapes
    problem: type[Problem]
    #: the template its fused (side-stream) kernels are rendered from, on one host (LSA and
    #: NVSHMEM: a sender stores into, or puts to, its peer's arena)
    template: str
    #: the backends its stream-ordered variants (``sync_scope=stream``,
    #: ``issuer=copy_engine``) run on; empty: it has none. The arena (an NCCL window or the
    #: NVSHMEM heap) gives the sender its peer's address to copy to.
    stream_ordered_backends: tuple[Backend, ...] = ()
    #: the template of its GIN variants (ranks on different hosts: every byte that crosses
    #: ranks is a GIN put with a signal, no peer pointer); None: it has no GIN variant
    gin_template: str | None = None
    #: the libraries that may compute its steps instead of its template's own compute kernel
    #: (``core=flash`` / ``core=cudnn``: a library call per phase, cuco's communication
    #: kernel and merge beside it); empty: only ``core=own``. Rules: :mod:`cuco.design.cores`
    library_cores: tuple[Core, ...] = ()

    def __post_init__(self) -> None:
        if self.problem.model_fields["workload"].default != self.name:
            raise ValueError(f"{self.problem.__name__} is not the problem of {self.name}")

    def __repr__(self) -> str:
        return f"PipelineOp({self.name})"

    def __str__(self) -> str:
        return self.name

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The backends its fused templates render: LSA and NVSHMEM, and GIN where it has a
        GIN template (the one table the design space and the workloads read)."""
        return (Backend.LSA, Backend.NVSHMEM) + ((Backend.GIN,) if self.gin_template else ())

    def template_for(self, backend: Backend | str) -> str:
        """The template a fused variant on ``backend`` is rendered from."""
        return self.gin_template if Backend(backend) is Backend.GIN and self.gin_template else self.template

    @property
    def stream_ordered(self) -> bool:
        """Whether it has stream-ordered templates (a kernel per chunk, the copy engine)."""
        return bool(self.stream_ordered_backends)

    @property
    def issuers(self) -> tuple[Issuer, ...]:
        """The issuers its templates render (``copy_engine`` where it is stream-ordered)."""
        return (*SM_ISSUERS, Issuer.COPY_ENGINE) if self.stream_ordered else SM_ISSUERS

    @property
    def cores(self) -> tuple[Core, ...]:
        """The cores its fused variants may compute with: its own, then its library cores."""
        return (Core.OWN, *self.library_cores)

    @property
    def peer_calls(self) -> tuple[PeerCalls, ...]:
        """How its library cores may call over the peers' data: every :class:`PeerCalls` value
        (a phase per peer, grouped, one call over all keys) where it has library cores;
        ``per_peer`` alone otherwise."""
        return tuple(PeerCalls) if self.library_cores else (PeerCalls.PER_PEER,)

    def sync_scopes(self, side_stream_only: bool = True) -> tuple[SyncScope, ...]:
        """The sync scopes of its side-stream templates (``chunk``; ``stream`` too where it
        is stream-ordered); every placement's with ``side_stream_only=False``."""
        base = (SyncScope.CHUNK,) if side_stream_only else SM_SYNC_SCOPES
        return (*base, SyncScope.STREAM) if self.stream_ordered else base


MOE = PipelineOp("moe", MoEProblem, "moe.cu.j2", gin_template="moe_gin.cu.j2")
KV_TRANSFER = PipelineOp("kv_transfer", KVProblem, "kv_transfer.cu.j2",
                         (Backend.LSA, Backend.NVSHMEM))
CP_ATTENTION = PipelineOp("cp_attention", CPProblem, "cp_attention.cu.j2",
                          library_cores=(Core.FLASH, Core.CUDNN))

#: Every pipeline op, in the order listings use.
PIPELINE_OPS: tuple[PipelineOp, ...] = (MOE, KV_TRANSFER, CP_ATTENTION)
#: Their names (the workloads' names).
PIPELINE_NAMES: tuple[str, ...] = tuple(op.name for op in PIPELINE_OPS)
_REGISTRY = Registry(PipelineOp, PIPELINE_OPS, "{name!r} is not a pipeline op", param="workload")


def register_op(op: PipelineOp) -> PipelineOp:
    """Make a user's op (one defined outside cuco) found by its name, like the built-in ones
    (its stream-ordered rules included); a :class:`~cuco.workloads.PipelineWorkload`
    subclass registers its ``op`` when it is defined. A built-in's name is refused."""
    return _REGISTRY.add(op)


def find_op(name: str | PipelineOp | None) -> PipelineOp | None:
    """The op named ``name`` (an op passes through); None for any other workload."""
    return _REGISTRY.find(name)


def pipeline_op(name: str | PipelineOp, error: type[InputError] = InputError) -> PipelineOp:
    """The op named ``name``, or ``error`` naming the closest one."""
    return _REGISTRY.get(name, error)
