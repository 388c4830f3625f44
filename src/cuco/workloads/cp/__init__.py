"""Context-parallel attention over a zig-zag split of the sequence.

:mod:`~cuco.workloads.cp.split`: the split (which chunks a rank holds, which key chunks a
query chunk attends, which halves a peer needs; ``cuco/ops/cp_split.cuh`` mirrors it).
:mod:`~cuco.workloads.cp.workload`: the workload, the tiles cuco's attention kernel walks and
its fused call (``core=own``). :mod:`~cuco.workloads.cp.library`: the library cores' fused
call (``core=flash`` / ``core=cudnn``: a library call per phase, the merge).
:mod:`~cuco.workloads.cp.peer_groups`: the library cores' calls over the receive buffer
(``peer_calls=grouped``; ``all_keys``: one call over every rank's keys) and their default per
regime; :mod:`~cuco.workloads.cp.receive_layout`:
where the receive buffer holds each peer's K/V (``cuco/ops/cp_receive.cuh`` mirrors it).
:mod:`~cuco.workloads.cp.fused_call`: what the two fused calls share.
"""

from cuco.workloads.cp.library import LibraryCall, LibraryRunner, Phase, library_plan, phase_plan
from cuco.workloads.cp.peer_groups import GroupedCall, default_peer_calls
from cuco.workloads.cp.workload import (AttentionKernel, CPAttention, CPRunner, KVTile,
                                        attention_grid, kernel_constants, kv_tiles, needs_half,
                                        pair_kind, parked_floats, slot_order, token_positions,
                                        zigzag_chunk)

__all__ = ["AttentionKernel", "CPAttention", "CPRunner", "GroupedCall", "KVTile", "LibraryCall",
           "LibraryRunner", "Phase", "attention_grid", "default_peer_calls", "library_plan", "phase_plan",
           "kernel_constants", "kv_tiles", "needs_half", "pair_kind", "parked_floats",
           "slot_order", "token_positions", "zigzag_chunk"]
