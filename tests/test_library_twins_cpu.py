"""cuco's build of the library's own tiling (cuco.benchmarks.library_twins): the mapping of a
cuBLASLt algorithm's description to cuco's terms, the mainloop it gives or the design space's
refusal, and what a lost row of the GEMM-alone bench then says. No GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco.benchmarks import gemm_alone as ga
from cuco.benchmarks.library_twins import LibraryTiles, candidates, library_twin
from cuco.kernels import tp
from cuco.kernels.tp import Mainloop

RECORD = Path(__file__).resolve().parents[1] / "bench" / "results" / "gemm_mainloop.json"


def twin(tile: str, cluster: str, shape, split_k: int = 1, dtype: str = "bf16"):
    return library_twin({"tile": tile, "cluster": cluster, "split_k": split_k}, ga.problem_of(*shape, dtype), ga.BASE)


def test_the_library_tiling_in_cucos_terms_has_the_tile_count_cublaslt_reports():
    """Every algorithm the file of record describes: cuBLASLt's waves times the SMs is the tile
    count of its tiling read column-major (its M is cuco's N), not row-major."""
    doc = json.loads(RECORD.read_text())
    checked = 0
    for row in doc["rows"]:
        m, n, _ = row["shape"]
        for algo in row["library_algos"].values():
            t = LibraryTiles.of(algo)
            assert t.tiles(m, n) == round(algo["waves"] * doc["sms"]), (row["case"], algo)
            checked += 1
    assert checked >= 200
    t = LibraryTiles.of({"tile": "128x72", "cluster": "4x1x1", "split_k": 1})
    assert (t.rows, t.cols, t.cluster_n, t.cluster_m) == (72, 128, 4, 1)
    assert t.tiles(4096, 200) != t.tiles(200, 4096) == 96  # 3 m-tiles of 72 rows, 32 n-tiles


def test_a_tiling_cuco_builds_is_its_mainloop_in_the_faithful_orientation():
    # the library's M (cuco's N) on wgmma's M, a cluster along N: A and B swapped
    tw = twin("128x256", "2x1x1", (2048, 4096, 2048))
    assert tw.mainloop == Mainloop("cooperative", 128, 3, 256, 1, 2, True) and tw.why_not is None
    # a cluster along cuco's M: only the unswapped mainloop clusters so
    tw = twin("256x128", "1x2x1", (8192, 8192, 4096))
    assert tw.mainloop == Mainloop("cooperative", 256, 3, 128, 1, 2, False)
    # where the cooperative schedule cannot split the tile, pingpong
    tw = twin("64x64", "2x1x1", (64, 8192, 8192))
    assert tw.mainloop.schedule == "pingpong" and tw.mainloop.swap_ab and tw.mainloop.cluster_m == 2
    for tw, shape in ((twin("128x256", "2x1x1", (2048, 4096, 2048)), (2048, 4096)),
                      (twin("256x128", "1x2x1", (8192, 8192, 4096)), (8192, 8192))):
        ml = tw.mainloop
        assert tp.tiles_of(ga.problem_of(*shape, 1024), ml.tile_m, ml.tile_n) == tw.tiles.tiles(*shape)
        assert not tp.supported(ga.problem_of(*shape, 1024), tp.with_mainloop(ga.BASE, ml))


def test_a_tiling_cuco_cannot_build_says_why_in_the_design_spaces_words():
    tw = twin("128x72", "4x1x1", (200, 4096, 4096))
    assert tw.mainloop is None
    assert "tile_m=72 is not supported" in tw.why_not and "cluster_m=4 is not supported" in tw.why_not
    assert "invalid directives" not in tw.why_not and "\n" not in tw.why_not
    assert tw.why_not.count("tile_m=72 is not supported") == 1  # each refusal once
    both = twin("128x128", "2x2x1", (4096, 4096, 4096))
    assert both.mainloop is None and "both M and N" in both.why_not
    split = twin("128x128", "2x1x1", (128, 8192, 28672), split_k=2)
    assert split.mainloop is None and "split_k=2 cuts tiles into slices" in split.why_not
    assert candidates(LibraryTiles(64, 128, 2, 2, 1)) == []
    along_m = twin("192x96", "1x2x1", (1536, 1536, 1536))  # 96 rows, clusters along M: unswapped only
    assert along_m.mainloop is None and along_m.why_not.startswith("with A and B swapped, cuco's clusters run along N only")
    assert "96 rows are wgmma's M without swap_ab" in along_m.why_not
    with pytest.raises(ValueError, match="no tile"):
        LibraryTiles.of({"describe_failed": "x"})


def _row(shape, med, twins, points):
    default = ga.default_point(shape).full_name
    algos = {"cublaslt.heuristic0": {"tile": "x"}}
    return ga.case_row(shape, "bf16", med, {}, {v: 0 for v in med}, points, default, algos, {}, twins=twins)


def test_a_lost_row_names_the_same_tiles_ran_slower():
    shape = (2048, 4096, 2048)
    tw = twin("128x256", "2x1x1", shape)
    points = {d.full_name: d for d in ga.mainloop_points(shape)}
    d = ga.with_mainloop(ga.BASE, tw.mainloop).replace(raster_group=8)
    points[d.full_name] = d
    best = ga.default_point(shape).full_name
    med = {"cublaslt.heuristic0": 0.040, ga.TORCH: 0.041, best: 0.042, d.full_name: 0.044}
    row = _row(shape, med, {"cublaslt.heuristic0": tw}, points)
    entry = row["library_twins"]["cublaslt.heuristic0"]
    assert entry["point"] == d.full_name and entry["ms"] == 0.044 and entry["cannot_build"] is None
    assert "256x128 tiles, clusters of 2 along N" == entry["tiles"]
    assert "cuco's build of its tiling (cooperative 256x128 with 3 stages, clusters of 2 along N, A and B swapped) " \
           "ran 0.0440 ms, 10.0% slower: the same tiles, a slower kernel" in row["why_not"]


def test_a_lost_row_names_the_tiling_cuco_cannot_build_and_a_stand_in_for_torch():
    shape = (200, 4096, 4096)
    points = {d.full_name: d for d in ga.mainloop_points(shape)}
    best = ga.default_point(shape).full_name
    tw = twin("128x72", "4x1x1", shape)
    med = {ga.TORCH: 0.0160, "cublaslt.heuristic0": 0.0162, best: 0.019}
    row = _row(shape, med, {"cublaslt.heuristic0": tw}, points)
    assert row["library_twins"]["cublaslt.heuristic0"]["mainloop"] is None
    assert "torch.matmul's kernel is not described; the fastest described one, cublaslt.heuristic0, " \
           "ran 0.0162 ms" in row["why_not"]
    assert "cuco cannot build its tiling (72x128 tiles, clusters of 4 along N): unswapped, cuco's clusters run " \
           "along M only; tile_m=72" in row["why_not"]
    untimed = _row(shape, {**med, ga.TORCH: 0.017}, {"cublaslt.heuristic0": twin("64x64", "2x1x1", shape)}, points)
    assert "has no correct timed point here" in untimed["why_not"]
    assert "library_twins" in _row(shape, med, None, points) and "cuco's build" not in _row(shape, med, None, points)["why_not"]


def test_the_bench_times_a_twin_the_sweep_does_not_and_not_one_it_does():
    shape = (2048, 4096, 2048)
    bench = ga.GemmAloneBench(shapes=(shape,), dtypes=("bf16",))
    new = twin("128x256", "2x1x1", shape)  # swapped 256x128 in clusters: not swept by default
    swept = twin("256x128", "1x2x1", shape)  # cooperative 128x256 in clusters along M: swept
    base = bench.points(shape, "bf16", 132)
    pts = bench.points(shape, "bf16", 132, {"a": new, "b": swept, "c": twin("128x72", "4x1x1", shape)})
    added = [d for d in pts if d not in base]
    assert [Mainloop.of(d) for d in added] == [new.mainloop] and added[0].raster_group == 8
    assert swept.mainloop in {Mainloop.of(d) for d in base}
    assert not ga.GemmAloneBench(library_twins=False).twins(shape, "bf16", {"cublaslt.heuristic0": {"tile": "1x1"}})
