"""The GEMM-alone bench on one GPU (cuco.benchmarks.gemm_alone): each cuBLASLt pick's twin
(cuco.benchmarks.library_twins) is built and timed beside the default, checked like every
program, and the tiling cuBLASLt reports is the one the twin was read from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuco.benchmarks import gemm_alone as ga
from cuco.benchmarks.library_twins import LibraryTiles

pytestmark = pytest.mark.gpu(count=1)

#: two waves of 128x256 tiles on 132 SMs; cuBLASLt's picks here include a tiling cuco builds
SHAPE = (2048, 4096, 2048)


def test_the_library_twins_are_timed_checked_and_read_as_cublaslt_counts_them(tmp_path, monkeypatch):
    import cupy
    monkeypatch.setenv("CUCO_REV", "test")
    case = ga.case_label(SHAPE, "bf16")
    bench = ga.GemmAloneBench(shapes=(SHAPE,), dtypes=("bf16",), rounds=3, out_dir=tmp_path,
                              only={case: []})  # the default and the twins alone: few builds
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    algos = bench.library_algos(SHAPE, "bf16")
    assert algos, "cuBLASLt described no algorithm"
    for algo in algos.values():  # the column-major reading, against what the library says
        assert LibraryTiles.of(algo).tiles(SHAPE[0], SHAPE[1]) == round(algo["waves"] * sms)
    twins = bench.twins(SHAPE, "bf16")
    built = [tw for tw in twins.values() if tw.mainloop is not None]
    assert built, f"no twin cuco builds at {SHAPE}: {twins}"

    row = json.loads(Path(bench.run()).read_text())["rows"][0]
    assert row["correct"] and not row["wrong"], row["bad_elements"]
    entries = row["library_twins"]
    assert set(entries) == set(twins)
    for lib, entry in entries.items():
        if twins[lib].mainloop is None:
            assert entry["cannot_build"] and entry["ms"] is None
        else:  # built, launched, checked on poisoned output and timed
            assert entry["point"] in row["cuco"] and entry["ms"] == row["cuco"][entry["point"]] > 0
    if row["speedup"] < 1.0:
        assert "its tiling" in row["why_not"]
