"""The five dimensions of the CUCo design space, and the tunables beside them.

Each dimension is a string enum so directives read well in JSON, in the
database and in variant names (``lsa.dedicated_ctas.chunk.warp.c256K``).
"""

from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    """Which device-initiated transport moves the bytes."""

    LSA = "lsa"  # NCCL device API: loads/stores into peers' NVLink windows
    GIN = "gin"  # NCCL GPU-initiated networking: one-sided puts + signals
    NVSHMEM = "nvshmem"  # NVSHMEM put/get/signal


class Placement(str, Enum):
    """Where communication runs relative to the compute."""

    EPILOGUE = "epilogue"  # in the compute CTAs, after each tile
    DEDICATED_CTAS = "dedicated_ctas"  # CTAs of the same kernel reserved for it
    SIDE_STREAM = "side_stream"  # a separate kernel on a concurrent stream

    @property
    def in_kernel(self) -> bool:
        """Communication runs inside the compute kernel (one CUTLASS kernel per call:
        ``epilogue``, ``dedicated_ctas``); ``side_stream`` runs a kernel of its own beside a
        vendor GEMM. The one place that says which placements are which."""
        return self is not Placement.SIDE_STREAM

    @property
    def own_comm_ctas(self) -> bool:
        """Communication runs on CTAs reserved for it, so ``comm_ctas >= 1``
        (``dedicated_ctas``, ``side_stream``); ``epilogue``'s compute CTAs communicate."""
        return self is not Placement.EPILOGUE


class SyncScope(str, Enum):
    """How a consumer learns that data has arrived."""

    CHUNK = "chunk"  # a flag / signal per chunk
    CTA = "cta"  # a barrier per CTA
    KERNEL = "kernel"  # one team barrier per kernel
    # the transfer of a chunk is enqueued on the side stream after the chunk's event (a short
    # kernel per chunk, or a copy-engine copy): nothing polls for it on the sender's SMs; the
    # receiver still waits on a flag per chunk. Rules: cuco.design.stream_order
    STREAM = "stream"


class Issuer(str, Enum):
    """Who issues a transfer (ncclCoopThread/Warp/Cta; NVSHMEM *_warp/*_block)."""

    THREAD = "thread"
    WARP = "warp"
    CTA = "cta"
    # the copy engine: a peer cudaMemcpyAsync per chunk, then a stream-ordered flag write; no SM
    # moves the bytes. Rules and the workloads that have it: cuco.design.stream_order
    COPY_ENGINE = "copy_engine"

    @property
    def on_sms(self) -> bool:
        """Threads of a kernel move the bytes (``thread``, ``warp``, ``cta``)."""
        return self is not Issuer.COPY_ENGINE


class Schedule(str, Enum):
    """How the two consumer warpgroups of an in-kernel placement share the output tiles."""

    COOPERATIVE = "cooperative"  # both compute each tile, half of its rows each
    PINGPONG = "pingpong"  # each computes tiles of its own; their MMAs and epilogues take turns


class Core(str, Enum):
    """What computes a pipeline op's steps beside the communication kernel: cuco's own
    compute kernel of the op's template (``own``), or a library's kernel called per phase
    (context-parallel attention: PyTorch's flash attention or its cuDNN attention, each
    returning the log-sum-exp that cuco's merge kernel combines). Which ops have which
    library cores: :attr:`cuco.design.PipelineOp.library_cores`; the rules:
    :mod:`cuco.design.cores`."""

    OWN = "own"      # the template's own compute kernel (every workload)
    FLASH = "flash"  # torch.ops.aten._scaled_dot_product_flash_attention, per phase
    CUDNN = "cudnn"  # torch.ops.aten._scaled_dot_product_cudnn_attention, per phase

    @property
    def library(self) -> bool:
        """A library's kernel computes (``flash``, ``cudnn``); ``own``: cuco's."""
        return self is not Core.OWN


class PeerCalls(str, Enum):
    """How a library core calls its attention over the K/V of other ranks (context-parallel
    attention; :mod:`cuco.design.cores` has the rules):

    * ``per_peer``: one phase per peer, each peer's K/V as it arrives, after the own phase;
    * ``grouped``: the own phase, then the peers' K/V together, laid out contiguously in the
      receive buffer, in as few calls as the mask allows (fewer, longer calls and fewer
      partials to merge; the calls wait for more peers' data at once);
    * ``all_keys``: the rank's own K/V copied into the receive buffer beside the peers', and
      one call of every query over every rank's keys once all have arrived: no partials, no
      merge, the library's largest shape (the call a host program makes after its
      all-gather), but nothing computes while the peers' K/V travel. Non-causal only (one
      unmasked call cannot hold the causal zig-zag mask)."""

    PER_PEER = "per_peer"
    GROUPED = "grouped"
    ALL_KEYS = "all_keys"


class ChunkSchedule(str, Enum):
    """Order in which chunks visit peers (Syncopate-style ring, or direct)."""

    DIRECT = "direct"
    RING = "ring"


KIB = 1024
MIB = 1024 * KIB


def format_bytes(n: int) -> str:
    """``262144 -> '256K'``; used in variant names."""
    if n % MIB == 0:
        return f"{n // MIB}M"
    if n % KIB == 0:
        return f"{n // KIB}K"
    return str(n)
