"""The fastest honest GEMM a user could launch from the host, chosen once per shape.

Candidates: cuBLAS ``gemmEx`` with the default algorithm, cuBLASLt's heuristic top
:data:`LT_CANDIDATES` algorithms (:mod:`cuco.runtime.cublaslt`), and ``torch.matmul``
where torch runs in the worker. Each is checked element by element against an fp32
reference on a poisoned output (a wrong one is out), the correct ones are timed
interleaved with CUDA events after warm-up (median), the ranks agree on the slowest
rank's time of each, and the fastest wins. The choice is cached in the worker for the
run; the host-driven program then verifies every call of it like any program's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuco.runtime import dtypes

#: cuBLASLt heuristic algorithms timed per shape (the heuristic's best first)
LT_CANDIDATES = 8
#: What a candidate that is missing or wrong on some rank reports: it never wins.
UNUSABLE_MS = 1e30
TIME_WARMUP, TIME_ITERS = 3, 15

GEMMEX = "cublas.gemmex"
TORCH = "torch.matmul"


def candidate_names() -> list[str]:
    """Every candidate slot, in the order every rank reports them."""
    return [GEMMEX, *(f"cublaslt.heuristic{j}" for j in range(LT_CANDIDATES)), TORCH]


def fastest(times_ms: dict[str, float]) -> str:
    """The candidate with the smallest time (the first listed on a tie); a time of
    :data:`UNUSABLE_MS` or more marks one that is missing or wrong on some rank."""
    usable = {name: t for name, t in times_ms.items() if t < UNUSABLE_MS}
    if not usable:
        raise RuntimeError(f"no host candidate was correct on every rank: {times_ms}")
    return min(usable, key=usable.__getitem__)


def agree(ctx, times_ms: dict[str, float]) -> dict[str, float]:
    """Each candidate's time on the slowest rank (names in the same order on every rank),
    so every rank makes the same choice."""
    import cupy
    v = cupy.asarray([min(t, UNUSABLE_MS) for t in times_ms.values()], dtype=cupy.float32)
    ctx.comm.all_reduce(int(v.data.ptr), int(v.data.ptr), v.size, "fp32", ctx.stream.ptr, op="max")
    got = v.get()
    return {name: float(t) for name, t in zip(times_ms, got)}


#: A candidate, bound to its operands: ``bind(a, b, c) -> call``, all device pointers.
Binder = Callable[[int, int, int], Callable[[], None]]


@dataclass
class HostGemm:
    """The chosen GEMM of one shape: its name, each candidate's time (max over ranks;
    :data:`UNUSABLE_MS` where missing or wrong) and why the others were out."""

    name: str
    times_ms: dict[str, float]
    rejected: dict[str, str]
    binder: Binder = field(repr=False)

    def bind(self, a: int, b: int, c: int) -> Callable[[], None]:
        """``C = A @ B`` (row-major device pointers) on the worker's stream, as a call."""
        return self.binder(a, b, c)

    def notes(self) -> dict[str, Any]:
        return {"gemm": self.name, "gemm_ms": {n: t for n, t in self.times_ms.items() if t < UNUSABLE_MS},
                "gemm_rejected": self.rejected}


def binders(ctx, m: int, n: int, k: int, dtype: str) -> tuple[dict[str, Binder], dict[str, str]]:
    """Every candidate this worker can run for the shape, and why the others are missing."""
    from cuco.runtime import cublas, cublaslt, torch_bridge
    s = ctx.stream
    out: dict[str, Binder] = {GEMMEX: lambda a, b, c: lambda: cublas.gemm(a, b, c, m, n, k, dtype, s)}
    missing: dict[str, str] = {}
    try:
        plan = cublaslt.LtGemm(m, n, k, dtype)
        algos = plan.candidates(LT_CANDIDATES)
    except Exception as exc:  # noqa: BLE001 - no cuBLASLt: the others still compete
        algos, why = [], f"cuBLASLt unavailable: {type(exc).__name__}: {exc}"
        missing.update({name: why for name in candidate_names() if name.startswith("cublaslt.")})
    for j, algo in enumerate(algos):
        out[f"cublaslt.heuristic{j}"] = (lambda algo: lambda a, b, c: lambda: plan.run(algo, a, b, c, s.ptr))(algo)
    for j in range(len(algos), LT_CANDIDATES):
        missing.setdefault(f"cublaslt.heuristic{j}", "the heuristic returned fewer algorithms")
    why = torch_bridge.unusable(ctx)
    if why is None:
        out[TORCH] = lambda a, b, c: torch_matmul(ctx, a, b, c, m, n, k, dtype)
    else:
        missing[TORCH] = why
    return out, missing


def torch_matmul(ctx, a: int, b: int, c: int, m: int, n: int, k: int, dtype: str) -> Callable[[], None]:
    """``torch.matmul(A, B, out=C)`` on the worker's stream, over views of the buffers
    (what a torch user's host program runs; torch picks its own cuBLAS/cuBLASLt path)."""
    import torch
    from cuco.runtime import torch_bridge
    ta, tb = torch_bridge.tensor_at(a, (m, k), dtype), torch_bridge.tensor_at(b, (k, n), dtype)
    tc, stream = torch_bridge.tensor_at(c, (m, n), dtype), torch_bridge.stream(ctx)

    def call() -> None:
        with torch.cuda.stream(stream):
            torch.matmul(ta, tb, out=tc)
    return call


def tolerance(k: int, dtype: str) -> tuple[float, float]:
    """``(rtol, atol_factor)`` of one GEMM: one rounding of the output (twice, for slack),
    and fp32 accumulation-order differences that grow with ``sqrt(k)``."""
    eps = dtypes.EPS[dtype]
    return 2 * eps, eps * (1.0 + math.sqrt(k / 65536.0))


def select(ctx, m: int, n: int, k: int, dtype: str) -> HostGemm:
    """The fastest correct GEMM of ``C[m, n] = A[m, k] @ B[k, n]`` here (cached per shape).
    Collective: every rank calls it in the same job."""
    cache = ctx.scratch.setdefault("host_gemm", {})
    key = (m, n, k, dtype)
    if key not in cache:
        cache[key] = _measure(ctx, m, n, k, dtype)
    return cache[key]


def _measure(ctx, m: int, n: int, k: int, dtype: str) -> HostGemm:
    import cupy
    from cuco.runtime.checking import compare
    from cuco.runtime.cublas import gemm
    from cuco.runtime.timing import median, time_interleaved
    s = ctx.stream
    with s:
        a = dtypes.random(m * k, dtype, 1 + ctx.rank)
        b = dtypes.random(k * n, dtype, 2 + ctx.rank)
        c = dtypes.empty(m * n, dtype)
        ref = cupy.empty(m * n, dtype=cupy.float32)
        gemm(int(a.data.ptr), int(b.data.ptr), int(ref.data.ptr), m, n, k, dtype, s, out_dtype="fp32")
        rtol, atol_f = tolerance(k, dtype)
        atol = atol_f * float(abs(ref).max())
        found, rejected = binders(ctx, m, n, k, dtype)
        rng = random.Random(ctx.rank)
        calls: dict[str, Callable[[], None]] = {}
        for name, binder in found.items():
            try:
                call = binder(int(a.data.ptr), int(b.data.ptr), int(c.data.ptr))
                dtypes.Poison.draw(rng, dtype).apply(c)
                call()
                got = compare(c, ref, dtype, rtol, atol)
            except Exception as exc:  # noqa: BLE001 - e.g. an algorithm this shape refuses
                rejected[name] = f"{type(exc).__name__}: {exc}"
                continue
            if got["correct"]:
                calls[name] = call
            else:
                rejected[name] = (f"{got['bad_elements']} of {m * n} elements out of tolerance "
                                  f"(rel. L2 error {got['rel_l2_error']:.2e})")
        samples = time_interleaved(calls, s, warmup=TIME_WARMUP, iters=TIME_ITERS) if calls else {}
    mine = {name: median(samples[name]) if name in samples else UNUSABLE_MS for name in candidate_names()}
    times = agree(ctx, mine)
    for name, t in times.items():
        if t >= UNUSABLE_MS and name not in rejected:
            rejected[name] = "missing or wrong on another rank"
    best = fastest(times)
    return HostGemm(best, times, rejected, found[best])
