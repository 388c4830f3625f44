"""Jobs that exercise the worker group itself: launch a probe kernel, plant a
deadlock or an illegal address, and a CPU-only sleep/exit for tests without GPUs."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass
class LaunchProbe:
    """Launch probe kernel ``name`` from ``cubin`` ``count`` times and sync."""

    cubin: str
    name: str = "noop"
    count: int = 1

    def __call__(self, ctx) -> int:
        import cupy
        fn = ctx.function(self.cubin, self.name)
        flag = ctx.scratch.get("probe_flag")
        if flag is None:
            flag = ctx.scratch["probe_flag"] = cupy.zeros(1, dtype=cupy.int32)
        for _ in range(self.count):
            fn((1,), (32,), (flag,), stream=ctx.stream)
        ctx.stream.synchronize()
        return int(flag.get()[0])


@dataclass
class Sleep:
    """CPU-only: sleep (a stand-in for a kernel that never returns)."""

    seconds: float
    ranks: tuple[int, ...] | None = None

    def __call__(self, ctx) -> int:
        if self.ranks is None or ctx.rank in self.ranks:
            time.sleep(self.seconds)
        return ctx.rank


@dataclass
class Exit:
    """CPU-only: the process dies on the given ranks (a segfault stand-in)."""

    ranks: tuple[int, ...] = (0,)

    def __call__(self, ctx) -> int:
        if ctx.rank in self.ranks:
            os._exit(11)
        return ctx.rank


@dataclass
class Raise:
    """CPU-only: a Python error on the given ranks."""

    ranks: tuple[int, ...] = (0,)

    def __call__(self, ctx) -> int:
        if ctx.rank in self.ranks:
            raise ValueError(f"planted error on rank {ctx.rank}")
        return ctx.rank


@dataclass
class RankInfo:
    def __call__(self, ctx) -> dict:
        return {"rank": ctx.rank, "world": ctx.world_size, "pid": os.getpid(),
                "nvls": os.environ.get("NCCL_NVLS_ENABLE")}
