"""The GEMM alone on one GPU: cuco's in-kernel mainloop against the fastest library GEMM.

Every in-kernel build of the tensor-parallel templates can be rendered without its
communication (``gemm_only``); its time is the fused kernel's mainloop and epilogue staging.
This benchmark times those builds, every mainloop a search sweeps
(:data:`cuco.kernels.tp.MAINLOOPS`) that can pay at the shape (:func:`worth`) in each distinct
tile order, and the default a user who does not search gets
(:func:`cuco.kernels.tp.default_mainloop`), on a spread of per-rank GEMMs (:data:`SPREAD`: M
64..16384, a third not a multiple of 64, decode-like M <= 1024, N and K 1536..28672, tile counts
that leave a partial last wave on 132 SMs) in bf16 and fp16, against every library GEMM a user
could call from the host: ``torch.matmul`` (when torch is importable), cuBLAS ``gemmEx``
(default algorithm) and cuBLASLt's top :data:`LT_TOP` heuristic algorithms, all in one
process. Each output is poisoned, computed and compared element by element with an fp32
reference before timing and again after the last timed round; a wrong program is never
timed nor a baseline. Timing: rounds of every program in a balanced order (each right after
every other once or twice over its rounds: ``cuco.runtime.timing.balanced_order``), each sample
``calls`` back-to-back calls between CUDA events behind a spin kernel (so the host's
enqueueing is not timed), the median of the samples. A case's row is cuco's fastest correct
point against the fastest correct library program (its ``baseline``), with the default's time
beside it and, where cuco is slower, ``why_not``: what is known of both programs, and what
cuco's build of the fastest library kernel's own tiling ran, or why cuco cannot build it (each
described cuBLASLt algorithm's twin is timed beside the sweep: :mod:`.library_twins`).
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from cuco import results
from cuco.benchmarks.library_twins import Twin, library_twin
from cuco.design import Directives, GemmProblem
from cuco.design.patterns import ALLGATHER_GEMM, TP_PATTERNS
from cuco.errors import DirectiveError
from cuco.kernels import fused_launch
from cuco.kernels.tp import (
    SMS, WAVE_TILES, Mainloop, default_mainloop, fused_tiles, in_kernel, k_slices, mainloops_for,
    modelled_time, most_stages, render_tp, split_tail, split_workspace_bytes, stages_that_fit, supported,
    tiles_of, with_mainloop,
)

#: (M, K, N) of the tensor-parallel benchmark (bench/tp_workloads.py); their per-rank GEMMs
#: on 2 ranks are the "nine pairs" whose GEMM issue #21 asks to match cuBLASLt on.
TP_SHAPES = ((8192, 8192, 8192), (4096, 8192, 28672), (2048, 4096, 4096))
#: Per-rank GEMMs (M, N, K) beside the nine pairs' six: decode-like M (<= 1024; 200 and 1000
#: ragged), prefill and training M (3000, 5000, 10000 ragged; 16384), N and K from 1536 to
#: 28672 (Llama-3-70B's 8192/28672 MLP and attention, Mixtral/Qwen's 14336/5120/1536), and tile
#: counts that leave a partial last wave on 132 SMs (e.g. 2176x2048: 272 128x128 tiles).
SPREAD = ((64, 8192, 8192), (64, 28672, 8192), (128, 8192, 28672), (200, 4096, 4096),
          (256, 1536, 8192), (384, 28672, 2048), (512, 4096, 8192), (512, 14336, 4096),
          (768, 28672, 4096), (1000, 5120, 5120), (1024, 8192, 4096), (1024, 1536, 28672),
          (1536, 1536, 1536), (2000, 7168, 2048), (2176, 2048, 8192), (2304, 7168, 4096),
          (3000, 4096, 4096), (3072, 7168, 14336), (4096, 1536, 8192), (5000, 8192, 2048),
          (6144, 5120, 6144), (8192, 28672, 1536), (10000, 2048, 4096), (12288, 1536, 8192),
          (16384, 4096, 4096), (16384, 1536, 4096))
#: ``--quick``: two decode-like GEMMs, a ragged one, a partial last wave, two nine-pair ones.
QUICK = ((64, 8192, 8192), (256, 1536, 8192), (1000, 5120, 5120), (2176, 2048, 8192),
         (2048, 2048, 4096), (8192, 8192, 4096))
DTYPES = ("bf16", "fp16")
RASTER_GROUPS = (1, 8, 16)
#: A tile 192 or 64 wide is timed where it is modelled below this fraction of pingpong
#: 128x128's time (:func:`worth`): a margin the model's rates cannot promise either way.
WAVE_TIMED = 0.95
#: cuBLASLt heuristic algorithms timed per case (the heuristic's best first)
LT_TOP = 4
TORCH, GEMMEX = "torch.matmul", "cublas.gemmex"
#: A sample's GPU time the calls aim at (fewer calls for slower GEMMs), and their bounds.
SAMPLE_MS, MIN_CALLS, MAX_CALLS = 0.5, 1, 40
#: What the spin kernel ahead of a sample covers of each call's enqueueing on the host.
ENQUEUE_US = 40.0


def nine_pair_gemms(world_size: int = 2) -> list[tuple[int, int, int]]:
    """The distinct per-rank GEMMs ``(M, N, K)`` of the tensor-parallel benchmark."""
    out: list[tuple[int, int, int]] = []
    for m, k, n in TP_SHAPES:
        for tp in TP_PATTERNS:
            shape = tp.local_gemm(m=m, n=n, k=k, world_size=world_size)
            if shape not in out:
                out.append(shape)
    return out


def default_shapes() -> tuple[tuple[int, int, int], ...]:
    """The nine pairs' six GEMMs and the spread (32 per-rank GEMMs)."""
    return tuple(dict.fromkeys((*nine_pair_gemms(), *SPREAD)))


def problem_of(m: int, n: int, k: int, dtype: str = "bf16") -> GemmProblem:
    """A one-rank problem whose local GEMM is ``C[m, n] = A[m, k] B[k, n]``: AllGather's
    kernel on one rank gathers nothing, and ``gemm_only`` leaves its pushes out."""
    return GemmProblem(workload=ALLGATHER_GEMM.name, m=m, n=n, k=k, world_size=1, dtype=dtype)


def case_label(shape: tuple[int, int, int], dtype: str) -> str:
    m, n, k = shape
    return f"gemm/M{m}N{n}K{k}/{dtype}"


BASE = in_kernel("epilogue", "nvshmem", "cta", comm_warps=3)  # the epilogue on 3 spare warps
#: The base of a mainloop whose stages fit only beside a ring-staged tile
#: (:func:`~cuco.kernels.tp.deepest`): the epilogue on the consumers, which stage and store
#: each tile a sub-tile at a time (comm warps take a whole staged tile over).
RING_BASE = BASE.replace(comm_warps=0)


def point_of(problem: GemmProblem, ml: Mainloop) -> Directives:
    """``ml`` on :data:`BASE`, or on :data:`RING_BASE` where only the ring leaves room for its
    stages; :class:`DirectiveError` where the design space refuses it."""
    d = with_mainloop(BASE, ml, problem.dtype_bytes)
    if supported(problem, d):
        ring = with_mainloop(RING_BASE, ml, problem.dtype_bytes)
        if not supported(problem, ring):
            return ring
    return d


def worth(ml: Mainloop, shape: tuple[int, int, int], sms: int = SMS) -> str | None:
    """Why ``ml`` is left out of the timed grid at ``shape`` (None: it is timed): split-K only
    where it cuts some tiles (:func:`~cuco.kernels.tp.split_tail`: fewer tiles than SMs, or a
    partial last wave at most half full) and each slice keeps 4 k-tiles; the tiles
    192 or 64 wide (:data:`~cuco.kernels.tp.WAVE_TILES`) only where their fuller last wave makes
    them modelled :data:`WAVE_TIMED` of pingpong 128x128's time or less (:func:`~cuco.kernels.tp.modelled_time`); other 64-row tiles only where M <= 1024;
    the swapped mainloops fitted to the shape (:func:`~cuco.kernels.tp.swapped_mainloops`) always.
    :func:`cuco.kernels.tp.default_mainloop`'s pick is always timed."""
    m, n, k = shape
    problem = problem_of(m, n, k)
    if ml.swap_ab:  # fitted to the shape already (swapped_mainloops)
        return None
    if ml.cluster_m > 1 and -(-m // ml.tile_m) < ml.cluster_m:
        return f"{ml.cluster_m}x1 clusters: M={m} is fewer m-tiles than a cluster's CTAs"
    if ml in WAVE_TILES:
        base = Mainloop("pingpong", 128, 6)
        if modelled_time(problem, ml, sms) < WAVE_TIMED * modelled_time(problem, base, sms):
            return None
        return f"{ml.tile_m}x{ml.tile_n} tiles: modelled less than {1 - WAVE_TIMED:.0%} faster than 128x128's here"
    if ml.split_k > 1:
        tiles = tiles_of(problem, ml.tile_m, ml.tile_n)
        dp, slices, per = split_tail(tiles, sms, k, ml.split_k)
        if slices == 1:
            return f"split-K: {tiles} tiles fill whole waves of the {sms} SMs, or a last one over half full"
        if per < 4:
            return f"split-K: K={k} leaves fewer than 4 k-tiles per slice"
        if dp and slices < k_slices(k, ml.split_k)[0] and ml.split_k > 2:
            return f"split-K: the last wave's tiles take {slices} slices here, as a smaller split_k's do"
    if ml.tile_m == 64 and m > 1024:
        return "64-row tiles: M > 1024"
    return None


def walked_tiles(shape: tuple[int, int, int], ml: Mainloop) -> int:
    """The tiles a tile order groups: m-tiles, or n-tiles where a swapped mainloop's clusters
    walk n-tiles in the place of m-tiles (tp_fused.cu.j2)."""
    m, n, _ = shape
    return -(-n // ml.tile_n) if ml.swap_ab and ml.cluster_m > 1 else -(-m // ml.tile_m)


def tile_orders(m_tiles: int) -> dict[int, int]:
    """The distinct tile orders of :data:`RASTER_GROUPS` where a block has ``m_tiles`` m-tiles:
    ``{m-tiles walked together: the smallest group that walks them}`` (8 and 16 are one order
    where a block has at most 8)."""
    out: dict[int, int] = {}
    for g in RASTER_GROUPS:
        out.setdefault(min(g, m_tiles), g)
    return out


def mainloop_points(shape: tuple[int, int, int], dtype: str = "bf16", sms: int = SMS,
                    cluster_n: bool = False, swapped_only: bool = False) -> list[Directives]:
    """The timed cuco points of one case: each mainloop :func:`worth` timing that its template
    takes at the shape (:data:`MAINLOOPS`, and the swapped ones fitted to it:
    :func:`~cuco.kernels.tp.swapped_mainloops`), in each tile order that differs there, and the
    default point (:func:`default_point`). The swapped ones' clusters along N
    (:func:`~cuco.kernels.tp.cluster_twins`) only with ``cluster_n``: timed on every case at
    3d52a99 (bench/results/gemm_mainloop_cluster_n_3d52a99.json), the best point on 7 of 64 and
    by at most 2.7%, they would add 46 builds to the 78 of a run, which then outlasts a
    10-minute call on a 16-core machine. ``swapped_only``: the swapped mainloops and their
    clusters along N alone (and the default), the twins side by side in a run short enough to
    time a few GEMMs in one call."""
    problem = problem_of(*shape, dtype)
    pick = default_mainloop(problem, sms).mainloop
    out: list[Directives] = []
    for ml in mainloops_for(problem, sms):
        if ml.swap_ab and ml.cluster_m > 1 and not (cluster_n or swapped_only) and ml != pick:
            continue
        if swapped_only and not ml.swap_ab and ml != pick:
            continue
        if worth(ml, shape, sms) and ml != pick:
            continue
        d = point_of(problem, ml)
        if supported(problem, d):
            continue
        out += [d.replace(raster_group=g) for g in tile_orders(walked_tiles(shape, ml)).values()]
    return list(dict.fromkeys([*out, default_point(shape, dtype, sms)]))


#: The most pipeline stages a tile_k twin (:func:`tile_k_twin`) takes: a k-tile of 32 halves a
#: stage's bytes, so the same shared memory holds twice as many (CUTLASS's pipelines take any
#: count; past 16 the barriers' wait outweighs what is left to hide).
TWIN_MOST_STAGES = 16


def tile_k_twin(shape: tuple[int, int, int], dtype: str, d: Directives, tile_k: int) -> Directives | None:
    """``d`` with k-tiles of ``tile_k`` and the most stages that then fit beside the staged
    output tile (at most :data:`TWIN_MOST_STAGES`), or None where the templates cannot render
    it or it is ``d``. A k-tile of 32 keeps the bytes in flight of ``d``'s stages in twice as
    many (finer) stages: what a 128x256 tile's three 64-deep stages cannot. Measured against
    the best point of gemm_mainloop.json at its first 18 bf16 cases (1 x H200, 43e751c:
    bench/results/gemm_tile_k.json, cut at the call's limit): slower at 15 (down to 0.75x at
    384x28672x2048), at most 0.7% faster at the other 3; the sweep keeps 64-deep k-tiles."""
    problem = problem_of(*shape, dtype)
    stages = min(TWIN_MOST_STAGES, stages_that_fit(d.tile_m, d.tile_n, tile_k, problem.dtype_bytes))
    if tile_k == d.tile_k or stages < 2:
        return None
    twin = d.replace(tile_k=tile_k, stages=stages)
    return None if supported(problem, twin) else twin


def parse_mainloop(spec: str) -> Mainloop:
    """A mainloop from ``SCHEDULE:MxN[:sSTAGES][:skSLICES][:ab][:cl2]`` (e.g.
    ``cooperative:208x128:sk4:ab``: swapped 208-row tiles, K in 4 slices), with the most
    stages that fit unless ``s`` says; :class:`ValueError` naming the part to fix. For timing
    mainloops the sweep does not take beside those it does (:attr:`GemmAloneBench.mainloops`);
    :data:`cuco.kernels.tp.NOT_SWEPT` lists those measured so and why they are not swept."""
    parts = spec.lower().split(":")
    if len(parts) < 2 or parts[0] not in ("cooperative", "pingpong"):
        raise ValueError(f"{spec!r}: start with cooperative: or pingpong:, then the tile MxN "
                         "(e.g. cooperative:208x128:sk4:ab)")
    try:
        tm, tn = (int(x) for x in parts[1].split("x"))
    except ValueError:
        raise ValueError(f"{spec!r}: the tile is rows x columns, e.g. 128x256") from None
    stages, split, cluster, swap = None, 1, 1, False
    for part in parts[2:]:
        if part == "ab":
            swap = True
        elif part == "cl2":
            cluster = 2
        elif part.startswith("sk") and part[2:].isdigit():
            split = int(part[2:])
        elif part.startswith("s") and part[1:].isdigit():
            stages = int(part[1:])
        else:
            raise ValueError(f"{spec!r}: {part!r} is none of sN (stages), skN (slices of K), ab, cl2")
    return Mainloop(parts[0], tn, stages or most_stages(tm, tn), tm, split, cluster, swap)


def mainloop_refusal(ml: Mainloop) -> str | None:
    """Why the design space refuses ``ml`` at every GEMM (None where it takes it)."""
    try:
        with_mainloop(BASE, ml)
    except DirectiveError as exc:
        return str(exc)
    return None


def default_point(shape: tuple[int, int, int], dtype: str = "bf16", sms: int = SMS) -> Directives:
    """The point a user who does not search gets (the default mainloop and tile order), named
    as :func:`mainloop_points` times it (the smallest group that walks the same order)."""
    problem = problem_of(*shape, dtype)
    pick = default_mainloop(problem, sms)
    return point_of(problem, pick.mainloop).replace(
        raster_group=timed_order(shape, pick.mainloop, pick.raster_group))


def timed_order(shape: tuple[int, int, int], ml: Mainloop, group: int) -> int:
    """Tile order ``group`` of ``ml`` at ``shape``, named as :func:`mainloop_points` times it:
    the smallest group that walks the same order (:func:`tile_orders`)."""
    m_tiles = walked_tiles(shape, ml)
    return tile_orders(m_tiles).get(min(group, m_tiles), group)


def best_points(rows: list[dict[str, Any]], top: int) -> dict[str, list[str]]:
    """Each row's ``top`` fastest cuco points (a bench file's rows): ``{case: [full names]}``."""
    return {r["case"]: list(r.get("cuco", {}))[:top] for r in rows}


def calls_for(ms_per_call: float) -> int:
    """Back-to-back calls in one sample: about :data:`SAMPLE_MS` of GPU time."""
    if ms_per_call <= 0:
        return MAX_CALLS
    return max(MIN_CALLS, min(MAX_CALLS, round(SAMPLE_MS / ms_per_call)))


def mainloop_text(d: Directives) -> str:
    return Mainloop.of(d).text() + f", tile order {d.raster_group}"


def why_not(row: dict[str, Any], sms: int = SMS) -> str | None:
    """Why cuco's best is slower than the library's in ``row`` (None where it is not): what is
    known of both, from the row's own numbers."""
    if row.get("speedup") is None or row["speedup"] >= 1.0:
        return None
    lib, best = row["baseline"], row["variant"]
    gap = (row["ms"] / row["baseline_ms"] - 1) * 100
    parts = [f"{lib} ran {gap:.1f}% faster than cuco's best ({row.get('variant_text', best)})"]
    units = row.get("cuco_units")
    if units:
        parts.append(f"whose {units} units of work are {units / sms:.2f} waves on {sms} SMs")
    algo = row.get("library_algos", {}).get(lib)
    if algo:
        parts.append("the library ran " + ", ".join(f"{k} {v}" for k, v in algo.items() if k != "algo_id"))
    twin = twin_words(row)
    if twin:
        parts.append(twin)
    if row.get("speedup_paired") is not None and row["speedup_paired"] >= 0.995:
        parts.append(f"round by round the ratio is {row['speedup_paired']:.3f}: within the timing noise")
    elif not any(".sk" in v for v in row.get("cuco", {})) and row.get("cuco_units", sms) < sms:
        parts.append("no split-K point was timed here")
    return "; ".join(parts)


def twin_words(row: dict[str, Any]) -> str | None:
    """What cuco's build of the fastest library kernel's own tiling (``row["library_twins"]``,
    :mod:`cuco.benchmarks.library_twins`) says of a lost row: the same tiles ran slower, or cuco
    cannot build them and why. Where the fastest library program is not a described cuBLASLt
    algorithm (torch.matmul, gemmEx), the fastest described one stands in, named as such."""
    twins = row.get("library_twins") or {}
    lib = row.get("baseline")
    words = []
    if lib not in twins:
        described = [v for v in row.get("libraries", {}) if v in twins]
        if not described:
            return None
        stand = described[0]
        words.append(f"{lib}'s kernel is not described; the fastest described one, {stand}, "
                     f"ran {row['libraries'][stand]:.4f} ms")
        lib = stand
    tw = twins[lib]
    if tw.get("cannot_build"):
        words.append(f"cuco cannot build its tiling ({tw['tiles']}): {tw['cannot_build']}")
    elif tw.get("ms") is None:
        words.append(f"cuco's build of its tiling ({tw['mainloop']}) has no correct timed point here")
    else:
        lib_ms = row["libraries"][lib]
        gap = (tw["ms"] / lib_ms - 1) * 100
        words.append(f"cuco's build of its tiling ({tw['mainloop']}) ran {tw['ms']:.4f} ms, "
                     f"{abs(gap):.1f}% {'slower' if gap > 0 else 'faster'}: the same tiles, "
                     f"{'a slower' if gap > 0 else 'a faster'} kernel")
    return "; ".join(words)


def twin_entries(twins: dict[str, Twin], med: dict[str, float],
                 points: dict[str, Directives]) -> dict[str, dict[str, Any]]:
    """``row["library_twins"]``: per described library program, its tiling in cuco's terms,
    cuco's mainloop with it (or why none) and that mainloop's fastest correct point's time."""
    out = {}
    for lib, tw in twins.items():
        entry: dict[str, Any] = {"tiles": tw.tiles.text(), "mainloop": None, "point": None, "ms": None,
                                 "cannot_build": tw.why_not}
        if tw.mainloop is not None:
            entry["mainloop"] = tw.mainloop.text()
            timed = [v for v, d in points.items() if v in med and Mainloop.of(d) == tw.mainloop]
            if timed:
                best = min(timed, key=med.__getitem__)
                entry.update(point=best, ms=round(med[best], 5))
        out[lib] = entry
    return out


def case_row(shape: tuple[int, int, int], dtype: str, med: dict[str, float], paired: dict[str, float],
             bad: dict[str, int], points: dict[str, Directives], default: str,
             algos: dict[str, dict[str, Any]], missing: dict[str, str], sms: int = SMS,
             twins: dict[str, Twin] | None = None) -> dict[str, Any]:
    """One case's row from its measurements: each program's median ms (``med``, correct ones
    only), its round-by-round ratio to the others (``paired[name]``: median of
    library-best-of-round / name), the bad elements of each checked program (``bad``), the cuco
    points by name, the default's name, the cuBLASLt algorithms' configurations and the library
    programs that could not run (``missing``: why), and cuco's builds of the library's
    tilings (``twins``: :func:`twin_entries`)."""
    m, n, k = shape
    libs = {v: t for v, t in med.items() if v not in points}
    mine = {v: t for v, t in med.items() if v in points}
    row: dict[str, Any] = {"case": case_label(shape, dtype), "shape": list(shape), "dtype": dtype,
                           "nine_pair": tuple(shape) in nine_pair_gemms(), "peers": {}}
    wrong = sorted(v for v, b in bad.items() if b)
    row.update(libraries={v: round(t, 5) for v, t in sorted(libs.items(), key=lambda x: x[1])},
               cuco={v: round(t, 5) for v, t in sorted(mine.items(), key=lambda x: x[1])},
               wrong=wrong, bad_elements={v: bad[v] for v in wrong}, library_missing=missing,
               library_algos=algos, library_twins=twin_entries(twins or {}, mine, points), correct=not wrong)
    if not libs or not mine:
        row.update(variant=None, ms=None, baseline=None, baseline_ms=None, speedup=None,
                   why_not="no correct " + ("library GEMM" if not libs else "cuco point") + " ran")
        return row
    lib = min(libs, key=libs.__getitem__)
    best = min(mine, key=mine.__getitem__)
    d = points[best]
    problem = problem_of(*shape, dtype)
    units = fused_tiles(problem, d) * k_slices(k, d.split_k)[0]
    row.update(variant=best, variant_text=mainloop_text(d), ms=round(mine[best], 5), baseline=lib,
               baseline_ms=round(libs[lib], 5), speedup=round(libs[lib] / mine[best], 4),
               speedup_paired=paired.get(best), tflops=round(2.0 * m * n * k / mine[best] / 1e9, 1),
               cuco_units=units)
    if default in mine:
        row.update(default=default, default_text=mainloop_text(points[default]),
                   default_ms=round(mine[default], 5), default_speedup=round(libs[lib] / mine[default], 4),
                   default_why=default_mainloop(problem, sms).why)
    else:
        row.update(default=default, default_ms=None, default_speedup=None,
                   default_why="the default point was wrong or did not build")
    row["why_not"] = why_not(row, sms)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The file's summary: per dtype and over all, the minimum ratio of cuco's best to the
    fastest library GEMM and of the default to it, and the rows below 1.0."""
    def low(key: str, subset: list[dict]) -> float | None:
        vals = [r[key] for r in subset if r.get(key) is not None]
        return min(vals) if vals else None
    out: dict[str, Any] = {"cases": len(rows), "shapes": len({tuple(r["shape"]) for r in rows}),
                           "dtypes": sorted({r["dtype"] for r in rows})}
    for dt in out["dtypes"]:
        sub = [r for r in rows if r["dtype"] == dt]
        out[f"min_speedup_{dt}"] = low("speedup", sub)
        out[f"min_default_speedup_{dt}"] = low("default_speedup", sub)
    out["min_speedup_nine_pair"] = low("speedup", [r for r in rows if r["nine_pair"]])
    out["below_1"] = [r["case"] for r in rows if r.get("speedup") is None or r["speedup"] < 1.0]
    out["wrong"] = {r["case"]: r["wrong"] for r in rows if r.get("wrong")}
    out["min_default_speedup"] = low("default_speedup", rows)
    out["min_speedup"] = low("speedup", rows)
    return out


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the run prints under its table; the minimum ratio over every case comes last."""
    lines = [f"{summary['cases']} cases ({summary['shapes']} shapes x {', '.join(summary['dtypes'])})"]
    for dt in summary["dtypes"]:
        lines.append(f"{dt}: min cuco best / fastest library {summary[f'min_speedup_{dt}']}, "
                     f"default {summary[f'min_default_speedup_{dt}']}")
    if summary["wrong"]:
        lines.append(f"WRONG programs: {summary['wrong']}")
    lines.append(f"below 1.0: {len(summary['below_1'])} case(s) {summary['below_1']}")
    lines.append(f"min default (no search) / fastest library: {summary['min_default_speedup']}")
    lines.append(f"min speedup (cuco best / fastest library GEMM, every case): {summary['min_speedup']}")
    return lines


@dataclass
class GemmAloneBench:
    shapes: tuple[tuple[int, int, int], ...] = field(default_factory=default_shapes)
    dtypes: tuple[str, ...] = DTYPES
    rounds: int = 9
    lt_top: int = LT_TOP
    cluster_n: bool = False
    swapped_only: bool = False
    name: str = "gemm_mainloop"
    out_dir: Any = results.RESULTS_DIR
    #: go on from this bench's file (a run a device session's limit cut short leaves its
    #: finished cases there, ``partial``): its cases are kept, the others run
    resume: bool = False
    #: also time each point's twin at these k-tile depths (:func:`tile_k_twin`)
    tile_ks: tuple[int, ...] = ()
    #: time only these points of each case (``{case label: [full names]}``, e.g. another run's
    #: best: :func:`best_points`) beside the default and their twins; None: every point
    only: dict[str, list[str]] | None = None
    #: also time these mainloops (:func:`parse_mainloop`) at every case where they render,
    #: in the tile order of 8 m-tiles (or fewer where the case has fewer)
    mainloops: tuple[Mainloop, ...] = ()
    #: also time cuco's build of each cuBLASLt algorithm's own tiling where cuco can build it
    #: (:mod:`cuco.benchmarks.library_twins`), so that a lost row says whether the same tiles
    #: ran slower or the tiling is one cuco cannot build
    library_twins: bool = True
    console: Console = field(default_factory=Console)
    _algos: dict = field(default_factory=dict, repr=False)

    def cases(self) -> list[tuple[tuple[int, int, int], str]]:
        return [(s, dt) for dt in self.dtypes for s in self.shapes]

    def library_algos(self, shape: tuple[int, int, int], dtype: str) -> dict[str, dict[str, Any]]:
        """cuBLASLt's top :attr:`lt_top` heuristic algorithms at one case, described as
        :func:`library_programs` names them (GPU; kept: the build plans their twins before the
        case times them)."""
        key = (tuple(shape), dtype)
        if key not in self._algos:
            from cuco.runtime import cublaslt
            try:
                found = cublaslt.LtGemm(*shape, dtype).candidates(self.lt_top)
                self._algos[key] = {lt_name(j): cublaslt.describe(a) for j, a in enumerate(found)}
            except Exception:  # noqa: BLE001 - no cuBLASLt: no twins (library_programs says why)
                self._algos[key] = {}
        return self._algos[key]

    def twins(self, shape: tuple[int, int, int], dtype: str,
              algos: dict[str, dict[str, Any]] | None = None) -> dict[str, Twin]:
        """cuco's build of each described cuBLASLt algorithm's tiling at one case (``algos``,
        default :meth:`library_algos`), or none without :attr:`library_twins`."""
        if not self.library_twins:
            return {}
        problem = problem_of(*shape, dtype)
        out = {}
        for name, algo in (self.library_algos(shape, dtype) if algos is None else algos).items():
            try:
                out[name] = library_twin(algo, problem, RING_BASE)  # the most stages (point_of: its base)
            except ValueError:  # described without a tile: nothing to build
                continue
        return out

    def points(self, shape: tuple[int, int, int], dtype: str, sms: int,
               twins: dict[str, Twin] | None = None) -> list[Directives]:
        """The cuco points timed at one case: :func:`mainloop_points` (or those of them
        ``only`` names, and the default), the :attr:`mainloops` asked for and the library's
        ``twins`` where they are not timed already, then each one's :attr:`tile_ks` twins."""
        base = mainloop_points(shape, dtype, sms, self.cluster_n, self.swapped_only)
        if self.only is not None:
            keep = set(self.only.get(case_label(shape, dtype), ()))
            default = default_point(shape, dtype, sms)
            base = [d for d in base if d.full_name in keep or d == default]
        problem = problem_of(*shape, dtype)
        swept = {Mainloop.of(d) for d in base}
        extra = [*self.mainloops, *(tw.mainloop for tw in (twins or {}).values()
                                    if tw.mainloop is not None and tw.mainloop not in swept)]
        for ml in dict.fromkeys(extra):
            try:
                d = point_of(problem, ml)
            except DirectiveError:  # the bench's script checks each mainloop once (mainloop_refusal)
                continue
            if not supported(problem, d):
                base.append(d.replace(raster_group=timed_order(shape, ml, 8)))
        twins = [tile_k_twin(shape, dtype, d, k) for d in base for k in self.tile_ks]
        return list(dict.fromkeys([*base, *(t for t in twins if t is not None)]))

    def build(self, sms: int, arch: str | None = None,
              cases: list[tuple[tuple[int, int, int], str]] | None = None) -> dict[tuple[str, str], str]:
        """Every (dtype, point) gemm_only build ``cases`` (default: every case) time, each
        source built once on all cores (one build runs every shape);
        ``{(dtype, point name): library path}``."""
        from cuco.kernels import Compiler
        sources: dict[tuple[str, str], Any] = {}
        for shape, dt in (self.cases() if cases is None else cases):
            for d in self.points(shape, dt, sms, self.twins(shape, dt)):
                key = (dt, d.build_point().full_name)
                if key not in sources:
                    try:
                        sources[key] = render_tp(problem_of(*shape, dt), d, gemm_only=True)[0]
                    except DirectiveError as exc:  # the default at a shape no mainloop renders
                        self.console.print(f"[red]{shape} {dt} {d.full_name}: {exc}[/red]")
        t0 = time.perf_counter()
        items = [(s.name, s.source, s.needs) for s in sources.values()]
        built = Compiler(arch=arch).compile_many(items) if arch else Compiler().compile_many(items)
        out = {}
        for key, b in zip(sources, built):
            if hasattr(b, "path"):
                out[key] = str(b.path)
            else:
                self.console.print(f"[red]{key}: {b}[/red]")
        self.console.print(f"{len(out)}/{len(items)} builds in {time.perf_counter() - t0:.0f} s")
        return out

    def run(self) -> Any:
        """Build and time every case, a shape (both dtypes) at a time, the file written after
        each case (``partial`` until the last): a run cut short keeps what it finished, and
        ``resume`` goes on from it."""
        import cupy
        dev = cupy.cuda.Device()
        sms = int(dev.attributes["MultiProcessorCount"])
        device = f"1 x {cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}"
        before: list[dict[str, Any]] = []
        if self.resume:
            before, before_device = results.resume_rows(self.name, out_dir=self.out_dir, world_size=1,
                                                        commit=results.require_commit())
            results.same_device(self.name, before_device, device)
        todo = self.pending(before)
        if before:
            self.console.print(f"resuming: {len(before)} case(s) already in {self.name}.json, {len(todo)} to run")
        rows: list[dict[str, Any]] = []
        spent = {"build_s": 0.0, "timing_s": 0.0}  # this run's (a resumed file's cases took their own)
        for group in self.groups(todo):
            t0 = time.perf_counter()
            built = self.build(sms, cases=group)
            spent["build_s"] += time.perf_counter() - t0
            for shape_, dt in group:
                t0 = time.perf_counter()
                rows.append(self._case(shape_, dt, built, sms))
                spent["timing_s"] += time.perf_counter() - t0
                self.console.print(self._line(rows[-1]))
                cupy.get_default_memory_pool().free_all_blocks()
                if len(rows) < len(todo):
                    self._write(before + rows, device, sms, spent, len(before), partial=True)
        order = {case_label(*c): i for i, c in enumerate(self.cases())}
        rows = sorted(before + rows, key=lambda r: order.get(r["case"], len(order)))
        path = self._write(rows, device, sms, spent, len(before), partial=False)
        self._print(rows)
        self.console.print(f"wrote {path}")
        for line in summary_lines(summarize(rows)):
            self.console.print(line)
        return path

    def pending(self, before: list[dict[str, Any]]) -> list[tuple[tuple[int, int, int], str]]:
        """The cases ``before`` (a resumed file's rows) does not hold, in run order."""
        done = {r["case"] for r in before}
        return [c for c in self.cases() if case_label(*c) not in done]

    @staticmethod
    def groups(cases: list[tuple[tuple[int, int, int], str]]) -> list[list[tuple[tuple[int, int, int], str]]]:
        """``cases`` a shape at a time (its dtypes together: one build step, then their timing)."""
        return [[c for c in cases if c[0] == shape] for shape in dict.fromkeys(s for s, _ in cases)]

    def _write(self, rows: list[dict[str, Any]], device: str, sms: int, spent: dict[str, float],
               resumed: int, partial: bool) -> Any:
        extra = {"summary": summarize(rows), "sms": sms, "lt_top": self.lt_top, "rounds": self.rounds,
                 **{k: round(v, 1) for k, v in spent.items()}, "resumed_cases": resumed}
        if partial:
            extra["partial"] = True
        return results.write(self.name, rows, device=device, world_size=1, emulated=False,
                             out_dir=self.out_dir, extra=extra)

    def _case(self, shape: tuple[int, int, int], dtype: str, built: dict, sms: int) -> dict[str, Any]:
        import cupy
        m, n, k = shape
        a, b, ref = operands(m, n, k, dtype)
        progs, missing, algos = library_programs(a, b, m, n, k, dtype, self.lt_top)
        twins = self.twins(shape, dtype, algos)
        points = {}
        calls_state = cupy.zeros(CALL_STATE_ELEMS, dtype=cupy.uint16)
        for d in self.points(shape, dtype, sms, twins):
            path = built.get((dtype, d.build_point().full_name))
            if path is None:
                continue
            c = dtypes_empty(m, n, dtype)
            ws = split_workspace_bytes(problem_of(*shape, dtype), d)
            work = cupy.zeros(max(ws, 1), dtype=cupy.uint8)
            progs[d.full_name] = (cuco_launcher(path, d.raster_group, a, b, c, calls_state, work, ws, sms), c)
            points[d.full_name] = d
        bad = {v: check_output(fn, c, ref, k, dtype) for v, (fn, c) in progs.items()}
        ok = {v: fn for v, (fn, _) in progs.items() if bad[v] == 0}
        for fn in ok.values():
            for _ in range(3):
                fn()
        # calls per sample from the fastest library's time (one call, events)
        est = one_call_ms(ok.get(GEMMEX) or next(iter(ok.values()))) if ok else 1.0
        calls = calls_for(est)
        names = list(ok)
        times = sample_rounds(ok, self.rounds, calls)
        for v in names:  # the last timed call's output, checked again
            bad[v] += bad_elements(progs[v][1], ref, k, dtype)
        med = {v: statistics.median(t) for v, t in times.items() if bad[v] == 0}
        lib_names = [v for v in med if v not in points]
        paired = {}
        for v in med:
            if v in points and lib_names:
                paired[v] = round(statistics.median(
                    min(times[lv][i] for lv in lib_names) / times[v][i] for i in range(self.rounds)), 4)
        row = case_row(shape, dtype, med, paired, bad, points, default_point(shape, dtype, sms).full_name,
                       algos, missing, sms, twins)
        row.update(calls_per_sample=calls, rounds=self.rounds)
        return row

    @staticmethod
    def _line(row: dict[str, Any]) -> str:
        if row.get("speedup") is None:
            return f"{row['case']}: {row['why_not']}"
        return (f"{row['case']}: cuco {row['ms']:.4f} ms ({row['variant_text']}) vs {row['baseline']} "
                f"{row['baseline_ms']:.4f} ms: {row['speedup']:.3f} (default {row.get('default_speedup')})"
                + (f" WRONG: {row['wrong']}" if row["wrong"] else ""))

    def _print(self, rows: list[dict[str, Any]]) -> None:
        t = Table(title="GEMM alone: cuco's best in-kernel mainloop vs the fastest library GEMM (same run)")
        for col in ("case", "cuco best", "ms", "library", "lib ms", "speedup", "default", "why not"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["case"] + (" *" if r["nine_pair"] else ""), str(r.get("variant_text", "-")),
                      f"{r['ms']:.4f}" if r.get("ms") else "-", str(r.get("baseline")),
                      f"{r['baseline_ms']:.4f}" if r.get("baseline_ms") else "-",
                      f"{r['speedup']:.3f}" if r.get("speedup") else "-",
                      f"{r['default_speedup']:.3f}" if r.get("default_speedup") else "-",
                      (r.get("why_not") or "")[:80])
        self.console.print(t)


# ---- GPU helpers ----------------------------------------------------------------------------
#: uint16 elements of the call state a fused kernel keeps on the device (two 8-byte slots).
CALL_STATE_ELEMS = 8


def dtypes_empty(m: int, n: int, dtype: str):
    from cuco.runtime import dtypes
    return dtypes.empty(m * n, dtype).reshape(m, n)


def sample_rounds(fns: dict[str, Callable[[], None]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Each program's ms per call in each of ``rounds`` samples of ``calls`` back-to-back calls
    between CUDA events, a spin kernel ahead of each sample covering the host's enqueueing
    (:data:`ENQUEUE_US` a call), the programs in a balanced order that changes every round."""
    import cupy
    from cuco.runtime.timing import balanced_order, spin
    stream = cupy.cuda.get_current_stream()
    marks: dict[str, list] = {v: [] for v in fns}
    for r in range(rounds):
        for v in balanced_order(list(fns), r):
            spin(stream, 20 + ENQUEUE_US * calls)
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            for _ in range(calls):
                fns[v]()
            e.record()
            marks[v].append((s, e))
        stream.synchronize()
    return {v: [cupy.cuda.get_elapsed_time(s, e) / calls for s, e in m] for v, m in marks.items()}


def operands(m: int, n: int, k: int, dtype: str):
    """A and B (``dtype``, N(0, 1) / k^0.25 each) and the fp32 reference of A @ B: the
    products of 16-bit values are exact in fp32, the sums fp32 (cuBLAS, fp32 output)."""
    import cupy
    from cuco.runtime import dtypes
    rng = cupy.random.default_rng(m * 7 + n * 5 + k)
    a = dtypes.from_float32(rng.standard_normal((m, k), dtype=cupy.float32) / k ** 0.25, dtype)
    b = dtypes.from_float32(rng.standard_normal((k, n), dtype=cupy.float32) / k ** 0.25, dtype)
    ref = cupy.empty((m, n), dtype=cupy.float32)
    _cublas(a, b, ref, dtype, "fp32")
    return a, b, ref


def lt_name(j: int) -> str:
    """The program name of cuBLASLt's ``j``-th heuristic algorithm (rows, twins, descriptions)."""
    return f"cublaslt.heuristic{j}"


def library_programs(a, b, m: int, n: int, k: int, dtype: str, lt_top: int):
    """Every library program: ``{name: (call, out)}``, why any could not run, and the cuBLASLt
    algorithms' configurations."""
    import cupy
    from cuco.runtime import cublaslt
    progs: dict[str, tuple[Callable[[], None], Any]] = {}
    missing: dict[str, str] = {}
    algos: dict[str, dict[str, Any]] = {}
    fn = _torch_matmul(a, b, m, n, dtype)
    if isinstance(fn, str):
        missing[TORCH] = fn
    else:
        progs[TORCH] = fn
    c = dtypes_empty(m, n, dtype)
    progs[GEMMEX] = ((lambda c=c: _cublas(a, b, c, dtype, dtype)), c)
    try:
        plan = cublaslt.LtGemm(m, n, k, dtype)
        found = plan.candidates(lt_top)
    except Exception as exc:  # noqa: BLE001 - no cuBLASLt: the others still compete
        missing["cublaslt"] = f"{type(exc).__name__}: {exc}"
        found = []
    for j, algo in enumerate(found):
        name = lt_name(j)
        c = dtypes_empty(m, n, dtype)
        progs[name] = ((lambda algo=algo, c=c: plan.run(algo, int(a.data.ptr), int(b.data.ptr), int(c.data.ptr),
                                                       cupy.cuda.get_current_stream().ptr)), c)
        try:
            algos[name] = cublaslt.describe(algo)
        except Exception as exc:  # noqa: BLE001 - a description is a nicety
            algos[name] = {"describe_failed": str(exc)}
    return progs, missing, algos


def one_call_ms(fn: Callable[[], None]) -> float:
    import cupy
    s, e = cupy.cuda.Event(), cupy.cuda.Event()
    s.record()
    fn()
    e.record()
    e.synchronize()
    return cupy.cuda.get_elapsed_time(s, e)


def check_output(fn: Callable[[], None], out, ref, k: int, dtype: str) -> int:
    from cuco.runtime import dtypes
    dtypes.poison(out, dtype)  # an element the call does not write fails
    try:
        fn()
    except RuntimeError:
        return out.size
    return bad_elements(out, ref, k, dtype)


def bad_elements(out, ref, k: int, dtype: str) -> int:
    """Elements outside one rounding of the output plus fp32 accumulation-order slack
    (:func:`cuco.runtime.host_gemm.tolerance`, as the host baseline's check)."""
    from cuco.runtime.checking import compare
    from cuco.runtime.host_gemm import tolerance
    rtol, atol_f = tolerance(k, dtype)
    scale = float(abs(ref).max()) if ref.size else 1.0
    return compare(out, ref, dtype, rtol=rtol, atol=atol_f * scale)["bad_elements"]


def _cublas(a, b, c, dtype: str, out_dtype: str) -> None:
    """cuBLAS ``gemmEx`` (default algorithm), ``dtype`` operands, C in ``out_dtype``."""
    import cupy
    from cuco.runtime.cublas import gemm
    (m, k), n = a.shape, b.shape[1]
    gemm(a.data.ptr, b.data.ptr, c.data.ptr, m, n, k, dtype, cupy.cuda.get_current_stream(),
         out_dtype=out_dtype)


def _torch_matmul(a, b, m: int, n: int, dtype: str):
    """``torch.matmul(A, B, out=C)`` on CuPy's current stream, or why it cannot run."""
    try:
        import torch
    except ImportError as exc:
        return f"torch not importable: {exc}"
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    ta = torch.as_tensor(a, device="cuda").view(tdt)
    tb = torch.as_tensor(b, device="cuda").view(tdt)
    c = dtypes_empty(m, n, dtype)
    tc = torch.as_tensor(c, device="cuda").view(tdt)
    return (lambda: torch.matmul(ta, tb, out=tc)), c  # the default stream, as CuPy's calls


def cuco_launcher(path: str, raster: int, a, b, c, calls_state, work, work_bytes: int,
              sms: int) -> Callable[[], None]:
    """One call of a gemm_only in-kernel build on the current stream (one rank: no peers; the
    arena holds only the kernel's call state; ``work``: a split-K build's workspace)."""
    import cupy
    from cuco.runtime.worker import load_launcher
    dev = cupy.cuda.Device().id
    lib = load_launcher(path, dev)
    peers = (ctypes.c_void_p * 1)(calls_state.data.ptr)
    (m, n), k = c.shape, a.shape[1]

    def call() -> None:
        rc = lib.cuco_fused_launch(*fused_launch.pack(
            device=dev, stream=cupy.cuda.get_current_stream().ptr, grid=sms, m=m, n=n, k=k, raster_group=raster,
            x=a.data.ptr, w=b.data.ptr, out=c.data.ptr, a0=None, a1=None, peers=peers, me=0,
            data_off=0, stage_off=0, out_off=0, flag_off=0, calls_off=0,
            workspace=work.data.ptr if work_bytes else None, workspace_bytes=work_bytes))
        if rc:
            raise RuntimeError(f"{path}: launch failed (CUDA error {rc})")
    return call


def spread_table() -> list[dict[str, Any]]:
    """Each default case's per-rank shape, its 128x128 tile count and last-wave fill on 132
    SMs, and the timed points (``bench/gemm_mainloop.py --list``; no GPU)."""
    out = []
    for shape in default_shapes():
        m, n, k = shape
        t = -(-m // 128) * -(-n // 128)
        out.append({"shape": "x".join(map(str, shape)), "ragged_m": m % 64 != 0, "decode": m <= 1024,
                    "tiles_128x128": t, "waves": round(t / SMS, 2),
                    "last_wave_full": round((t - (math.ceil(t / SMS) - 1) * SMS) / SMS, 2),
                    "points": len(mainloop_points(shape)),
                    "default": mainloop_text(default_point(shape))})
    return out
