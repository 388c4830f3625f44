"""Where an island's best goes when islands exchange."""

from __future__ import annotations

import random


def ring(n: int, rng: random.Random) -> list[tuple[int, int]]:
    """Island i sends to island i + 1."""
    return [(i, (i + 1) % n) for i in range(n)] if n > 1 else []


def random_pairs(n: int, rng: random.Random) -> list[tuple[int, int]]:
    """Each island sends to a random other island."""
    return [(i, rng.choice([j for j in range(n) if j != i])) for i in range(n)] if n > 1 else []


TOPOLOGIES = {"ring": ring, "random": random_pairs}
