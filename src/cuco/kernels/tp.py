"""Render fused kernels for the tensor-parallel workloads from :class:`Directives`.

Three templates:

* ``placement=side_stream`` (``tp_side_stream.cu.j2``; GIN in ``tp_side_stream_gin.cu.j2``):
  vendor GEMM per chunk on one stream, a persistent communication kernel on another; the
  chunk plan is a launch argument (:func:`side_stream_context`).
* ``placement=epilogue`` and ``dedicated_ctas`` (``tp_fused.cu.j2``): ONE persistent kernel
  whose GEMM mainloop is CUTLASS's Hopper collective (TMA + wgmma); each output tile is
  moved by the compute CTA itself (epilogue) or by CTAs of the same kernel reserved for
  communication (dedicated_ctas), with a flag per tile. These are built as shared objects
  (CUTLASS builds the TMA descriptors on the host); their tiles are those of
  :data:`MAINLOOPS` (what :func:`supported` takes); the placements' own rules (one output tile per flag, ...) are in
  :mod:`cuco.design.placement_rules`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from cuco.design import Directives, GemmProblem, placement_rules
from cuco.design.dimensions import Placement, Schedule
from cuco.design.patterns import TP_NAMES, LocalGemm, TPPattern, find
from cuco.design.rules import SMEM_LIMIT_BYTES, schedule_holds, smem_bytes
from cuco.design.tiles import EQUAL_CHUNKS_M, ChunkPlan
from cuco.errors import DirectiveError
from cuco.kernels.collectives import MAX_RANKS, KernelSource
from cuco.kernels import fused_launch
from cuco.kernels.launcher_source import LAUNCHER_PARTS
from cuco.kernels.render import CTYPES, render

THREADS = 512
#: Flag slots per source rank: side-stream chunks, or fused tiles (at most half of them).
FLAG_STRIDE = 16384
#: The in-kernel placements' names, derived from :attr:`Placement.in_kernel` (test it there).
IN_KERNEL = tuple(p.value for p in Placement if p.in_kernel)
#: What a profile build's name starts with (the fused kernel's GEMM alone, ``gemm_only``).
PROFILE = "profile.gemm_only."
CUTLASS_TYPES = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}


class Mainloop(NamedTuple):
    """One in-kernel mainloop a search sweeps: the consumer schedule, the tile (``tile_m`` x
    ``tile_n`` x 64), the pipeline's stages, how many slices of K each tile is cut into and
    the CTAs of a cluster along the mainloop's M (2: B multicast to a pair of m-tiles, or with
    A and B swapped, A to a pair of n-tiles), and whether A and B are swapped (the tile's rows
    on wgmma's N: any multiple of 16)."""

    schedule: str
    tile_n: int
    stages: int
    tile_m: int = 128
    split_k: int = 1
    cluster_m: int = 1
    swap_ab: bool = False

    @classmethod
    def of(cls, d: Directives) -> "Mainloop":
        return cls(d.schedule.value, d.tile_n, d.stages, d.tile_m, d.split_k, d.cluster_m, d.swap_ab)

    def text(self) -> str:
        return (f"{self.schedule} {self.tile_m}x{self.tile_n} with {self.stages} stages"
                + (f", K in {self.split_k} slices" if self.split_k > 1 else "")
                + (f", clusters of {self.cluster_m} along {'N' if self.swap_ab else 'M'}" if self.cluster_m > 1 else "")
                + (", A and B swapped" if self.swap_ab else ""))


#: Tiles 192 or 64 columns wide, for GEMMs whose 128- and 256-wide tiles leave a partial last
#: wave (wave quantization: e.g. 2176x2048 is 272 128x128 tiles, 2.06 waves of 132 SMs, and
#: 374 64x192 tiles, 2.83): cooperative 128x192, pingpong 64x192 and 64x64 (a decode-like M's
#: N cut finer instead of K). Each with the most stages that fit beside the staged output tile.
#: Correct on 1 x H200 (bench/logs/tests_gemm_tools_w1_h200_8494053.log); timed at two GEMMs
#: (bench/results/gemm_mainloop_wave_cluster.json: 64x192 0.8456x the fastest library at
#: 2176x2048x8192, where 128x128 ran 0.13531 against its 0.11345 ms); default_mainloop's pick
#: among them is modelled.
WAVE_TILES = (Mainloop("cooperative", 192, 4), Mainloop("pingpong", 192, 6, tile_m=64),
              Mainloop("pingpong", 64, 8, tile_m=64))
#: 2x1 clusters: each pair of CTAs computes two adjacent m-tiles of one n-tile in lock-step,
#: the B tile loaded once for both (TMA multicast): half of B's L2 traffic, for the mainloops
#: with many tiles along M. Correct on 1 x H200 (same log); at the two GEMMs timed, no faster
#: than the same mainloop without a cluster.
CLUSTER_MAINLOOPS = (Mainloop("cooperative", 256, 3, cluster_m=2), Mainloop("pingpong", 128, 6, cluster_m=2),
                     Mainloop("cooperative", 128, 4, cluster_m=2))
#: The in-kernel mainloops a search sweeps, each with the most stages that fit beside the staged
#: output tile. The first three were measured on one H200: the best of them ran 1.003-1.078x
#: torch.matmul on each of 12 GEMMs; pingpong won 8, cooperative 128x256 the large-N ones
#: (bench/results/gemm_mainloop.json at a5bcd9e). The 64-row tiles (pingpong only: each consumer
#: warpgroup takes a whole 64-row tile) and the split-K ones (a tile's K cut into slices,
#: summed by the slice that finishes last) are for GEMMs with few tiles (decode-like M); they
#: render and compile, and are correct on 1 x H200 (same log as the tiles below). Where the
#: tiles outnumber the grid's CTAs, split-K cuts only the short last wave's tiles (split_tail):
#: pingpong 128x128 so cut ran 0.10819 against the best unsplit point's 0.11741 ms at
#: 2176x2048x8192 and 0.0779 against 0.08462 at 1000x5120x5120 on 1 x H200, but 0.02109 against
#: 0.0174 at 1536^3 (bench/results/gemm_mainloop_split_tail.json); no default takes it yet.
MAINLOOPS = (Mainloop("cooperative", 128, 4), Mainloop("cooperative", 256, 3), Mainloop("pingpong", 128, 6),
             Mainloop("pingpong", 128, 8, tile_m=64), Mainloop("pingpong", 256, 4, tile_m=64),
             Mainloop("pingpong", 128, 6, split_k=2), Mainloop("pingpong", 128, 6, split_k=4),
             Mainloop("pingpong", 128, 6, split_k=8),
             Mainloop("pingpong", 128, 8, tile_m=64, split_k=2), Mainloop("pingpong", 128, 8, tile_m=64, split_k=4),
             *WAVE_TILES, *CLUSTER_MAINLOOPS)
#: Mainloops timed beside the sweep's best (bench/gemm_mainloop.py --tile-k / --mainloop, every
#: output checked, 1 x H200) and left out of the sweep: what each family is, and what it ran.
NOT_SWEPT = {
    "k-tiles of 32 (twice the stages in the same shared memory)":
        "slower than the best point at 15 of 18 bf16 GEMMs, at most 0.7% faster at the other 3 "
        "(bench/results/gemm_tile_k.json, 43e751c)",
    "split-K on cooperative 128x192, swapped 208x128 and 256x128, and pingpong 64x192 tiles":
        "0.27-0.80x the fastest library at 200x4096x4096 and 256x1536x8192, where the 64-row "
        "pingpong points ran 0.82-0.88x (bench/results/gemm_few_tile_splits.json, 23a35c7)",
    "more stages for small tiles (9 to 13, as shared memory allows)":
        "none faster than the same tile with 8 stages by more than 0.1% at 64x28672x8192, "
        "64x8192x8192 and 200x4096x4096 (bench/results/gemm_deep_stages.json, 23a35c7)",
    "64-row tiles and pingpong 64x256 in 2x1 clusters":
        "slower than the best unclustered point at all 6 cases of 200x4096x4096, 256x1536x8192 "
        "and 512x4096x8192: 0.47-0.83x the fastest library against 0.83-0.97x "
        "(bench/results/gemm_few_tile_clusters.json, 23a35c7); "
        "66 clusters of 2 run at once on 132 SMs (bench/logs/cluster_capacity_w1_h200_90385db.log): "
        "not the grid but the pairs' lock-step",
    "swapped 80-row tiles (3 m-tiles at M=200, the tile count of cuBLASLt's 72-row pick) and swapped "
    "144x128 in clusters of 2 along N":
        "slower than the best swept point at all 3 bf16 GEMMs timed, 200x4096x4096, 1000x5120x5120 and "
        "1536x1536x1536: 0.51-0.90x the fastest library against 0.83-0.95x (the best swept point) "
        "(bench/results/gemm_decode_frames.json, 2770329)",
}
#: split-K: the most workspace (fp32 partial tiles, one per slice of every tile) a point may ask
#: for; sized for every slice of every tile (the grid, which decides what split_tail cuts, is
#: the launch's), it is a few MiB for GEMMs with few tiles and tens at a short last wave.
SPLIT_K_WORKSPACE_LIMIT = 256 << 20


#: The SMs the default mainloop's wave arithmetic assumes: H100 SXM and H200 (132 each).
SMS = 132
#: The mainloop fields of :func:`in_kernel`, and their values when neither they nor a problem
#: are given (the cooperative 128x256 mainloop, three stages, K whole).
MAINLOOP_FIELDS = dict(schedule="cooperative", tile_n=256, stages=3, tile_m=128, split_k=1, cluster_m=1,
                       swap_ab=False)


class Pick(NamedTuple):
    """The default in-kernel mainloop of one GEMM (:func:`default_mainloop`): the mainloop, the
    tile order, and why."""

    mainloop: Mainloop
    raster_group: int
    why: str


def wave_fill(tiles: int, sms: int) -> tuple[float, float]:
    """``(waves, efficiency)`` of ``tiles`` units on ``sms`` persistent CTAs: the last wave's
    idle SMs count against the efficiency."""
    full = -(-tiles // sms)
    return tiles / sms, tiles / (full * sms)


def default_mainloop(problem: GemmProblem, sms: int = SMS) -> Pick:
    """The in-kernel mainloop a user who does not search gets at ``problem`` (one of
    :func:`mainloops_for` it), and its tile order.

    Measured (``bench/results/gemm_mainloop.json``, 1 x H200, 12 GEMMs, the three mainloops
    it had): cooperative 128x256 won every GEMM whose 128x256 tiles fill more than 1.5 waves of
    132 SMs with a last wave at least 95% full; pingpong 128x128 won the others (its twice as
    many tiles fill the last wave better: 6144x5120, 3072x7168, 4096x1536, 512x4096,
    2048x2048); with tile order 16 m-tiles for 128x256 and 8 for 128x128, each pick ran within
    1.2% of the best measured point there (tests/test_gemm_mainloop_cpu.py reads the file).
    Below half a wave of 128x128 tiles (decode-like M), the 64-row pingpong mainloop that
    :func:`few_tile_time` puts fastest (waves of units, a cost per extra slice of K fitted to
    the few-tile rows of gemm_mainloop.json: :data:`FOLD_KTILES`), each slice at least 4
    k-tiles deep, and none split where the GEMM streams B (:func:`streams_b`). Modelled, not
    measured: where the measured pick is pingpong 128x128, the unsplit mainloop (the 192- and
    64-wide tiles included) that :func:`modelled_time` puts :data:`WAVE_GAIN` below it, if any
    (wave quantization: 2176x2048 takes pingpong 64x192; every GEMM the picks were measured on
    keeps its pick). Then, where the swapped mainloop fitted to the shape
    (:func:`swapped_mainloops`' first) is modelled below :data:`SWAP_GAIN` of that pick's
    time, the swapped one (measured on 1 x H100 at 3e23e54: it ran faster than the unswapped
    pick on all 18 such rows of gemm_mainloop.json's 64, up to 1.41x at 2176x2048x8192; above
    the bar it lost on 512x14336x4096). Last, where the pick is still pingpong 128x128 and its
    last wave at most half full, the same with that wave's tiles in 2 slices of K
    (:func:`_split_tail_if_cut`, measured at 512x14336x4096). The picks keep the stages that
    fit beside a whole staged tile, not those a ring of sub-tiles leaves room for
    (:func:`deepest`): as the default of an AllGather's GEMM, cooperative 128x256 ring-staged
    with 4 stages on the consumers ran 0.5-2.1% slower than with 3 stages and the comm warps'
    whole-tile epilogue (the same tile order) at 9 of the 14 cases where 128x256 is the pick,
    within 0.3% at 4 and 3.8% faster at one (bench/results/gemm_ring_stages.json, 1 x H200).
    """
    pick = _split_tail_if_cut(problem, _swapped_if_fitter(problem, _default_mainloop(problem, sms), sms), sms)
    if not supported(problem, with_mainloop(in_kernel("epilogue"), pick.mainloop, problem.dtype_bytes)):
        return pick
    for ml in sorted(MAINLOOPS, key=lambda ml: (ml.split_k, ml.cluster_m, -ml.tile_m * ml.tile_n)):  # the largest tiles
        if not supported(problem, with_mainloop(in_kernel("epilogue"), ml, problem.dtype_bytes)):
            return Pick(ml, pick.raster_group, f"{ml.text()}: the first mainloop that renders here "
                        f"({pick.mainloop.text()} does not)")
    return pick  # nothing renders: render_tp names why


#: A swapped mainloop replaces the default's pick where :func:`modelled_time` puts it below
#: this fraction of the pick's time (measured: gemm_mainloop.json at 3e23e54, 1 x H100; 0.98,
#: not 0.97, since b157e15: at 384x28672x2048 cooperative 96x128 swapped, modelled at 97.2% of
#: pingpong 128x128's time, was the best point, and pingpong 128x128 ran at 0.917x and 0.927x
#: its speed on 1 x H200, 0.947x and 0.956x on 1 x H100, bf16 and fp16).
SWAP_GAIN = 0.98


def _swapped_if_fitter(problem: GemmProblem, pick: Pick, sms: int) -> Pick:
    """``pick``, or the swapped mainloop fitted to ``problem`` where its tiles fill the waves
    so much better (:data:`SWAP_GAIN`): the fastest modelled frame, and of frames modelled
    alike the one with more stages. Measured: at 2000x7168x2048 and 2176x2048x8192, whose
    144x256 and 144x128 tiles fill the same waves, 144x128's five stages ran faster than
    144x256's three (tile order 8) in 7 of the 8 cases of the two H200 files
    (gemm_mainloop_h200_b157e15.json, and gemm_mainloop.json at 5452aa7: 0.6-3.1% faster; 0.8%
    slower at 2176x2048x8192 fp16 there) and in 2 of the 4 of the H100 one
    (gemm_mainloop_h100_1d229c0.json); the sweep keeps both."""
    fitted = swapped_mainloops(problem, sms, top=len(SWAP_FRAMES))
    if not fitted:
        return pick
    ml = min(fitted, key=lambda f: (modelled_time(problem, f, sms), -f.stages))
    base = modelled_time(problem, pick.mainloop, sms)
    t = modelled_time(problem, ml, sms)
    if t >= SWAP_GAIN * base:
        return pick
    tiles, waves, eff = tile_waves(problem, ml, sms)
    return Pick(ml, 8, f"{tiles} {ml.tile_m}x{ml.tile_n} tiles, A and B swapped (the rows on wgmma's N), fill "
                f"{waves:.2f} waves, the last {eff:.0%} full: modelled {t / base:.0%} of "
                f"{pick.mainloop.text()}'s time (measured faster wherever modelled below "
                f"{SWAP_GAIN:.0%}: gemm_mainloop.json)")


def _default_mainloop(problem: GemmProblem, sms: int) -> Pick:
    k = local_gemm(problem).k
    waves, eff = wave_fill(tiles_of(problem, 128, 256), sms)
    if waves > 1.5 and eff >= 0.95:
        return Pick(Mainloop("cooperative", 256, 3), 16, f"128x256 tiles fill {waves:.2f} waves, "
                    f"the last {eff:.0%} full (measured: cooperative 128x256 wins there)")
    tm, t = regime_tiles(problem)
    if not few_tiles(problem, sms):
        pick = Pick(Mainloop("pingpong", 128, 8 if tm == 64 else 6, tm), 8,
                    f"{t} {tm}x128 tiles ({wave_fill(t, sms)[0]:.2f} waves; measured: pingpong 128x128 "
                    "wins where 128x256 tiles leave a partial last wave)")
        return _fuller_waves(problem, pick, sms)
    best = min((ml for ml in MAINLOOPS if few_tile_candidate(problem, ml)),
               key=lambda ml: (few_tile_time(problem, ml, sms), ml.split_k, -ml.tile_n))
    units = tiles_of(problem, best.tile_m, best.tile_n) * k_slices(k, best.split_k)[0]
    return Pick(best, 8, f"{t} {tm}x128 tiles are {t / sms:.2f} of a wave: {best.text()} makes {units} units "
                "of work, modelled fastest among the 64-row mainloops (few_tile_time: waves of units, "
                f"{FOLD_KTILES} k-tiles per extra slice of K; fitted to gemm_mainloop.json's few-tile rows)")


#: The few-tile regime's cost of each slice of K beyond the first, in k-tiles of the tile's own
#: mainloop: the slice's fp32 partial written and read back by the slice that folds them.
#: Fitted to the four few-tile GEMMs of gemm_mainloop.json (1be8aa5, 1 x H100, bf16 and fp16:
#: 64x8192x8192, 128x8192x28672, 200x4096x4096, 256x1536x8192), with 64-wide tiles' rate
#: :data:`TILE_N_RATE`: the pick ran at least 0.907x the best timed point's speed on all 8 rows
#: (the split-K-first rule before it: 0.788x). tests/test_gemm_mainloop_cpu.py reads the file.
FOLD_KTILES = 12


def regime_tiles(problem: GemmProblem) -> tuple[int, int]:
    """``(tile_m, tiles)`` that :func:`default_mainloop`'s regimes are told apart by: 128x128
    tiles, 64x128 where a rank's block is at most 64 rows, over every rank's block."""
    tm = 64 if placement_rules.row_block(problem) <= 64 else 128
    return tm, tiles_of(problem, tm, 128)


def few_tiles(problem: GemmProblem, sms: int = SMS) -> bool:
    """Whether ``problem`` is in the few-tile regime of :func:`default_mainloop`: fewer
    :func:`regime_tiles` than half the SMs, K at least 512 or the block that short."""
    tm, t = regime_tiles(problem)
    return not (t >= sms / 2 or tm == 128 and local_gemm(problem).k < 512)


def few_tile_candidate(problem: GemmProblem, ml: Mainloop) -> bool:
    """Whether the few-tile regime weighs ``ml``: a 64-row pingpong mainloop without clusters
    (measured: they beat 128-row tiles split into slices there), each slice at least 4 k-tiles,
    and unsplit where the GEMM streams B (:func:`streams_b`)."""
    if ml.schedule != "pingpong" or ml.tile_m != 64 or ml.cluster_m > 1:
        return False
    if ml.split_k == 1:
        return True
    return not streams_b(problem) and k_slices(local_gemm(problem)[2], ml.split_k)[1] >= 4


#: Rows of C below which a GEMM streams B from memory: each 2-byte element of B then feeds
#: fewer flops (2 x rows / 2 bytes) than an H100's or H200's tensor cores do per byte of HBM
#: (about 295 and 206 flop/B), whatever the tiles. Splitting K there adds the partials' traffic
#: and the fold and no bandwidth: measured, at 64x8192x8192 unsplit 64x64 tiles ran 0.0365 ms
#: against 64x128 in 2 slices' 0.0408 (gemm_mainloop_h200_b157e15.json, 1 x H200; 0.0501 against
#: 0.0547 on 1 x H100, gemm_mainloop_h100_1d229c0.json), and the best point at 128x8192x28672
#: and 200x4096x4096 was unsplit in both runs; at 256x1536x8192 2 slices won in both.
STREAMING_ROWS = 200


def streams_b(problem: GemmProblem) -> bool:
    """Whether ``problem``'s GEMM is bound by streaming B (:data:`STREAMING_ROWS`)."""
    return local_gemm(problem).m <= STREAMING_ROWS


def few_tile_time(problem: GemmProblem, ml: Mainloop, sms: int = SMS) -> float:
    """The modelled time of ``ml`` where a GEMM has fewer tiles than half the SMs: the wave
    model of :func:`modelled_time` with 64-row tiles at the full rate (fitted with
    :data:`FOLD_KTILES`: 64-row tiles won there)."""
    return _waves(problem, ml, sms, m64_rate=1.0)


#: A tile width's mainloop throughput relative to 128 or more columns (modelled: a
#: warpgroup's 64-column wgmma reads as many shared-memory bytes of A per flop as of B, near
#: the SM's shared-memory bandwidth), and the 64-row tiles' (each CTA loads B for half the
#: rows). Not measured; they only rank tiles in :func:`modelled_time`.
TILE_N_RATE = {64: 0.8}
TILE_M64_RATE = 0.9
#: A swapped tile's rate with 64 columns on wgmma's M (a pingpong warpgroup's), in both
#: regimes: measured, swapped pingpong 128x64 ran 0.73-0.88x the best point at 512x14336x4096
#: (both dtypes: gemm_mainloop_h200_b157e15.json on 1 x H200, and gemm_mainloop_h100_1d229c0.json)
#: where TILE_M64_RATE modelled it 3% faster than pingpong 128x128.
SWAPPED_M64_RATE = 0.85
#: A modelled pick replaces a measured one only where it is modelled this much faster.
WAVE_GAIN = 0.9


def modelled_time(problem: GemmProblem, ml: Mainloop, sms: int = SMS) -> float:
    """The modelled time of ``ml`` at ``problem``, in units of one 128x128 tile's whole K
    loop on one SM: the waves of units (tiles x slices of K) the persistent CTAs run, a
    partial last wave costing a whole one (wave quantization), times each unit's share of a
    128x128 tile's work plus :data:`FOLD_KTILES` k-tiles per extra slice for the fold, over
    the tile's relative rate (:data:`TILE_N_RATE`, :data:`TILE_M64_RATE`)."""
    return _waves(problem, ml, sms, m64_rate=TILE_M64_RATE)


def _waves(problem: GemmProblem, ml: Mainloop, sms: int, m64_rate: float) -> float:
    """The wave model both regimes rank mainloops by (:func:`modelled_time`), 64-row tiles at
    ``m64_rate``."""
    k = local_gemm(problem).k
    slices, per = k_slices(k, ml.split_k)
    units = tiles_of(problem, ml.tile_m, ml.tile_n) * slices
    rate = tile_rate(ml, m64_rate)
    area = ml.tile_m * ml.tile_n / (128 * 128)
    return -(-units // sms) * area * (per + FOLD_KTILES * (slices - 1)) / -(-k // 64) / rate


def tile_rate(ml: Mainloop, m64_rate: float = TILE_M64_RATE) -> float:
    """``ml``'s tile's mainloop throughput relative to a 128x128 tile's (modelled, not
    measured): the width on wgmma's N (the tile's columns, or its rows with A and B swapped)
    at :data:`TILE_N_RATE` (below 128, linear through 64's), 64 rows on wgmma's M at ``m64_rate``
    (a swapped tile's 64 columns there at :data:`SWAPPED_M64_RATE`)."""
    wg_n, wg_m = (ml.tile_m, ml.tile_n) if ml.swap_ab else (ml.tile_n, ml.tile_m)
    n_rate = 1.0 if wg_n >= 128 else 1.0 - (1.0 - TILE_N_RATE[64]) * (128 - wg_n) / 64
    if wg_m != 64:
        return n_rate
    return n_rate * (SWAPPED_M64_RATE if ml.swap_ab else m64_rate)


#: The frames of the swapped mainloops :func:`swapped_mainloops` fits to a GEMM: the schedule
#: and the tile's columns (wgmma's M: split between two warpgroups, or one warpgroup's).
SWAP_FRAMES = (("cooperative", 128), ("cooperative", 256), ("pingpong", 64), ("pingpong", 128))


def whole_tile_bytes(tile_m: int, tile_n: int, dtype_bytes: int = 2) -> int:
    """Shared memory a whole staged output tile takes: its rows padded by 8 elements (the
    reductions read it back; a TMA-stored whole tile is unpadded but 1024-byte aligned)."""
    return tile_m * (tile_n + 8) * dtype_bytes


def stages_that_fit(tile_m: int, tile_n: int, tile_k: int = 64, dtype_bytes: int = 2,
                    staged: int | None = None) -> int:
    """The pipeline stages that fit in shared memory beside the staged output tile and the
    kernel's last KiB (:func:`supported` refuses more): ``staged`` bytes of it
    (:func:`staging_bytes`), by default a whole tile's (:func:`whole_tile_bytes`)."""
    staged = whole_tile_bytes(tile_m, tile_n, dtype_bytes) if staged is None else staged
    return (SMEM_LIMIT_BYTES - 1024 - staged) // smem_bytes(tile_m, tile_n, tile_k, 1)


def most_stages(tile_m: int, tile_n: int, dtype_bytes: int = 2, most: int = 8, staged: int | None = None) -> int:
    """The most pipeline stages (up to ``most``) that fit beside the staged output tile
    (``staged`` bytes of it: :func:`stages_that_fit`)."""
    return min(most, stages_that_fit(tile_m, tile_n, 64, dtype_bytes, staged))


#: Slots of the ring a tile of a rank's own output is staged through, a sub-tile in each
#: (:func:`staged_subtile`): one is stored by TMA while the next is staged.
RING_SLOTS = 2


def ring_allowed(problem: GemmProblem, d: Directives) -> bool:
    """Whether the in-kernel point ``d`` may stage its output tiles through a ring of
    sub-tiles (``tp_fused.cu.j2``'s ``stage_out``): where they are the rank's own output,
    stored by TMA (:attr:`TPPattern.tiles_are_own_output`), and the consumers run the
    epilogue (no ``comm_warps``, which take a whole staged tile over)."""
    return d.placement.in_kernel and pattern_of(problem).tiles_are_own_output and d.comm_warps == 0


def ring_staged(problem: GemmProblem, d: Directives) -> bool:
    """Whether ``d`` stages its output tiles through the ring: where it may
    (:func:`ring_allowed`) and its stages do not fit beside a whole staged tile, the room the
    ring's :data:`RING_SLOTS` sub-tiles leave (:func:`deepest`). Elsewhere the tile is staged
    whole: at the same stages the two ran alike at five of six GEMMs, and the ring 4% slower
    at the sixth, whose swapped 112x64 tiles it cuts into seven 16-row sub-tiles
    (bench/logs/gemm_ring_probe_w1_h200_522f1ec.log, ``ring`` against ``whole_tile``)."""
    return ring_allowed(problem, d) and d.stages > stages_that_fit(d.tile_m, d.tile_n, d.tile_k, problem.dtype_bytes)


def staged_subtile(d: Directives) -> tuple[int, int]:
    """``(rows, cols)`` of C in one sub-tile of a ring-staged tile (:func:`ring_staged`), cut
    as CUTLASS's epilogue cuts it: the MMA's footprint on wgmma's M (128 for two cooperative
    warpgroups, 64 for one pingpong warpgroup) by a slice of its N, 64 columns (one TMA panel),
    or with A and B swapped (wgmma's N the tile's rows) 64 rows or as many as divide them."""
    footprint = 128 if d.schedule is Schedule.COOPERATIVE else 64
    if d.swap_ab:
        return math.gcd(d.tile_m, 64), footprint
    return footprint, 64


def ring_bytes(problem: GemmProblem, d: Directives) -> int:
    """Shared memory the ring's slots take (:func:`staged_subtile`, :data:`RING_SLOTS`)."""
    rows, cols = staged_subtile(d)
    return RING_SLOTS * rows * cols * problem.dtype_bytes


def staging_bytes(problem: GemmProblem, d: Directives) -> int:
    """Shared memory the staged output tile takes beside the mainloop's stages: the ring's
    slots where :func:`ring_staged`, else the whole tile (:func:`whole_tile_bytes`)."""
    return ring_bytes(problem, d) if ring_staged(problem, d) else whole_tile_bytes(d.tile_m, d.tile_n, problem.dtype_bytes)


def deepest(problem: GemmProblem, ml: Mainloop, base: Directives | None = None, most: int = 8) -> Mainloop:
    """``ml`` with the most stages (up to ``most``) that fit beside its staged output tile on
    ``base`` (default: the epilogue placement) at ``problem``'s pattern, where it has as many
    as fit beside a whole staged tile and the ring (:func:`ring_allowed`) leaves room for more;
    else ``ml``."""
    try:
        d = with_mainloop(base or in_kernel("epilogue"), ml, problem.dtype_bytes)
    except DirectiveError:  # not a point of the space: nothing to deepen
        return ml
    if not ring_allowed(problem, d) or ml.stages != most_stages(ml.tile_m, ml.tile_n, problem.dtype_bytes, most):
        return ml
    return ml._replace(stages=most_stages(ml.tile_m, ml.tile_n, problem.dtype_bytes, most, ring_bytes(problem, d)))


def swapped_mainloops(problem: GemmProblem, sms: int = SMS, top: int = 2) -> list[Mainloop]:
    """The ``swap_ab`` mainloops fitted to ``problem``: in each of :data:`SWAP_FRAMES`, the
    tile rows (a multiple of 16, wgmma's N) that :func:`modelled_time` puts fastest there (a
    whole number of waves, little of the last tile's rows wasted), with the most stages that
    fit, among those the templates render there (:func:`supported`); the ``top`` fastest
    frames, fastest first. Unlike :data:`MAINLOOPS` they depend on the
    shape: the rows are fitted to it, as cuBLASLt's tiles are (its 72- to 160-wide tiles on
    these GEMMs' M, bench/results/gemm_mainloop.json's library_algos)."""
    fitted = []
    for schedule, tn in SWAP_FRAMES:
        mls = [Mainloop(schedule, tn, most_stages(tm, tn, problem.dtype_bytes), tm, swap_ab=True)
               for tm in placement_rules.SWAPPED_TILE_M
               if schedule_holds(schedule, tm, tn)]
        mls = [ml for ml in mls if ml.stages >= 3
               and not supported(problem, with_mainloop(in_kernel("epilogue"), ml, problem.dtype_bytes))]
        if mls:
            fitted.append(min(mls, key=lambda ml: (modelled_time(problem, ml, sms), -ml.tile_m)))
    fitted.sort(key=lambda ml: (modelled_time(problem, ml, sms), -ml.tile_m * ml.tile_n))
    return fitted[:top]


def cluster_twins(problem: GemmProblem, mls: list[Mainloop]) -> list[Mainloop]:
    """Each swapped mainloop of ``mls`` in clusters of 2 CTAs along N (two adjacent n-tiles of
    one m-tile, X's tile loaded once for both by TMA multicast: cuBLASLt's "2x1" and "4x1"
    clusters at decode-like M, bench/results/gemm_mainloop.json's library_algos), where N has
    at least two n-tiles."""
    n = local_gemm(problem).n
    return [ml._replace(cluster_m=2) for ml in mls if ml.swap_ab and ml.cluster_m == 1 and -(-n // ml.tile_n) >= 2]


def mainloops_for(problem: GemmProblem, sms: int = SMS) -> tuple[Mainloop, ...]:
    """The in-kernel mainloops a search sweeps at ``problem``: :data:`MAINLOOPS`, the swapped
    ones fitted to its shape (:func:`swapped_mainloops`) and their clusters along N
    (:func:`cluster_twins`); where the pattern's tiles may be staged through a ring
    (:func:`ring_allowed`), each also with the stages that then fit (:func:`deepest`)."""
    fitted = swapped_mainloops(problem, sms)
    mls = (*MAINLOOPS, *fitted, *cluster_twins(problem, fitted))
    return tuple(dict.fromkeys((*mls, *(deepest(problem, ml) for ml in mls))))


def tile_waves(problem: GemmProblem, ml: Mainloop, sms: int = SMS) -> tuple[int, float, float]:
    """``(tiles, waves, efficiency)`` of ``ml``'s whole tiles at ``problem`` (:func:`wave_fill`)."""
    tiles = tiles_of(problem, ml.tile_m, ml.tile_n)
    return (tiles, *wave_fill(tiles, sms))


def _split_tail_if_cut(problem: GemmProblem, pick: Pick, sms: int) -> Pick:
    """``pick``, or where it is pingpong 128x128 unsplit and its tiles leave a last wave at most
    half full, the same in 2 slices of K (:func:`split_tail`: the whole waves run unsplit, the
    last wave's tiles cut in two, each slice at least 4 k-tiles). Measured: at 512x14336x4096
    (448 tiles, the last wave 39% full) it ran 0.08755 against 0.09318 ms unsplit (bf16) and
    0.09091 against 0.09558 (fp16) on 1 x H200 (gemm_mainloop_h200_b157e15.json); no other
    GEMM of that file takes pingpong 128x128 with such a last wave."""
    ml = pick.mainloop
    if ml != Mainloop("pingpong", 128, 6):
        return pick
    k = local_gemm(problem).k
    tiles = tiles_of(problem, ml.tile_m, ml.tile_n)
    dp, slices, per = split_tail(tiles, sms, k, 2)
    if tiles <= sms or dp == tiles or per < 4:
        return pick
    return Pick(ml._replace(split_k=2), pick.raster_group,
                f"{pick.why}; the last wave's {tiles - dp} of {tiles} tiles in {slices} slices of K "
                "(split_tail: measured faster where that wave is at most half full)")


def _fuller_waves(problem: GemmProblem, pick: Pick, sms: int) -> Pick:
    """``pick`` (a measured one), or the unsplit mainloop of :data:`MAINLOOPS` whose tiles
    fill the waves so much better that :func:`modelled_time` puts it :data:`WAVE_GAIN` below
    ``pick``'s: e.g. 2176x2048 in 374 64x192 tiles (2.83 waves) against 272 128x128 tiles
    (2.06 waves, the third nearly empty). Modelled, not measured."""
    base = modelled_time(problem, pick.mainloop, sms)
    best = min((ml for ml in MAINLOOPS if ml.split_k == 1 and ml.cluster_m == 1),
               key=lambda ml: modelled_time(problem, ml, sms))
    t = modelled_time(problem, best, sms)
    if t > WAVE_GAIN * base:
        return pick
    tiles, waves, eff = tile_waves(problem, best, sms)
    return Pick(best, 8, f"{tiles} {best.tile_m}x{best.tile_n} tiles fill {waves:.2f} waves, the last "
                f"{eff:.0%} full: modelled {t / base:.0%} of {pick.mainloop.text()}'s time "
                "(modelled, not measured)")


def in_kernel(placement: str, backend: str = "lsa", issuer: str = "cta", tile_n: int | None = None,
              stages: int | None = None, comm_ctas: int = 0, dtype_bytes: int = 2,
              raster_group: int | None = None, comm_warps: int = 0, schedule: str | None = None,
              tile_m: int | None = None, split_k: int | None = None, cluster_m: int | None = None,
              swap_ab: bool | None = None, problem: GemmProblem | None = None) -> Directives:
    """An ``epilogue``/``dedicated_ctas`` point: tile ``tile_m`` x ``tile_n`` x 64, one tile per
    flag, K cut into ``split_k`` slices.

    The mainloop (``schedule``, ``tile_m``, ``tile_n``, ``stages``, ``split_k``): where none of
    them is given and ``problem`` is, :func:`default_mainloop`'s pick for it (and its tile
    order, unless ``raster_group`` is given); otherwise those not given take
    :data:`MAINLOOP_FIELDS` (cooperative 128x256, 3 stages; tile order 1)."""
    given = dict(schedule=schedule, tile_n=tile_n, stages=stages, tile_m=tile_m, split_k=split_k,
                 cluster_m=cluster_m, swap_ab=swap_ab)
    ml = {f: v for f, v in given.items() if v is not None}
    if not ml and problem is not None:
        pick = default_mainloop(problem)
        ml = pick.mainloop._asdict()
        raster_group = pick.raster_group if raster_group is None else raster_group
        dtype_bytes = problem.dtype_bytes
    ml = {**MAINLOOP_FIELDS, **ml}
    return Directives(backend=backend, placement=placement, sync_scope="chunk", issuer=issuer,
                      tile_m=ml["tile_m"], tile_n=ml["tile_n"], tile_k=64, stages=ml["stages"],
                      comm_ctas=comm_ctas, chunk_bytes=ml["tile_m"] * ml["tile_n"] * dtype_bytes,
                      raster_group=1 if raster_group is None else raster_group, comm_warps=comm_warps,
                      schedule=ml["schedule"], split_k=ml["split_k"], cluster_m=ml["cluster_m"],
                      swap_ab=ml["swap_ab"])


def with_mainloop(d: Directives, ml: Mainloop, dtype_bytes: int = 2) -> Directives:
    """``d`` (an in-kernel point) with the mainloop ``ml``: its tile, stages, schedule and
    split, the chunk one tile."""
    return d.replace(schedule=ml.schedule, tile_m=ml.tile_m, tile_n=ml.tile_n, stages=ml.stages,
                     split_k=ml.split_k, cluster_m=ml.cluster_m, swap_ab=ml.swap_ab,
                     chunk_bytes=ml.tile_m * ml.tile_n * dtype_bytes)


def pattern_of(problem: GemmProblem) -> TPPattern:
    """The pattern whose templates render ``problem``; :class:`DirectiveError` for a
    workload that is none (a user workload renders under its pattern's problem)."""
    tp = find(problem.workload)
    if tp is None:
        raise DirectiveError([f"workload: {problem.workload} is not a tensor-parallel family "
                              f"({', '.join(TP_NAMES)})"])
    return tp


def local_gemm(problem: GemmProblem) -> LocalGemm:
    """``(rows of C, cols of C, K)`` of the GEMM one rank runs in a fused kernel."""
    return pattern_of(problem).local_gemm(m=problem.m, n=problem.n, k=problem.k,
                                          world_size=problem.world_size)


def tiles_of(problem: GemmProblem, tile_m: int, tile_n: int) -> int:
    """Output tiles of one rank's fused GEMM: each rank's block of M/w rows cut into
    ``tile_m``-row tiles (the last one short where they do not divide), N likewise."""
    n = local_gemm(problem).n
    return problem.world_size * -(-placement_rules.row_block(problem) // tile_m) * -(-n // tile_n)


def fused_tiles(problem: GemmProblem, d: Directives) -> int:
    """:func:`tiles_of` the point ``d``'s tile."""
    return tiles_of(problem, d.tile_m, d.tile_n)


def k_slices(k: int, split_k: int, tile_k: int = 64) -> tuple[int, int]:
    """``(slices, k_tiles_per_slice)`` of a split-K point at depth ``k``: the K loop's
    ``ceil(k / tile_k)`` k-tiles cut into at most ``split_k`` slices of equal length (the
    last one shorter), none empty. ``make_dims`` in ``tp_fused.cu.j2`` does the same."""
    kt = -(-k // tile_k)
    per = -(-kt // min(split_k, kt))
    return -(-kt // per), per


def split_tail(tiles: int, ctas: int, k: int, split_k: int, tile_k: int = 64) -> tuple[int, int, int]:
    """``(dp_tiles, slices, k_tiles_per_slice)`` of a split-K launch of ``tiles`` tiles on
    ``ctas`` compute CTAs (``split_tail`` in ``_split_units.cu.j2``, which the launcher runs for
    its grid): with fewer tiles than CTAs every tile is cut (:func:`k_slices`); otherwise the
    first ``dp_tiles`` (whole waves) run unsplit and only the partial last wave's tiles are cut,
    into as many slices as keep them within one wave (at most ``split_k``'s); whole waves, or a
    last wave more than half full, run every tile whole."""
    slices, per = k_slices(k, split_k, tile_k)
    if ctas <= 0 or tiles < ctas:
        return 0, slices, per
    tail = tiles % ctas
    cut = min(ctas // tail if tail else 1, slices)
    if cut <= 1:
        return tiles, 1, -(-k // tile_k)
    slices, per = k_slices(k, cut, tile_k)
    return tiles - tail, slices, per


def split_workspace_bytes(problem: GemmProblem, d: Directives) -> int:
    """Bytes of the workspace a split-K point's launch needs at ``problem`` (0 without
    split-K): a 4-byte arrival counter per output tile (rounded up to 256 bytes), then an fp32
    partial tile per slice of every tile. ``make_dims`` in ``tp_fused.cu.j2`` does the same."""
    if d.split_k == 1:
        return 0
    slices, _ = k_slices(local_gemm(problem).k, d.split_k, d.tile_k)
    tiles = fused_tiles(problem, d)
    return split_counter_bytes(problem, d) + tiles * slices * d.tile_m * d.tile_n * 4


def split_counter_bytes(problem: GemmProblem, d: Directives) -> int:
    """Bytes of a split-K workspace's arrival counters (the rest: its partial tiles); 0
    without split-K."""
    return 0 if d.split_k == 1 else -(-fused_tiles(problem, d) * 4 // 256) * 256


def supported(problem: GemmProblem, d: Directives) -> list[str]:
    """What the templates cannot render of ``d`` at ``problem`` (empty when they can): no GIN
    or fp32 in-kernel template, CUTLASS's tile shapes, the shared memory and flag slots. Whether
    ``d`` makes sense is :mod:`cuco.design.placement_rules`' to say."""
    if not d.placement.in_kernel:
        return []
    out = []
    p = d.placement.value
    if d.backend.value == "gin":
        out.append(f"backend: placement={p} has lsa and nvshmem templates; gin runs with "
                   "placement=side_stream only")
    if problem.dtype not in CUTLASS_TYPES:
        out.append(f"dtype: placement={p} runs a CUTLASS bf16/fp16 mainloop, not {problem.dtype}")
    out += wgmma_m_refusals(d, p)
    staged = staging_bytes(problem, d)
    smem = smem_bytes(d.tile_m, d.tile_n, d.tile_k, d.stages) + staged
    if smem > SMEM_LIMIT_BYTES - 1024:
        fit = stages_that_fit(d.tile_m, d.tile_n, d.tile_k, problem.dtype_bytes, staged)
        # (not d.replace: a space's rules ask this of points they have not validated)
        consumers = d.model_copy(update={"comm_warps": 0}) if d.comm_warps else None
        ring = (stages_that_fit(d.tile_m, d.tile_n, d.tile_k, problem.dtype_bytes, ring_bytes(problem, consumers))
                if consumers is not None and ring_allowed(problem, consumers) else 0)
        out.append(f"stages: placement={p} stages the output tile in shared memory beside the "
                   f"{d.stages} mainloop stages ({smem // 1024} KiB > {SMEM_LIMIT_BYTES // 1024 - 1} KiB); "
                   + (f"set stages={fit}" if fit >= 2 else "choose a smaller tile")
                   + (f", or comm_warps=0 (the consumers then stage it through a ring of sub-tiles, room for "
                      f"{ring} stages)" if ring >= d.stages else ""))
    if d.split_k > 1:
        kt = -(-local_gemm(problem).k // d.tile_k)
        ws = split_workspace_bytes(problem, d)
        if d.split_k > kt:
            out.append(f"split_k: K={local_gemm(problem).k} per rank is {kt} k-tile(s) of "
                       f"{d.tile_k}; choose split_k <= {kt}")
        elif ws > SPLIT_K_WORKSPACE_LIMIT:
            out.append(f"split_k: {fused_tiles(problem, d)} output tiles x {d.split_k} slices of K "
                       f"need {ws >> 20} MiB of fp32 partials (> {SPLIT_K_WORKSPACE_LIMIT >> 20} MiB); "
                       "split-K is for GEMMs with fewer tiles than SMs; set split_k=1")
    if not out and fused_tiles(problem, d) > FLAG_STRIDE // 2 - 1:
        out.append(f"tile_n: {fused_tiles(problem, d)} output tiles exceed the "
                   f"{FLAG_STRIDE // 2 - 1} flag slots; choose larger tiles")
    return out


def wgmma_m_refusals(d: Directives, p: str) -> list[str]:
    """What the template cannot render of the tile's side on wgmma's M (its rows, or with
    ``swap_ab`` its columns): a cooperative tile's is split between two consumer warpgroups
    of 64 or 128, a pingpong tile's is one warpgroup's 64 or 128."""
    field, size, side = ("tile_n", d.tile_n, "columns") if d.swap_ab else ("tile_m", d.tile_m, "rows")
    there = " (swap_ab=true puts the tile's columns on wgmma's M)" if d.swap_ab else ""
    if d.schedule is Schedule.COOPERATIVE and size not in (128, 256):
        return [f"{field}: placement={p} with schedule=cooperative splits each tile's {side} between "
                f"two consumer warpgroups of 64+ {side}{there}; choose {field} 128 or 256 (or "
                "schedule=pingpong)"]
    if d.schedule is Schedule.PINGPONG and size not in (64, 128):
        return [f"{field}: placement={p} with schedule=pingpong gives each consumer warpgroup whole "
                f"tiles{there}; choose {field} 64 or 128"]
    return []


def fused_context(problem: GemmProblem, d: Directives, *, gemm_only: bool = False) -> dict[str, Any]:
    """What ``tp_fused.cu.j2`` is rendered with for the in-kernel point ``d`` (one that
    :func:`supported` accepts): no shape, which each launch passes (:func:`local_gemm`), so
    every shape of one workload, pattern, dtype and world size renders the same source and
    builds once. ``bench/compile_speed.py`` and ``bench/kernel_identity.py`` render the
    template of an earlier commit with it, to compare builds before and after a change
    (hence ``m``, ``n``, ``k``, which templates before that took)."""
    m, n, k = local_gemm(problem)  # read only by templates before the shape became an argument
    return dict(workload=pattern_of(problem).name, placement=d.placement.value, backend=d.backend.value,
                issuer=d.issuer.value, ctype=CTYPES[problem.dtype], cutlass_type=CUTLASS_TYPES[problem.dtype],
                world=problem.world_size, m=m, n=n, k=k, tile_m=d.tile_m, tile_n=d.tile_n, tile_k=d.tile_k,
                stages=d.stages, raster_group=d.raster_group, comm_warps=d.comm_warps,
                schedule=d.schedule.value, pingpong=d.schedule is Schedule.PINGPONG, split_k=d.split_k,
                cluster_m=d.cluster_m, swap_ab=d.swap_ab, ring=ring_staged(problem, d),
                sub_rows=staged_subtile(d)[0], sub_cols=staged_subtile(d)[1], ring_slots=RING_SLOTS,
                comm_ctas=d.comm_ctas if d.placement.own_comm_ctas else 0, max_ranks=MAX_RANKS,
                flag_stride=FLAG_STRIDE, name=d.build_point().full_name, gemm_only=gemm_only,
                launch_entry=fused_launch.ENTRY,
                launch_params=fused_launch.c_params(indent=len(f'extern "C" int {fused_launch.ENTRY}(')),
                **LAUNCHER_PARTS)


def side_stream_plan(problem: GemmProblem, d: Directives) -> ChunkPlan:
    """The chunk plan of a ``side_stream`` point, or :class:`DirectiveError` naming what to
    change when its templates cannot take it (too many chunks for the flag slots; a ragged
    plan on the GIN template, whose receive slots assume equal chunks)."""
    plan = ChunkPlan.for_problem(problem, d)
    out = []
    if plan.n_chunks >= FLAG_STRIDE // 2:
        out.append(f"chunk_bytes: {plan.n_chunks} chunks exceed {FLAG_STRIDE // 2 - 1}; "
                   "choose a larger chunk_bytes")
    if plan.ragged and d.backend.value == "gin":
        out.append(f"backend: the gin side-stream kernels cut rows into equal chunks; M={problem.m} "
                   f"needs a ragged plan; choose backend=lsa or nvshmem, or pad M to a multiple "
                   f"of {EQUAL_CHUNKS_M}")
    if out:
        raise DirectiveError(out)
    return plan


def render_tp(problem: GemmProblem, d: Directives, *, gemm_only: bool = False
              ) -> tuple[KernelSource, ChunkPlan | None]:
    """Kernel source and chunk plan (None for in-kernel placements, whose unit is a tile)
    of one fused variant; raises :class:`DirectiveError`.

    ``gemm_only=True`` (in-kernel placements; profiling) renders the same kernel with its
    communication left out: its time is the GEMM's inside the fused kernel, and its output
    is not the workload's."""
    pattern_of(problem)
    d.check(problem)
    bad = placement_rules.in_kernel_violations(d.__dict__, problem) + supported(problem, d)
    if bad:
        raise DirectiveError(bad)
    name = problem.kernel_name(d.full_name)
    if d.placement.in_kernel:
        src = render("tp_fused.cu.j2", **fused_context(problem, d, gemm_only=gemm_only))
        if gemm_only:
            name = PROFILE + name
        needs = ("cutlass", "nccl") if d.backend.value == "lsa" else ("cutlass", "nvshmem")
        return KernelSource(name, src, needs, (fused_launch.ENTRY,)), None
    if gemm_only:
        raise ValueError("gemm_only renders in-kernel placements only")
    return render_side_stream(problem, d)


def side_stream_context(problem: GemmProblem, d: Directives, plan: ChunkPlan) -> dict[str, Any]:
    """What the side-stream templates are rendered with: no shape and no chunk size, which
    each launch passes (``cuco::ChunkGeom``: :func:`cuco.design.tiles.pack_chunk_geom`), only
    whether ``plan`` is ragged (its kernel bodies differ). So every chunk size and every shape
    of one workload, dtype and world size whose plan is as ragged renders the same source and
    builds once: the evaluator's small shape (which keeps M's residue mod 64) among them."""
    return dict(workload=plan.pattern.name, backend=d.backend.value, issuer=d.issuer.value,
                ctype=CTYPES[problem.dtype], ragged=plan.ragged, comm_ctas=d.comm_ctas, threads=THREADS,
                max_ranks=MAX_RANKS, flag_stride=FLAG_STRIDE, name=d.build_point().full_name)


def render_side_stream(problem: GemmProblem, d: Directives) -> tuple[KernelSource, ChunkPlan]:
    """The side-stream kernels of ``d`` and their chunk plan, for a point the design rules
    accepted (:func:`render_tp` checks them first); :class:`DirectiveError` when the plan
    does not fit the templates."""
    plan = side_stream_plan(problem, d)
    template = "tp_side_stream_gin.cu.j2" if d.backend.value == "gin" else "tp_side_stream.cu.j2"
    src = render(template, **side_stream_context(problem, d, plan))
    needs = ("nvshmem",) if d.backend.value == "nvshmem" else ("nccl",)
    return KernelSource(problem.kernel_name(d.full_name), src, needs,
                        ("comm_kernel", "signal_chunk", "wait_chunk")), plan
