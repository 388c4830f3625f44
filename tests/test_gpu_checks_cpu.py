"""The premise of the GPU tests' planted lossy all-reduces (``gpu_checks.lost_bits``),
simulated on the CPU: the plant drops the fewest bits that make it less accurate than the
host program's NCCL ring by more than the tensor-parallel layers' slack, at each W."""

from __future__ import annotations

import numpy as np
import pytest

from cuco.workloads import GemmAllReduce
from bf16_model import bf16, bf16_bits, from_bf16_bits
from gpu_checks import bf16_low_mask, bf16_round_half, lost_bits

SLACK = GemmAllReduce.accuracy_slack


def literal(text: str) -> int:
    """The lower bf16's half of a packed CUDA literal (``0xFFFEFFFEu``)."""
    return int(text.rstrip("u"), 16) & 0xFFFF


def errors(world: int, bits: int, n: int = 1 << 18) -> tuple[float, float, float]:
    """Relative L2 error of the host ring, of the sum with its low ``bits`` cleared and of
    the peers' partials rounded short, on random bf16 partials (as the GEMMs produce)."""
    rng = np.random.default_rng(world)
    parts = bf16(rng.standard_normal((world, n)).astype(np.float32))
    ref = parts.astype(np.float64).sum(0)

    def l2(y):
        return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))

    ring = parts[0]
    for r in range(1, world):  # each hop adds in fp32 and stores bf16
        ring = bf16(ring + parts[r])
    mask, half = literal(bf16_low_mask(bits)), literal(bf16_round_half(bits))
    cleared = from_bf16_bits(bf16_bits(parts.sum(0, dtype=np.float32)) & mask)
    short = [from_bf16_bits(((bf16_bits(p) + half) & mask) & 0xFFFF) for p in parts[1:]]
    peer = bf16(parts[0] + np.sum(short, axis=0, dtype=np.float32))
    return l2(ring), l2(cleared), l2(peer)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_planted_loss_is_the_least_beyond_the_hosts_own_error(world):
    bits = lost_bits(world)
    host, cleared, peer = errors(world, bits)
    assert cleared > SLACK * host and peer > SLACK * host, (world, bits, cleared / host, peer / host)
    if bits > 1:  # one bit fewer is within the host's own error: the rule admits it
        host, cleared, peer = errors(world, bits - 1)
        assert cleared < SLACK * host and peer < SLACK * host, (world, cleared / host, peer / host)
