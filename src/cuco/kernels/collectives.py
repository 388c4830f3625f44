"""Sources of cuco's own collective kernels (LSA and NVSHMEM), per dtype.

These are the communication halves the fused templates build on, and what
``bench/collectives.py`` measures against host NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

# MAX_RANKS: the largest LSA team the kernels are rendered for (peers' bases live in
# registers); defined with the problems, which refuse larger world sizes.
from cuco.design.problem import MAX_RANKS
from cuco.kernels.render import CTYPES, render

__all__ = ["MAX_RANKS", "KernelSource", "all_sources", "lsa_collectives", "nvshmem_collectives"]


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel (what every ``render`` returns, a user's op's included): the build's
    name, the CUDA source, the libraries it needs (``nccl``, ``nvshmem``) and the kernels its
    runner launches."""

    name: str
    source: str
    needs: tuple[str, ...]
    functions: tuple[str, ...]


def lsa_collectives(dtype: str = "bf16") -> KernelSource:
    src = render("collectives_lsa.cu.j2", ctype=CTYPES[dtype], max_ranks=MAX_RANKS)
    return KernelSource(f"lsa_collectives_{dtype}", src, ("nccl",),
                        ("allreduce_oneshot", "allreduce_twoshot", "allgather_push",
                         "reducescatter_pull", "allreduce_staged", "reducescatter_staged",
                         "allgather_staged", "allreduce_ll", "reducescatter_ll"))


def nvshmem_collectives(dtype: str = "bf16") -> KernelSource:
    src = render("collectives_nvshmem.cu.j2", ctype=CTYPES[dtype])
    return KernelSource(f"nvshmem_collectives_{dtype}", src, ("nvshmem",),
                        ("allgather_putsignal",))


def all_sources() -> list[KernelSource]:
    """Every collective kernel source for every dtype (what CI compile-checks)."""
    out = []
    for dtype in CTYPES:
        out.append(lsa_collectives(dtype))
        out.append(nvshmem_collectives(dtype))
    return out
