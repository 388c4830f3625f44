"""The calls of the library route over the receive buffer (``peer_calls=grouped`` and
``all_keys``; CPU).

With the peers' K/V in the grouped receive layout (:mod:`~cuco.workloads.cp.receive_layout`),
the halves a rank attends in full lie in runs of rows with one row stride. Each run whose
halves are attended by the same query halves is one library call, after a wait for every
chunk of its halves: the own phase runs while they arrive, then (non-causal) one call over
all the peers' K/V, or (causal zig-zag) one over the earlier peers' halves 0 and one over
the later peers' both halves. Fewer, longer calls than a phase per peer, and fewer partials
to merge (at most three), at the cost of waiting for more peers at once.

With ``peer_calls=all_keys`` (non-causal) the own shard is copied into the buffer after the
peers' (the grouped layout's last rows) and :func:`all_keys_call` is the rank's only call:
every query against every rank's keys, one run of rows, once every peer's chunks are there.
Its output is the result (no partials, no merge), the call a host program makes after its
all-gather; nothing computes while the peers' K/V travel.

:func:`default_peer_calls` is the regime's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuco.design import CPProblem, PeerCalls
from cuco.workloads.cp.receive_layout import receive_row
from cuco.workloads.cp.split import FULL, SKIP, pair_kind, zigzag_chunk

#: Modelled rates for :func:`default_peer_calls` (not measured per machine): cuDNN's
#: non-causal attention ran 470-680 TFLOPS on one H200 (bench/results/cp_attention_kernel.json
#: at d3e3b02, in git history; 457-694 at 8f4b630); a rank receives over NVLink at about this many GB/s with every peer sending at once.
ATTENTION_TFLOPS, RECEIVE_GBS = 500.0, 400.0
#: The most tokens a rank at which grouping is the default without a mask (measured on
#: 1 x H100, W = 4, in a balanced order, bench/results/cp_attention_kernel_h100_ff50a27.json and
#: bench/results/cp_attention_kernel_own_copy_timed.json at 483d380): at 8k tokens a rank
#: the grouped cuDNN calls ran about even with a call per peer without a mask (geometric mean
#: 1.014 in both runs); at 16k and 32k they ran behind on 15 of 16 rows (0.927 at worst): one
#: call over every peer's K/V and no mask is slower there than a call per peer and a merge.
#: Under the causal mask no limit: grouped ran ahead at every token count on average (8k:
#: 1.027 and 1.028, all 16 rows; 16k: 1.014 and 1.005; 32k: 0.998 and 1.010).
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


def all_keys_call(me: int, w: int) -> GroupedCall:
    """Rank ``me``'s one call of ``peer_calls=all_keys`` (non-causal): both query halves
    against every half of every rank's shard, its own included, in buffer order (one run)."""
    blocks = [(s, h) for s in range(w) for h in (0, 1)]
    return GroupedCall((0, 1), tuple(sorted(blocks, key=lambda b: receive_row(me, *b, w, 1, grouped=True))))


def first_row(call: GroupedCall, me: int, w: int, chunk: int) -> int:
    """The K row of the receive buffer where ``call``'s keys start."""
    slot, half = call.blocks[0]
    return receive_row(me, slot, half, w, chunk, grouped=True)


def wait_ranges(call: GroupedCall, n_chunks: int, me: int) -> list[tuple[int, int]]:
    """``(first, count)`` of the arrival counters rank ``me`` waits on before ``call``: every
    transfer chunk of its peers' halves (slot ``s``'s chunk ``c`` is counter
    ``s * n_chunks + c``; its own halves are copied in on the compute stream, not sent),
    adjacent counters joined into one range."""
    per_half = n_chunks // 2
    firsts = sorted(s * n_chunks + h * per_half for s, h in call.blocks if s != me)
    out: list[tuple[int, int]] = []
    for f in firsts:
        if out and out[-1][0] + out[-1][1] == f:
            out[-1] = (out[-1][0], out[-1][1] + per_half)
        else:
            out.append((f, per_half))
    return out


def default_peer_calls(problem: CPProblem) -> PeerCalls:
    """The regime's way of calling over the peers' data.

    * Non-causal, two ranks: ``all_keys``. A rank has one peer, so the choice is the own
      and the peer's call plus a merge (``per_peer``) or the host program's one call over
      both shards. The split measured 0.9256x (32 heads of 64) and 0.9494x (64 of 128)
      torch's one cuDNN call (1 x H200, 8k tokens a rank,
      bench/results/cp_attention_kernel.json at d3e3b02); what it buys, computing while the
      peer's K/V travel, is modelled at about as much (one shard of K and V at
      :data:`RECEIVE_GBS` against the call at :data:`ATTENTION_TFLOPS`: 7.6 % of it at 8k
      tokens, less at more). So the overlap pays back only what the split costs, and the one
      call keeps the library's measured speed. The all_keys rows, first timed at 63bfbfc
      (1 x H100, bench/logs/cp_attention_kernel_w1_h100_63bfbfc.log), ran ahead of the call
      per peer at 8k tokens and behind it at 16k-32k, but in a fixed order that put them
      right after the per-peer cuDNN call, which slows whatever follows it; so did the
      grouped rows behind GROUPED_MAX_TOKENS. Timed again in a balanced order on 1 x H100
      (bench/results/cp_attention_kernel_h100_ff50a27.json; at 483d380 the own shard's copy
      timed inside the call), the one call ran ahead of the call per peer with cuDNN on 10
      of 12 rows (0.7 % behind on the other two) and 9 of 12 (5 % behind at worst, on a
      row whose same-program control was 4.5 % apart). No fused call is measured yet.
    * Three ranks or more: ``grouped`` where a rank holds at most :data:`GROUPED_MAX_TOKENS`
      tokens or the shard is causal (measured: beyond, without a mask, one call over every
      peer ran slower than a call per peer), and the own phase's attention (``4 T^2 H D``
      flops, half that under the causal mask, at :data:`ATTENTION_TFLOPS`) lasts at least as
      long as every peer's K/V takes to arrive (``W-1`` shards of K and V at
      :data:`RECEIVE_GBS`: modelled), so waiting for all of them hides as much as a phase per
      peer; else ``per_peer``. ``all_keys`` ran faster still in the compute-alone bench at
      W = 4 without a mask, but it would leave the transfer of W-1 shards uncovered.
    * One rank: ``per_peer`` (nothing to gather)."""
    w = problem.world_size
    if w == 2 and not problem.causal:
        return PeerCalls.ALL_KEYS
    tokens = problem.seq // w
    if w < 3 or (tokens > GROUPED_MAX_TOKENS and not problem.causal):
        return PeerCalls.PER_PEER
    elems = tokens * problem.heads * problem.head_dim
    own_s = (2.0 if problem.causal else 4.0) * tokens * elems / (ATTENTION_TFLOPS * 1e12)
    arrive_s = (w - 1) * 2 * elems * problem.dtype_bytes / (RECEIVE_GBS * 1e9)
    return PeerCalls.GROUPED if own_s >= arrive_s else PeerCalls.PER_PEER
