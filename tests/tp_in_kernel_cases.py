"""The cases of tests/test_tp_in_kernel_gpu.py as functions of the world size, so a CPU test
(tests/test_tp_in_kernel_cases_cpu.py) renders every one of them at 1, 2, 4 and 8 ranks: at
4 emulated ranks (1be8aa5) two decode-like shapes turned out to have per-rank widths the
in-kernel placements refuse, found only on the GPU."""

from __future__ import annotations

from cuco.kernels.tp import in_kernel

FAMILIES = ("gemm_allreduce", "gemm_reducescatter", "allgather_gemm")


def wide(n: int, world: int) -> int:
    """A width given at two ranks, each rank's part kept at more (whole 16-byte rows and the
    bytes a rank produces stay what they are at two ranks); unchanged at one or two."""
    return n // 2 * max(world, 2)


def rows(m: int, world: int) -> int:
    """``m`` rounded up to a multiple of the world (the in-kernel placements cut M into one
    equal block per rank)."""
    return -(-m // world) * world


def ragged(world: int) -> tuple[int, int, int]:
    """1000 rows (500 a rank at W = 2: three 128-row tiles and a short one), N and K (and
    each rank's part of them, 520 wide at any W: whole 16-byte rows) not multiples of any
    tile: every tile edge is ragged."""
    return (1000, 520 * world, 520 * world)


def decode(world: int, k: int = 4096) -> tuple[int, int, int]:
    """A decode-like M of 136, 528 columns at two ranks (264 a rank at any W)."""
    return (136, wide(528, world), k)


#: Several tiles per CTA (odd and even counts): both pingpong warpgroups take turns.
MANY_TILES = (4096, 2048, 256)
SHAPES = [(512, 1024, 2048), (1024, 512, 1024)]  # (m, n, k)


def grid_shapes(world: int) -> list[tuple[int, int, int]]:
    return [*SHAPES, MANY_TILES, ragged(world)]


def tail(world: int) -> tuple[int, int, int]:
    """More tiles than a rank's CTAs with a short last wave (140 128x128 tiles at one rank on
    132 SMs, and at two or four emulated ranks on their 66 or 33): split-K runs the whole waves
    unsplit and cuts only the last one's tiles (split_tail). K of 1024 at one or two ranks,
    more beyond, so each rank's part keeps the 4 k-tiles a 4-way split needs (128 a rank at
    W = 8 refused split_k = 4). At W = 8 (16 CTAs a rank) N is 7040: the scaled 7168 gave
    AllReduce and ReduceScatter 896 tiles, whole waves with no tail to cut."""
    return (rows(1280, world), wide(1792, world) if world <= 4 else 7040, wide(1024, world))


def split_shapes(world: int) -> list[tuple[int, int, int]]:
    return [(512, 1024, 2048), decode(world), ragged(world), tail(world)]


def wave_shapes(world: int) -> list[tuple[int, int, int]]:
    return [(512, 1024, 2048), decode(world), MANY_TILES, ragged(world)]


def cluster_shapes(world: int) -> list[tuple[int, int, int]]:
    return [(512, 1024, 2048), decode(world), (384, 1024, 1024), (rows(300, world), wide(1040, world), 1024),
            MANY_TILES, ragged(world)]


def one_build_shapes(world: int) -> list[tuple[int, int, int]]:
    """The shapes one build runs (built at the first)."""
    return [(512, 1024, 2048), (2048, 1024, 512), ragged(world), decode(world, k=wide(784, world))]


def one_build_points():
    return [in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=8),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, tile_n=128, stages=6,
                      schedule="pingpong")]


def grid_points(shape: tuple[int, int, int]):
    """Every placement and issuer (a few at MANY_TILES: the pingpong turns and one grouped order)."""
    return grid() if shape != MANY_TILES else [in_kernel("epilogue", "lsa", "cta", comm_warps=3,
                                                         raster_group=8), *pingpong()]


def grid():
    return [in_kernel("epilogue", "lsa", "cta"), in_kernel("epilogue", "lsa", "thread"),
            in_kernel("epilogue", "nvshmem", "warp"), in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=4),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2),
            # the epilogue handed to spare producer warps; grouped tile orders
            in_kernel("epilogue", "lsa", "cta", comm_warps=3, raster_group=4),
            in_kernel("epilogue", "nvshmem", "thread", comm_warps=1, raster_group=16),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, comm_warps=2, raster_group=8),
            *pingpong()]


def pingpong():
    """The two consumer warpgroups on tiles of their own, taking turns."""
    return [in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=128, stages=6, comm_warps=3,
                      raster_group=8, schedule="pingpong"),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_n=128, stages=6,
                      comm_warps=2, raster_group=16, schedule="pingpong")]


def split_and_64_rows():
    """Issue #37's mainloops: 64-row pingpong tiles and K cut into slices (split-K), with the
    epilogue on the consumers or on spare warps, under both placements and schedules."""
    return [in_kernel("epilogue", "lsa", "cta", tile_m=64, tile_n=128, stages=8, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=64, tile_n=256, stages=4, schedule="pingpong",
                      comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong", split_k=2),
            in_kernel("epilogue", "nvshmem", "thread", tile_n=128, stages=6, schedule="pingpong", split_k=4,
                      comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "warp", tile_m=64, tile_n=128, stages=8, schedule="pingpong",
                      split_k=4, comm_warps=3),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, split_k=2),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, tile_n=128, stages=4, split_k=3,
                      comm_warps=2, raster_group=16)]


def wave_tiles():
    """Issue #37's tiles 192 and 64 columns wide (cuco.kernels.tp.WAVE_TILES), with the epilogue
    on the consumers, on spare warps or on dedicated CTAs."""
    return [in_kernel("epilogue", "lsa", "cta", tile_n=192, stages=4),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=192, stages=4, comm_warps=3, raster_group=8),
            in_kernel("epilogue", "lsa", "thread", tile_m=64, tile_n=192, stages=6, schedule="pingpong"),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_m=64, tile_n=192, stages=6,
                      schedule="pingpong", comm_warps=2),
            in_kernel("epilogue", "lsa", "cta", tile_m=64, tile_n=64, stages=8, schedule="pingpong"),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=64, tile_n=64, stages=8, schedule="pingpong",
                      comm_warps=3, raster_group=16)]


def clusters():
    """Issue #37's 2x1 clusters (B multicast to a pair of m-tiles) under both schedules, with
    the epilogue on the consumers, on spare warps or on dedicated CTAs, in every tile order."""
    return [in_kernel("epilogue", "lsa", "cta", cluster_m=2),
            in_kernel("epilogue", "lsa", "cta", tile_n=128, stages=6, schedule="pingpong", cluster_m=2),
            in_kernel("epilogue", "nvshmem", "warp", tile_n=128, stages=4, comm_warps=3, raster_group=8,
                      cluster_m=2),
            in_kernel("epilogue", "lsa", "thread", tile_n=128, stages=6, schedule="pingpong", comm_warps=3,
                      raster_group=16, cluster_m=2),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_n=128, stages=6, schedule="pingpong",
                      comm_warps=2, cluster_m=2),
            in_kernel("dedicated_ctas", "nvshmem", "warp", comm_ctas=2, raster_group=4, cluster_m=2)]


def swapped_cluster_shapes(world: int) -> list[tuple[int, int, int]]:
    """An even number of n-tiles; an odd one, whose last n-tile's partner is a phantom (1040
    columns: 9 of 128, 17 of 64, the last short), with ragged rows; a decode-like M; many
    tiles per CTA."""
    return [(512, 1024, 2048), (rows(300, world), wide(1040, world), 1024), decode(world), MANY_TILES]


def swapped_clusters():
    """Issue #37's swapped mainloops in clusters of 2 along N (A multicast to a pair of
    n-tiles), under both schedules, with the epilogue on the consumers, on spare warps or on
    dedicated CTAs, in every tile order."""
    return [in_kernel("epilogue", "lsa", "cta", tile_m=80, tile_n=128, stages=6, swap_ab=True, cluster_m=2),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=112, tile_n=64, stages=8, schedule="pingpong",
                      comm_warps=3, raster_group=8, swap_ab=True, cluster_m=2),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_m=96, tile_n=128, stages=6,
                      schedule="pingpong", comm_warps=2, raster_group=16, swap_ab=True, cluster_m=2)]


def swapped_shapes(world: int) -> list[tuple[int, int, int]]:
    return [(512, 1024, 2048), decode(world), MANY_TILES, ragged(world), tail(world)]


def swapped():
    """Issue #37's mainloops with A and B swapped (the tile's rows on wgmma's N: 48 to 112 of
    them, multiples of 16 but not of 64), under both schedules, with the epilogue on the
    consumers, on spare warps or on dedicated CTAs, one cut into slices of K."""
    return [in_kernel("epilogue", "lsa", "cta", tile_m=80, tile_n=128, stages=6, swap_ab=True),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=112, tile_n=256, stages=3, comm_warps=3,
                      raster_group=8, swap_ab=True),
            in_kernel("epilogue", "lsa", "thread", tile_m=112, tile_n=64, stages=8, schedule="pingpong",
                      swap_ab=True),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_m=96, tile_n=128, stages=6,
                      schedule="pingpong", comm_warps=2, swap_ab=True),
            in_kernel("epilogue", "lsa", "cta", tile_m=48, tile_n=128, stages=8, split_k=2, swap_ab=True)]


def ring_staged():
    """AllGather+GEMM points whose stages fit only beside the ring of sub-tiles its own output
    tiles are staged through (cuco.kernels.tp.ring_staged; the epilogue on the consumers):
    cooperative 128x256 and 256x128, pingpong 64x256, swapped 256x128 in clusters along N (64-row
    sub-tiles), swapped 144x256 (16-row ones), on dedicated CTAs too, one cut into slices of K."""
    return [in_kernel("epilogue", "lsa", "cta", tile_n=256, stages=4),
            in_kernel("epilogue", "nvshmem", "warp", tile_m=256, tile_n=128, stages=4, raster_group=8),
            in_kernel("epilogue", "lsa", "thread", tile_m=64, tile_n=256, stages=5, schedule="pingpong"),
            in_kernel("dedicated_ctas", "lsa", "cta", comm_ctas=4, tile_m=256, tile_n=128, stages=4, cluster_m=2,
                      swap_ab=True),
            in_kernel("epilogue", "lsa", "cta", tile_m=144, tile_n=256, stages=4, swap_ab=True),
            in_kernel("epilogue", "lsa", "cta", tile_n=256, stages=4, split_k=2)]
