"""Where a rank's receive buffer (the arena's ``kvg`` region) holds the K and V of every
rank, in rows of ``H x D`` elements (CPU; mirrored by ``cuco/ops/cp_receive.cuh``, which the
communication kernel writes by, and held to it by a CPU test).

* by rank (``peer_calls=per_peer``, ``core=own``): slot ``src`` holds ``src``'s K shard (its
  halves 0 and 1, ``2C`` rows) then its V shard: one peer's K/V is one shard-shaped block;
* grouped (``peer_calls=grouped`` and ``all_keys``): every rank's K, then every rank's V,
  ordered by the distance ``pos = (dst - src) mod W`` (the order ``dst`` attends its peers
  in): the peers' halves 0 at ``pos = 1 .. W-1``, then their halves 1 at ``pos = W-1 .. 1``,
  then ``dst``'s own halves 0 and 1 (``pos = 0``). So the peers' K is one run of rows with
  one row stride (what a library call over a ``[1, H, S, D]`` view needs), under the causal
  zig-zag mask the peers before ``dst`` (their halves 0) and those after it (both halves) are
  one run each, and with the own shard after them (``all_keys`` copies it there; nobody
  sends it) every rank's K is one run: a single call over all keys.
"""

from __future__ import annotations

from cuco.design import PeerCalls


def grouped_receive(peer_calls: PeerCalls) -> bool:
    """Does a library core calling this way receive into the grouped layout (else by rank)?"""
    return peer_calls is not PeerCalls.PER_PEER


def receive_row(dst: int, src: int, half: int, w: int, chunk: int, grouped: bool) -> int:
    """First K row of half ``half`` of rank ``src``'s shard in rank ``dst``'s buffer (grouped:
    ``src == dst`` is the own shard, which only ``peer_calls=all_keys`` copies in)."""
    if not grouped:
        return src * 4 * chunk + half * chunk
    pos = (dst - src) % w
    if pos == 0:
        return (2 * w - 2 + half) * chunk
    return ((pos - 1) if half == 0 else (2 * w - 2 - pos)) * chunk


def v_rows_after_k(w: int, chunk: int, grouped: bool) -> int:
    """Rows from a K row to the V row of the same token."""
    return 2 * w * chunk if grouped else 2 * chunk


def region_rows(w: int, chunk: int, grouped: bool) -> int:
    """Rows of K and V together that the layout uses (the arena's ``kvg`` holds ``4 W C``)."""
    return 2 * v_rows_after_k(w, chunk, grouped) if grouped else 4 * w * chunk
