"""The zig-zag split of context-parallel attention (CPU; mirrored by
``cuco/ops/cp_split.cuh``): the sequence is cut into ``2W`` chunks of ``C`` tokens, rank ``r``
holds chunks ``r`` and ``2W-1-r`` (its halves 0 and 1); which key chunks a query chunk attends
(all, its causal part, none); which halves a peer is sent; the order ranks' K/V are used in."""

from __future__ import annotations

import numpy as np

SKIP, FULL, DIAGONAL = "skip", "full", "diagonal"


def zigzag_chunk(rank: int, half: int, w: int) -> int:
    """The global chunk (of ``2w``) that half ``half`` of rank ``rank``'s shard holds."""
    return rank if half == 0 else 2 * w - 1 - rank


def token_positions(rank: int, w: int, chunk: int) -> np.ndarray:
    """Global sequence positions of the ``2 * chunk`` rows of rank ``rank``'s shard."""
    return np.concatenate([zigzag_chunk(rank, h, w) * chunk + np.arange(chunk) for h in (0, 1)])


def pair_kind(qi: int, kj: int, causal: bool) -> str:
    """What query chunk ``qi`` does with key chunk ``kj``: skip it (masked), attend to all of
    it, or to its causal part (the diagonal)."""
    if not causal:
        return FULL
    return FULL if kj < qi else DIAGONAL if kj == qi else SKIP


def needs_half(src: int, half: int, dst: int, w: int, causal: bool) -> bool:
    """Does rank ``dst`` attend to any key of half ``half`` of rank ``src``'s shard (is it sent)?"""
    kj = zigzag_chunk(src, half, w)
    return any(pair_kind(zigzag_chunk(dst, qh, w), kj, causal) != SKIP for qh in (0, 1))


def slot_order(me: int, w: int, phase: str = "all") -> list[int]:
    """The K/V slots (ranks) a q tile walks, in order: its own, then ``me-1``, ``me-2``, ...
    (the order the peers' data arrives in). ``phase``: ``all``, ``local`` or ``remote``."""
    order = [(me - k) % w for k in range(w)]
    return {"all": order, "local": order[:1], "remote": order[1:]}[phase]
