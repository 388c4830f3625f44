"""Context-parallel attention over a zig-zag split of the sequence.

:mod:`~cuco.workloads.cp.workload`: the workload, the split (which chunks a rank holds, which
tiles a query tile attends, which halves a peer needs; the device code mirrors it) and the
fused call.
"""

from cuco.workloads.cp.workload import (AttentionKernel, CPAttention, CPRunner, KVTile,
                                        attention_grid, kernel_constants, kv_tiles, needs_half,
                                        pair_kind, parked_floats, slot_order, token_positions,
                                        zigzag_chunk)

__all__ = ["AttentionKernel", "CPAttention", "CPRunner", "KVTile", "attention_grid",
           "kernel_constants", "kv_tiles", "needs_half", "pair_kind", "parked_floats",
           "slot_order", "token_positions", "zigzag_chunk"]
