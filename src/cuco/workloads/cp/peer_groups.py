"""The grouped calls of the library route (``peer_calls=grouped``; CPU).

With the peers' K/V in the grouped receive layout (:mod:`~cuco.workloads.cp.receive_layout`),
the halves a rank attends in full lie in runs of rows with one row stride. Each run whose
halves are attended by the same query halves is one library call, after a wait for every
chunk of its halves: the own phase runs while they arrive, then (non-causal) one call over
all the peers' K/V, or (causal zig-zag) one over the earlier peers' halves 0 and one over
the later peers' both halves. Fewer, longer calls than a phase per peer, and fewer partials
to merge (at most three), at the cost of waiting for more peers at once.

:func:`default_peer_calls` is the regime's default: group where the own phase can hide the
transfer of every peer's K/V (so waiting for all of them costs no overlap) and a rank's
tokens are few enough that one call over every peer measured faster than a call per peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.design import CPProblem, PeerCalls
from cuco.workloads.cp.receive_layout import receive_row
from cuco.workloads.cp.split import FULL, SKIP, pair_kind, zigzag_chunk

#: Modelled rates for :func:`default_peer_calls` (not measured per machine): cuDNN's
#: non-causal attention ran 470-680 TFLOPS on one H200 (bench/results/cp_attention_kernel.json);
#: a rank receives over NVLink at about this many GB/s with every peer sending at once.
ATTENTION_TFLOPS, RECEIVE_GBS = 500.0, 400.0
#: The most tokens a rank at which grouping is the default (measured, 1 x H200, W = 4,
#: bench/results/cp_attention_kernel.json at d3e3b02): at 8k tokens a rank the grouped cuDNN
#: calls ran ahead of a call per peer on all twelve rows, causal or not (non-causal 0.968
#: against 0.947 at worst); at 16k and 32k they ran behind on 6 of 8 non-causal rows (0.877
#: against 0.965 at worst) and up to 10 % behind on causal ones (ahead by at most 2.7 % on
#: others): one call over every peer's K/V is slower there than a call per peer and a merge.
GROUPED_MAX_TOKENS = 8192


@dataclass(frozen=True)
class GroupedCall:
    """One library call over a run of the receive buffer: the queries of ``q_halves`` against
    the keys of ``blocks`` (``(slot, half)``, in buffer order, contiguous there), unmasked."""

    q_halves: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]
    causal: bool = False

    def pairs(self) -> list[tuple[int, tuple[int, int]]]:
        """The (query half, key block) pairs it attends."""
        return [(qh, b) for qh in self.q_halves for b in self.blocks]


def grouped_calls(me: int, w: int, causal: bool, chunk: int = 1) -> list[GroupedCall]:
    """Rank ``me``'s calls over its peers' K/V in buffer order (the order they arrive in):
    each run of halves adjacent in the grouped layout and attended by the same query halves."""
    need = {}
    for pos in range(1, w):
        slot = (me - pos) % w
        for kh in (0, 1):
            kinds = [pair_kind(zigzag_chunk(me, qh, w), zigzag_chunk(slot, kh, w), causal) for qh in (0, 1)]
            assert all(k in (FULL, SKIP) for k in kinds), (me, slot, kh, kinds)  # diagonal: own only
            qs = tuple(qh for qh, k in zip((0, 1), kinds) if k == FULL)
            if qs:
                need[slot, kh] = qs
    row = {b: receive_row(me, b[0], b[1], w, chunk, grouped=True) for b in need}
    calls: list[GroupedCall] = []
    for b in sorted(need, key=row.__getitem__):
        last = calls[-1] if calls else None
        if last and last.q_halves == need[b] and row[last.blocks[-1]] + chunk == row[b]:
            calls[-1] = GroupedCall(last.q_halves, last.blocks + (b,))
        else:
            calls.append(GroupedCall(need[b], (b,)))
    return calls


def first_row(call: GroupedCall, me: int, w: int, chunk: int) -> int:
    """The K row of the receive buffer where ``call``'s keys start."""
    slot, half = call.blocks[0]
    return receive_row(me, slot, half, w, chunk, grouped=True)


def wait_ranges(call: GroupedCall, n_chunks: int) -> list[tuple[int, int]]:
    """``(first, count)`` of the arrival counters to wait on before ``call``: every transfer
    chunk of its halves (slot ``s``'s chunk ``c`` is counter ``s * n_chunks + c``), adjacent
    counters joined into one range."""
    per_half = n_chunks // 2
    firsts = sorted(s * n_chunks + h * per_half for s, h in call.blocks)
    out: list[tuple[int, int]] = []
    for f in firsts:
        if out and out[-1][0] + out[-1][1] == f:
            out[-1] = (out[-1][0], out[-1][1] + per_half)
        else:
            out.append((f, per_half))
    return out


def default_peer_calls(problem: CPProblem) -> PeerCalls:
    """The regime's way of calling over the peers' data: grouped where there is more than
    one peer, a rank holds at most :data:`GROUPED_MAX_TOKENS` tokens (measured: beyond, one
    call over every peer ran slower than a call per peer, causal or not) and the own phase's
    attention (``4 T^2 H D`` flops, half that under the causal mask, at
    :data:`ATTENTION_TFLOPS`) lasts at least as long as every peer's K/V takes to arrive
    (``W-1`` shards of K and V at :data:`RECEIVE_GBS`: modelled), so waiting for all of them
    hides as much as a phase per peer."""
    w = problem.world_size
    tokens = problem.seq // w
    if w < 3 or tokens > GROUPED_MAX_TOKENS:
        return PeerCalls.PER_PEER
    elems = tokens * problem.heads * problem.head_dim
    own_s = (2.0 if problem.causal else 4.0) * tokens * elems / (ATTENTION_TFLOPS * 1e12)
    arrive_s = (w - 1) * 2 * elems * problem.dtype_bytes / (RECEIVE_GBS * 1e9)
    return PeerCalls.GROUPED if own_s >= arrive_s else PeerCalls.PER_PEER
