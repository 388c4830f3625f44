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

from cuco.kernels.tp import FLAG_STRIDE
from cuco.runtime.arena import MAX_CTAS, ArenaLayout, LiveSlots

#: Bytes of the call state a kernel keeps: the last call's epoch and its CTAs' arrivals.
CALL_STATE_BYTES = 16


def _call_state(layout: ArenaLayout) -> tuple[tuple[int, int], ...]:
    start = layout.calls - layout.flags
    return ((start, start + CALL_STATE_BYTES),)


def side_stream_slots(layout: ArenaLayout, world_size: int, chunks: int, comm_ctas: int) -> LiveSlots:
    """A side-stream variant's: ``chunks`` flags a source rank (its plan's chunk count, every
    pattern's index below it), ``comm_ctas`` barrier slots a rank, the call state."""
    flags = LiveSlots.rows(0, world_size, FLAG_STRIDE, chunks)
    bar = LiveSlots.rows(layout.bar - layout.flags, world_size, MAX_CTAS, comm_ctas)
    return LiveSlots(flags + bar + _call_state(layout))


def in_kernel_slots(layout: ArenaLayout, world_size: int, tiles: int) -> LiveSlots:
    """An in-kernel variant's: ``tiles`` partial and ``tiles`` final flags a source rank (the
    GEMM's tiles over all ranks, every index below it), the open flag, the call state."""
    half, first = FLAG_STRIDE // 2, layout.in_kernel_flags - layout.flags
    ranges = []
    for r in range(world_size):
        row = first + r * FLAG_STRIDE * 8
        ranges += [(row, row + tiles * 8), (row + half * 8, row + (half + tiles) * 8),
                   (row + (FLAG_STRIDE - 1) * 8, row + FLAG_STRIDE * 8)]
    return LiveSlots(tuple(ranges) + _call_state(layout))
