"""Which slots of a sync region the tensor-parallel templates write (their
:class:`~cuco.runtime.arena.LiveSlots`), so the evaluator can hold every other word of the
region at zero: nothing a kernel keeps there outlives a call.

The flag area has ``FLAG_STRIDE`` slots a source rank twice over (``ArenaLayout.for_tp``):
the side-stream variants' ``[src][chunk]`` flags and counters in the first half, the
in-kernel variants' in the second (``tp_fused.cu.j2``: a tile's partial or X-slice flag at
``[src][t]``, its final or staged flag at ``[src][kHalf + t]``, the open flag at
``[src][FLAG_STRIDE - 1]``). NVSHMEM's side-stream barrier takes ``[rank][cta]`` slots of
the barrier area (``_arena.cu.j2``); the call state's first two words are the last epoch and
the arrivals (``cuco/calls.cuh``), seeded by ``prepare_arenas`` for every variant.
"""

from __future__ import annotations

from cuco.design import Backend, Directives, GemmProblem
from cuco.design.patterns import Collective, TPPattern
from cuco.design.tiles import ChunkPlan
from cuco.kernels.tp import FLAG_STRIDE, fused_tiles
from cuco.runtime.arena import MAX_CTAS, ArenaLayout, LiveSlots

#: Bytes of the call state a kernel keeps: the last call's epoch and its CTAs' arrivals.
CALL_STATE_BYTES = 16


def _call_state(layout: ArenaLayout) -> tuple[tuple[int, int], ...]:
    start = layout.calls - layout.flags
    return ((start, start + CALL_STATE_BYTES),)


def side_stream_slots(layout: ArenaLayout, world_size: int, flags: int, barrier_ctas: int) -> LiveSlots:
    """A side-stream variant's: ``flags`` flags a source rank (the reductions' every chunk of
    the plan, AllGather's chunks of one block), ``barrier_ctas`` barrier slots a rank (its
    comm CTAs under NVSHMEM, whose closing barrier is a flag exchange; 0 for LSA, whose
    barrier is NCCL's own, and GIN), the call state (seeded, never written)."""
    live = LiveSlots.rows(0, world_size, FLAG_STRIDE, flags)
    if barrier_ctas:
        live += LiveSlots.rows(layout.bar - layout.flags, world_size, MAX_CTAS, barrier_ctas)
    return LiveSlots(live + _call_state(layout))


def in_kernel_slots(layout: ArenaLayout, world_size: int, rank: int, block_tiles: int,
                    finals: bool, staged_tiles: int) -> LiveSlots:
    """An in-kernel variant's on rank ``rank``: ``block_tiles`` partial (or X-slice) flags a
    source rank, as many final flags where the pattern raises them (AllReduce), the staged
    flags of all ``staged_tiles`` tiles in the rank's own row (``dedicated_ctas``: 0 where
    none), the open flag a source rank, the call state."""
    half, first = FLAG_STRIDE // 2, layout.in_kernel_flags - layout.flags
    ranges = []
    for r in range(world_size):
        row = first + r * FLAG_STRIDE * 8
        ranges += [(row, row + block_tiles * 8), (row + (FLAG_STRIDE - 1) * 8, row + FLAG_STRIDE * 8)]
        if finals:
            ranges.append((row + half * 8, row + (half + block_tiles) * 8))
    if staged_tiles:
        row = first + rank * FLAG_STRIDE * 8
        ranges.append((row + half * 8, row + (half + staged_tiles) * 8))
    return LiveSlots(tuple(ranges) + _call_state(layout))


def side_stream_live(layout: ArenaLayout, pattern: TPPattern, plan: ChunkPlan, d: Directives,
                     world_size: int) -> LiveSlots:
    """What ``tp_side_stream.cu.j2`` writes for this pattern, plan and backend."""
    flags = plan.chunks_per_block if pattern.gathers_input else plan.n_chunks
    return side_stream_slots(layout, world_size, flags, d.comm_ctas if d.backend is Backend.NVSHMEM else 0)


def in_kernel_live(layout: ArenaLayout, pattern: TPPattern, problem: GemmProblem, d: Directives,
                   rank: int) -> LiveSlots:
    """What ``tp_fused.cu.j2`` and its pattern piece write on ``rank``: AllReduce's second shot
    raises final flags; a reduction's ``dedicated_ctas`` stages every tile in the own row."""
    w, tiles = problem.world_size, fused_tiles(problem, d)
    reduces = pattern.collective is not Collective.ALL_GATHER
    return in_kernel_slots(layout, w, rank, tiles // w, finals=pattern.collective is Collective.ALL_REDUCE,
                           staged_tiles=tiles if d.placement.own_comm_ctas and reduces else 0)
